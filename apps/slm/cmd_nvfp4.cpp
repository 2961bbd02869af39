// slm nvfp4 encode|decode: inspect the NVFP4 encoding of one row of numbers (docs/formats.md).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "slm/quant/nvfp4.h"
#include "slm/util/error.h"
#include "slm/util/json_reader.h"

namespace slm::cli {

namespace {

namespace nv = slm::nvfp4;

std::string read_stdin() { return std::string(std::istreambuf_iterator<char>(std::cin), {}); }

std::vector<float> parse_floats(const std::string& text) {
  std::vector<float> out;
  std::istringstream in(text);
  std::string tok;
  while (in >> tok) {
    char* end = nullptr;
    errno = 0;
    float v = std::strtof(tok.c_str(), &end);
    if (end == tok.c_str() || *end != '\0')
      throw Error("stdin: value " + std::to_string(out.size() + 1) + " '" + tok + "' is not a number");
    if (errno == ERANGE && std::isinf(v))
      throw Error("stdin: value " + std::to_string(out.size() + 1) + " '" + tok + "' is out of the FP32 range");
    out.push_back(v);
  }
  if (out.empty()) throw Error("stdin: expected whitespace-separated numbers (one row), got none");
  return out;
}

std::string fmt(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

void encode(bool json) {
  std::vector<float> x = parse_floats(read_stdin());
  nv::QTensor q = nv::quantize(torch::tensor(x), {}, "stdin");
  torch::Tensor codes = nv::unpack_codes(q);
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const uint8_t* sp = q.scales.data_ptr<uint8_t>();
  const float ts = q.tensor_scale.item<float>();
  if (json) {
    nlohmann::json j;
    j["tensor_scale"] = static_cast<double>(ts);
    j["block_scales"] = std::vector<int>(sp, sp + q.scales.numel());
    j["codes"] = std::vector<int>(cp, cp + codes.numel());
    std::cout << j.dump() << "\n";
    return;
  }
  torch::Tensor d = nv::dequantize(q, torch::kFloat);
  const float* dp = d.data_ptr<float>();
  std::cout << "tensor_scale " << fmt(ts) << "  (s_dec; values = e2m1(code) * e4m3(block scale) * tensor_scale)\n";
  for (int64_t b = 0; b < q.blocks_per_row(); ++b) {
    std::cout << "block " << b << "  scale byte " << int(sp[b]) << " = " << fmt(nv::e4m3_decode(sp[b])) << "\n";
    std::cout << "  index        value  code   e2m1      decoded\n";
    for (int64_t k = b * nv::kBlock; k < std::min<int64_t>((b + 1) * nv::kBlock, q.k()); ++k) {
      char line[128];
      std::snprintf(line, sizeof line, "  %5lld %12s  %4d  %5s  %11s\n", static_cast<long long>(k), fmt(x[k]).c_str(),
                    cp[k], fmt(nv::e2m1_decode(cp[k])).c_str(), fmt(dp[k]).c_str());
      std::cout << line;
    }
  }
}

void decode() {
  nlohmann::json j = parse_json_text(read_stdin(), "stdin");
  JsonObjectReader r(j, "", "stdin");
  double ts = r.get_double("tensor_scale");
  const nlohmann::json& scales = r.get("block_scales");
  const nlohmann::json& codes = r.get("codes");
  r.reject_unknown_keys();
  if (!scales.is_array()) r.fail("block_scales", "must be an array of integers 0-255");
  if (!codes.is_array() || codes.empty()) r.fail("codes", "must be a non-empty array of integers 0-15");
  const int64_t n = static_cast<int64_t>(codes.size());
  const int64_t blocks = (n + nv::kBlock - 1) / nv::kBlock;
  if (static_cast<int64_t>(scales.size()) != blocks)
    r.fail("block_scales", "has " + std::to_string(scales.size()) + " entries, expected " + std::to_string(blocks) +
                               " (one per 16 codes) for " + std::to_string(n) + " codes");
  if (!std::isfinite(ts) || ts < 0) r.fail("tensor_scale", "must be a finite number >= 0");
  auto int_at = [&](const nlohmann::json& a, size_t i, const char* key, int hi) {
    const nlohmann::json& v = a[i];
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > hi)
      r.fail(std::string(key) + "[" + std::to_string(i) + "]",
             "must be an integer 0-" + std::to_string(hi) + ", got " + v.dump());
    return static_cast<uint8_t>(v.get<int>());
  };
  torch::Tensor c = torch::empty({1, n}, torch::kUInt8);
  for (int64_t i = 0; i < n; ++i) c[0][i] = int_at(codes, i, "codes", 15);
  nv::QTensor q;
  q.shape = {n};
  q.codes = nv::pack_codes(c);
  q.scales = torch::empty({1, blocks}, torch::kUInt8);
  for (int64_t b = 0; b < blocks; ++b) q.scales[0][b] = int_at(scales, b, "block_scales", 255);
  q.tensor_scale = torch::tensor({static_cast<float>(ts)});
  nv::validate(q, "stdin");
  torch::Tensor d = nv::dequantize(q, torch::kFloat);
  const float* dp = d.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) std::cout << (i ? " " : "") << fmt(dp[i]);
  std::cout << "\n";
}

}  // namespace

void add_nvfp4_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("nvfp4", "Inspect the NVFP4 encoding of one row of numbers");
  cmd->require_subcommand(1);
  auto* enc = cmd->add_subcommand(
      "encode", "Read whitespace-separated numbers (one row along the reduction dim) from stdin and encode them");
  static bool enc_json = false;
  enc->add_flag("--json", enc_json,
                "Print {\"tensor_scale\": float, \"block_scales\": [E4M3 bytes], \"codes\": [4-bit codes, sign in bit 3]}");
  enc->callback([] { encode(enc_json); });
  auto* dec = cmd->add_subcommand("decode", "Read the JSON that 'encode --json' prints from stdin and print the values");
  static bool dec_json = true;
  dec->add_flag("--json", dec_json, "The input is encode's JSON (the only input format)");
  dec->callback([] { decode(); });
}

}  // namespace slm::cli
