#pragma once
// Which specialist a file belongs to, for an editor's completion request (/infill, /v1/completions with suffix):
//   cpp    .cpp .cc .cxx .c++ .h .hpp .hh .hxx .ipp .tpp .inl
//   cmake  CMakeLists.txt, .cmake
//   shell  .sh .bash, or a file whose first line is a shebang of sh, bash, dash, ksh or zsh
// by the file's name, else by its text. "" when neither tells.
#include <string>
#include <string_view>

namespace slm::server {

// By the name (a path: its last component counts; case-insensitive extensions).
std::string file_type_of_name(std::string_view path);
// By the text: a shell shebang on the first line; else CMake commands (`name(` at a line's start, for names only
// CMake has) against C++ markers (#include, std::, namespace, template<, class/struct, public:/private:), whichever
// are more, at least two of them.
std::string file_type_of_text(std::string_view text);

}  // namespace slm::server
