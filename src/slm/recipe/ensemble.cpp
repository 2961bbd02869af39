#include "slm/recipe/ensemble.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <system_error>

#include "slm/util/json_reader.h"
#include "slm/util/sha256.h"

namespace slm {

namespace fs = std::filesystem;

namespace {

// A checksum field: 64 hex digits (what sha256sum prints), kept in lowercase so it compares with sha256_file's.
std::string read_sha256(const JsonObjectReader& r, const std::string& key) {
  if (!r.has(key)) return "";
  std::string hex = r.get_string(key);
  const bool hex_digits = std::all_of(hex.begin(), hex.end(), [](unsigned char c) { return std::isxdigit(c); });
  if (hex.size() != 64 || !hex_digits)
    r.fail(key, "expected the file's SHA-256 as 64 hex digits (as sha256sum prints it), got \"" + hex + "\"");
  std::transform(hex.begin(), hex.end(), hex.begin(), [](unsigned char c) { return std::tolower(c); });
  return hex;
}

}  // namespace

Ensemble read_ensemble_manifest(const std::string& path) {
  nlohmann::json j = parse_json_file(path);
  JsonObjectReader r(j, "", path);
  Ensemble e;
  e.source = path;
  e.name = r.get_string("name");
  e.description = r.get_string("description", "");
  const auto dir = fs::path(path).parent_path();
  auto resolve = [&](const std::string& p) { return p.empty() ? p : (dir / p).lexically_normal().string(); };
  e.router = resolve(r.get_string("router", ""));
  e.router_sha256 = read_sha256(r, "router_sha256");
  if (!e.router_sha256.empty() && e.router.empty()) r.fail("router_sha256", "given, but the manifest has no router");
  const auto& list = r.get("specialists");
  if (!list.is_array() || list.empty()) r.fail("specialists", "expected a non-empty list of specialists");
  for (size_t i = 0; i < list.size(); ++i) {
    JsonObjectReader s(list[i], "specialists[" + std::to_string(i) + "]", path);
    Specialist sp;
    sp.name = s.get_string("name");
    for (const auto& other : e.specialists)
      if (other.name == sp.name) s.fail("name", "duplicate specialist name \"" + sp.name + "\"");
    sp.domain = s.get_string("domain");
    sp.recipe_path = (dir / s.get_string("recipe")).lexically_normal().string();
    sp.checkpoint = resolve(s.get_string("checkpoint", ""));
    sp.sha256 = read_sha256(s, "sha256");
    if (!sp.sha256.empty() && sp.checkpoint.empty()) s.fail("sha256", "given, but the specialist has no checkpoint");
    sp.tokenizer = resolve(s.get_string("tokenizer", ""));
    if (s.has("routes")) {
      const auto& routes = s.get("routes");
      if (!routes.is_array() || routes.empty())
        s.fail("routes", "expected a non-empty list of router labels (e.g. [\"cpp\", \"algorithm\"])");
      for (const auto& l : routes) {
        if (!l.is_string() || l.get<std::string>().empty()) s.fail("routes", "router labels must be non-empty strings");
        sp.routes.push_back(l.get<std::string>());
      }
    } else {
      sp.routes = {sp.name};
    }
    if (s.has("training_tokens")) {
      sp.training_tokens = s.get_int("training_tokens");
      if (*sp.training_tokens < 0) s.fail("training_tokens", "expected a count of tokens (0 or more)");
    }
    if (s.has("heldout_bpb")) {
      sp.heldout_bpb = s.get_double("heldout_bpb");
      if (*sp.heldout_bpb < 0) s.fail("heldout_bpb", "expected bits per byte (0 or more)");
    }
    if (s.has("target")) {
      auto t = s.object("target");
      sp.target_total = t.get_double("total");
      sp.target_active = t.get_double("active");
      t.reject_unknown_keys();
    }
    s.reject_unknown_keys();
    e.specialists.push_back(std::move(sp));
  }
  r.reject_unknown_keys();
  return e;
}

Ensemble load_ensemble(const std::string& path) {
  Ensemble e = read_ensemble_manifest(path);
  for (auto& sp : e.specialists) {
    sp.recipe = load_recipe(sp.recipe_path);
    sp.accounting = account(sp.recipe, make_plan(sp.recipe));
    e.total += sp.accounting.total;
    e.active += sp.accounting.active;
    e.stored += sp.accounting.stored;
    e.bytes_bf16 += sp.accounting.bytes_bf16;
    e.bytes_nvfp4 += sp.accounting.bytes_nvfp4;
  }
  return e;
}

namespace {

// A file whose content the manifest pins (a checkpoint or the router): hashed when present.
ManifestFile check_pinned(std::string role, const std::string& path, const std::string& expected) {
  ManifestFile f;
  f.role = std::move(role);
  f.path = path;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) {
    f.status = ManifestFile::Status::missing;
    return f;
  }
  if (!fs::is_regular_file(st)) {
    f.bytes = 0;
    // A checkpoint directory serves, but a checksum covers one file, so only an unpinned directory passes.
    if (expected.empty()) {
      f.status = ManifestFile::Status::no_checksum;
    } else {
      f.status = ManifestFile::Status::invalid;
      f.detail = "not a file, so it has no SHA-256 (name the weights file itself)";
    }
    return f;
  }
  f.bytes = static_cast<long long>(fs::file_size(path, ec));
  try {
    f.actual_sha256 = sha256_file(path);
  } catch (const Error& e) {
    f.status = ManifestFile::Status::invalid;
    f.detail = e.what();
    return f;
  }
  f.expected_sha256 = expected;
  if (expected.empty())
    f.status = ManifestFile::Status::no_checksum;
  else if (expected != f.actual_sha256)
    f.status = ManifestFile::Status::mismatch;
  return f;
}

// A file the repository keeps in git (recipe, tokenizer): the manifest pins no content, it must only be there.
ManifestFile check_present(std::string role, const std::string& path) {
  ManifestFile f;
  f.role = std::move(role);
  f.path = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    f.status = ManifestFile::Status::missing;
  } else if (!fs::is_regular_file(path, ec)) {
    f.bytes = 0;
    f.status = ManifestFile::Status::invalid;
    f.detail = "not a file";
  } else {
    f.bytes = static_cast<long long>(fs::file_size(path, ec));
  }
  return f;
}

// "recipe of cpp, cmake": each distinct path once, with every specialist that uses it, in manifest order.
std::vector<std::pair<std::string, std::string>> shared_files(const Ensemble& e, const std::string& kind,
                                                              std::string Specialist::*member) {
  std::vector<std::pair<std::string, std::string>> out;  // (role, path)
  std::map<std::string, size_t> at;
  for (const auto& sp : e.specialists) {
    const std::string& path = sp.*member;
    if (path.empty()) continue;
    if (auto it = at.find(path); it != at.end()) {
      out[it->second].first += ", " + sp.name;
    } else {
      at[path] = out.size();
      out.emplace_back(kind + " of " + sp.name, path);
    }
  }
  return out;
}

}  // namespace

std::vector<ManifestFile> verify_ensemble_files(const Ensemble& e) {
  std::vector<ManifestFile> out;
  for (const auto& sp : e.specialists)
    if (!sp.checkpoint.empty()) out.push_back(check_pinned("weights of " + sp.name, sp.checkpoint, sp.sha256));
  if (!e.router.empty()) out.push_back(check_pinned("router", e.router, e.router_sha256));
  for (const auto& [role, path] : shared_files(e, "recipe", &Specialist::recipe_path)) {
    ManifestFile f = check_present(role, path);
    if (f.status == ManifestFile::Status::ok) {
      try {
        load_recipe(path);
      } catch (const Error& err) {
        f.status = ManifestFile::Status::invalid;
        f.detail = err.what();
      }
    }
    out.push_back(std::move(f));
  }
  for (const auto& [role, path] : shared_files(e, "tokenizer", &Specialist::tokenizer))
    out.push_back(check_present(role, path));
  return out;
}

bool verification_failed(const ManifestFile& f, bool strict) {
  switch (f.status) {
    case ManifestFile::Status::ok: return false;
    case ManifestFile::Status::no_checksum: return strict;
    case ManifestFile::Status::missing:
    case ManifestFile::Status::mismatch:
    case ManifestFile::Status::invalid: return true;
  }
  return true;
}

namespace {
constexpr const char* kShippedManifest = "models/ensemble.json";
}

std::vector<std::string> default_ensemble_candidates(const fs::path& executable, const fs::path& cwd) {
  std::vector<std::string> out;
  if (!cwd.empty()) out.push_back((cwd / kShippedManifest).lexically_normal().string());
  if (executable.has_parent_path())
    out.push_back((executable.parent_path() / ".." / kShippedManifest).lexically_normal().string());
  return out;
}

std::string default_ensemble_path(const fs::path& executable, const fs::path& cwd) {
  for (const auto& p : default_ensemble_candidates(executable, cwd)) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p;
  }
  return "";
}

namespace {
// Either may be unknown (an unreadable /proc, a removed working directory): its candidate is then skipped.
fs::path this_executable() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec);
}
fs::path working_directory() {
  std::error_code ec;
  return fs::current_path(ec);
}
}  // namespace

std::string default_ensemble_path() {
  return default_ensemble_path(this_executable(), working_directory());
}

std::string default_ensemble_missing_note() {
  std::string tried;
  for (const auto& p : default_ensemble_candidates(this_executable(), working_directory()))
    tried += (tried.empty() ? "" : " or ") + p;
  return std::string("the shipped models are missing (no ") + kShippedManifest + ": looked for " + tried + ")";
}

}  // namespace slm
