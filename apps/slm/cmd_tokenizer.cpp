// slm tokenizer train | encode | decode
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "commands.h"
#include "slm/data/tokenizer.h"
#include "slm/util/error.h"
#include "slm/util/progress.h"

namespace slm::cli {

namespace {

// The committed default model, relative to the source tree (commands also accept --model).
constexpr const char* kDefaultModel = "tokenizer/slm-code-32k.model";

std::string read_input(const std::string& file) {
  if (file.empty() || file == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file + ": cannot read");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

void add_tokenizer_command(CLI::App& app) {
  auto* tok = app.add_subcommand("tokenizer", "Train the code tokenizer (sentencepiece BPE) and encode/decode text");
  tok->require_subcommand(1);

  static data::TokenizerTrainOptions train_opt;
  auto* train = tok->add_subcommand("train", "Train a byte-fallback BPE tokenizer on files, directories or corpus .jsonl");
  train->add_option("inputs", train_opt.inputs, "text files, directories (recursively) or corpus .jsonl files")
      ->required();
  train->add_option("-o,--out", train_opt.output, "the .model file to write")->required();
  train->add_option("--vocab", train_opt.vocab_size, "vocabulary size (16384-65536 for real models)")
      ->capture_default_str();
  train->add_option("--max-bytes", train_opt.max_bytes, "sample at most this many bytes of text")->capture_default_str();
  train->add_option("--seed", train_opt.seed, "sampling seed")->capture_default_str();
  train->add_option("--threads", train_opt.threads, "sentencepiece threads")->capture_default_str();
  train->callback([] {
    ProgressBar bar(std::cerr, "reading", 0, "B");
    auto rep = data::train_tokenizer(train_opt, [&](uint64_t done, uint64_t total) {
      bar.set_total(total);
      bar.update(done);
      if (done >= total) bar.finish();
    });
    bar.finish();
    std::cout << "wrote " << train_opt.output << ": vocabulary " << rep.vocab_size << ", trained on " << rep.documents
              << " documents, " << rep.bytes << " bytes (" << rep.sentences << " sentences)\n";
  });

  static std::string model = kDefaultModel, file;
  static bool render = false;
  auto* enc = tok->add_subcommand("encode", "Print the token ids of FILE (or stdin), whitespace-separated");
  enc->add_option("--model", model, "tokenizer .model")->capture_default_str();
  enc->add_option("file", file, "input file; stdin when absent or '-'");
  enc->callback([] {
    auto t = data::Tokenizer::load(model);
    auto ids = t.encode(read_input(file));
    std::string out;
    out.reserve(ids.size() * 6);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  });

  auto* dec = tok->add_subcommand("decode", "Turn whitespace-separated token ids of FILE (or stdin) back into bytes");
  dec->add_option("--model", model, "tokenizer .model")->capture_default_str();
  dec->add_option("file", file, "input file; stdin when absent or '-'");
  dec->add_flag("--specials", render, "render special tokens by name (<|bos|>, ...) instead of dropping them");
  dec->callback([] {
    auto t = data::Tokenizer::load(model);
    std::istringstream in(read_input(file));
    std::vector<uint32_t> ids;
    std::string w;
    while (in >> w) {
      size_t used = 0;
      unsigned long v = 0;
      try {
        v = std::stoul(w, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != w.size() || w[0] == '-' || v > UINT32_MAX)
        throw Error("tokenizer decode: '" + w + "' is not a token id");
      ids.push_back(static_cast<uint32_t>(v));
    }
    auto bytes = t.decode(ids, render);
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
  });
}

}  // namespace slm::cli
