#pragma once
// SHA-256 (FIPS 180-4) for the checksums of packs and shipped weights: small, dependency-free, streaming.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace slm {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finishes; the object must not be updated afterwards
  std::string hex();                 // digest() as 64 lowercase hex digits

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// Of a whole file, read in 1 MiB pieces; throws slm::Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace slm
