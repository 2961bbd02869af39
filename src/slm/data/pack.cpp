#include "slm/data/pack.h"

#include <dirent.h>
#include <lzma.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "slm/data/shards.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "slm/util/sha256.h"

namespace slm::data {

namespace {

constexpr char kMagic[8] = {'S', 'L', 'M', 'P', 'A', 'C', 'K', '1'};

void list_files(const std::string& dir, const std::string& rel, std::vector<std::string>& out) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) throw Error(dir + ": cannot list the directory");
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    const std::string path = dir + "/" + n, r = rel.empty() ? n : rel + "/" + n;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode))
      list_files(path, r, out);
    else if (S_ISREG(st.st_mode) && !n.ends_with(".tmp"))
      out.push_back(r);
  }
}

bool safe_member_name(const std::string& n) {
  if (n.empty() || n.front() == '/' || n.find('\0') != std::string::npos) return false;
  size_t start = 0;
  while (start <= n.size()) {
    size_t e = n.find('/', start);
    if (e == std::string::npos) e = n.size();
    const std::string part = n.substr(start, e - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = e + 1;
  }
  return true;
}

std::string lzma_message(lzma_ret r) {
  switch (r) {
    case LZMA_MEM_ERROR: return "out of memory";
    case LZMA_FORMAT_ERROR: return "not an xz stream";
    case LZMA_DATA_ERROR: return "corrupt data";
    case LZMA_BUF_ERROR: return "truncated data";
    case LZMA_OPTIONS_ERROR: return "unsupported options";
    default: return "liblzma error " + std::to_string(static_cast<int>(r));
  }
}

void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}

struct Unit {
  std::vector<std::string> names;  // a shard and its sidecar travel together
  std::vector<std::string> packed;
  std::vector<PackMember> members;
  uint64_t raw = 0, packed_bytes = 0, tokens = 0;
};

}  // namespace

std::string xz_compress(const std::string& bytes, uint32_t preset) {
  std::string out(lzma_stream_buffer_bound(bytes.size()), '\0');
  size_t pos = 0;
  const lzma_ret r =
      lzma_easy_buffer_encode(preset, LZMA_CHECK_CRC64, nullptr, reinterpret_cast<const uint8_t*>(bytes.data()),
                              bytes.size(), reinterpret_cast<uint8_t*>(out.data()), &pos, out.size());
  if (r != LZMA_OK) throw Error("xz compression failed: " + lzma_message(r));
  out.resize(pos);
  return out;
}

std::string xz_decompress(const std::string& packed, uint64_t expected_bytes, const std::string& what) {
  // Decoded in pieces into a growing string, so that memory follows what the stream really holds: allocating the
  // header's size first let a corrupt pack that claims terabytes exhaust memory before any check.
  lzma_stream s = LZMA_STREAM_INIT;
  lzma_ret r = lzma_stream_decoder(&s, UINT64_MAX, 0);
  if (r != LZMA_OK) throw Error(what + ": " + lzma_message(r));
  s.next_in = reinterpret_cast<const uint8_t*>(packed.data());
  s.avail_in = packed.size();
  std::string out;
  std::vector<uint8_t> piece(1 << 16);
  do {
    s.next_out = piece.data();
    s.avail_out = piece.size();
    r = lzma_code(&s, LZMA_FINISH);
    out.append(reinterpret_cast<const char*>(piece.data()), piece.size() - s.avail_out);
  } while (r == LZMA_OK && out.size() <= expected_bytes);
  const size_t unread = s.avail_in;
  lzma_end(&s);
  if (r != LZMA_OK && r != LZMA_STREAM_END) throw Error(what + ": " + lzma_message(r));
  if (r != LZMA_STREAM_END || out.size() != expected_bytes || unread != 0)
    throw Error(what + ": unpacks to " + std::string(out.size() > expected_bytes ? "more than " : "") +
                std::to_string(out.size()) + " bytes, the header says " + std::to_string(expected_bytes));
  return out;
}

std::vector<PackSummary> write_packs(const PackOptions& o, const ProgressFn& progress) {
  if (o.max_pack_bytes < 1024) throw Error("data pack: the pack size limit is too small");
  if (o.preset > 9) throw Error("data pack: the xz preset is 0 to 9");
  std::vector<std::string> files;
  list_files(o.shard_dir, "", files);
  // Units: every file ending in .slmtok with the files named after it (its sidecar); other files alone.
  std::map<std::string, Unit> by_key;
  std::vector<std::string> order;
  for (const auto& f : files) {
    std::string key = f;
    if (const size_t at = f.find(".slmtok"); at != std::string::npos) key = f.substr(0, at + 7);
    if (!by_key.count(key)) order.push_back(key);
    by_key[key].names.push_back(f);
  }
  if (!std::any_of(files.begin(), files.end(), [](const std::string& f) { return f.ends_with(".slmtok"); }))
    throw Error(o.shard_dir + ": no .slmtok shards to pack (make them with slm data shard)");
  uint64_t total = 0, done = 0;
  for (const auto& f : files) {
    struct stat st {};
    if (::stat((o.shard_dir + "/" + f).c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  make_dirs(o.out_dir);

  std::vector<PackSummary> packs;
  std::vector<Unit*> current;
  uint64_t current_bytes = 0;
  auto flush = [&] {
    if (current.empty()) return;
    PackSummary s;
    char name[64];
    std::snprintf(name, sizeof name, "-%05zu.slmpack", packs.size());
    s.file = o.name + name;
    nlohmann::json header = {{"format", 1}, {"kind", "tokens"}, {"members", nlohmann::json::array()}};
    uint64_t offset = 0;
    for (Unit* u : current)
      for (auto& m : u->members) {
        m.offset = offset;
        offset += m.packed;
        header["members"].push_back(
            {{"name", m.name}, {"bytes", m.bytes}, {"packed", m.packed}, {"offset", m.offset}, {"sha256", m.sha256}});
        s.members.push_back(m.name);
        s.raw_bytes += m.bytes;
      }
    for (Unit* u : current) s.tokens += u->tokens;
    header["tokens"] = s.tokens;
    const std::string h = header.dump();
    std::string blob(kMagic, 8);
    put_u64(blob, h.size());
    blob += h;
    for (Unit* u : current)
      for (const auto& p : u->packed) blob += p;
    write_file_atomic(o.out_dir + "/" + s.file, blob);
    s.bytes = blob.size();
    s.sha256 = sha256_hex(blob);
    packs.push_back(std::move(s));
    for (Unit* u : current) u->packed.clear();
    current.clear();
    current_bytes = 0;
  };

  std::vector<Unit*> units;
  for (const auto& k : order) units.push_back(&by_key[k]);
  // Units are compressed `jobs` at a time, then placed in order.
  const int jobs = std::max(1, o.jobs);
  for (size_t first = 0; first < order.size(); first += static_cast<size_t>(jobs)) {
    const size_t last = std::min(order.size(), first + static_cast<size_t>(jobs));
    std::vector<std::exception_ptr> errors(last - first);
    std::vector<std::thread> threads;
    for (size_t i = first; i < last; ++i)
      threads.emplace_back([&, i] {
        try {
          Unit& u = *units[i];
          for (const auto& n : u.names) {
            const std::string path = o.shard_dir + "/" + n;
            const std::string bytes = read_file(path);
            PackMember m;
            m.name = n;
            m.bytes = bytes.size();
            m.sha256 = sha256_hex(bytes);
            u.packed.push_back(xz_compress(bytes, o.preset));
            m.packed = u.packed.back().size();
            u.raw += m.bytes;
            u.packed_bytes += m.packed;
            u.members.push_back(std::move(m));
            if (n.ends_with(".slmtok")) u.tokens += Shard::open(path, /*verify=*/false)->token_count();
          }
        } catch (...) {
          errors[i - first] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (size_t i = first; i < last; ++i) {
      Unit& u = *units[i];
      const uint64_t header_allowance = 512 + 256 * u.members.size();
      if (u.packed_bytes + header_allowance > o.max_pack_bytes)
        throw Error(o.shard_dir + "/" + order[i] + " compresses to " + std::to_string(u.packed_bytes >> 20) +
                    " MiB, more than a pack may hold (" + std::to_string(o.max_pack_bytes >> 20) +
                    " MiB): write smaller shards (slm data shard --max-shard-tokens, e.g. 50000000)");
      if (current_bytes + u.packed_bytes + header_allowance * (current.size() + 1) > o.max_pack_bytes) flush();
      current.push_back(&u);
      current_bytes += u.packed_bytes;
      done += u.raw;
      if (progress) progress(done, total);
    }
  }
  flush();
  nlohmann::json list = nlohmann::json::array();
  for (const auto& p : packs)
    list.push_back({{"file", p.file},
                    {"sha256", p.sha256},
                    {"bytes", p.bytes},
                    {"raw_bytes", p.raw_bytes},
                    {"tokens", p.tokens},
                    {"members", p.members}});
  write_file_atomic(o.out_dir + "/packs.json", nlohmann::json{{"packs", list}}.dump(1) + "\n");
  return packs;
}

PackHeader read_pack_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the pack");
  char magic[8] = {};
  unsigned char len[8] = {};
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(len), 8);
  if (!in || std::memcmp(magic, kMagic, 8) != 0) throw Error(path + ": not a pack (slm data pack writes them)");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t{len[i]} << (8 * i);
  in.seekg(0, std::ios::end);
  const uint64_t file_bytes = static_cast<uint64_t>(in.tellg());
  if (hlen > file_bytes - 16 || hlen > (64u << 20)) throw Error(path + ": the header length is corrupt");
  in.seekg(16);
  std::string h(hlen, '\0');
  in.read(h.data(), static_cast<std::streamsize>(hlen));
  const auto j = nlohmann::json::parse(h, nullptr, false);
  // value()/get() of a field of another type throw nlohmann's errors, and get<uint64_t>() of a float or a negative
  // number converts without a check (1e300: undefined behaviour): every field's type is checked first.
  if (!in || j.is_discarded() || !j.is_object() || !j.contains("format") || j["format"] != 1 ||
      !j.contains("members") || !j["members"].is_array() || (j.contains("tokens") && !j["tokens"].is_number_unsigned()))
    throw Error(path + ": the pack header is corrupt");
  PackHeader p;
  p.path = path;
  p.data_offset = 16 + hlen;
  p.header_sha256 = sha256_hex(h);
  p.tokens = j.value("tokens", uint64_t{0});
  const uint64_t data_bytes = file_bytes - p.data_offset;
  auto u64 = [&](const nlohmann::json& m, const char* key) {
    if (!m.at(key).is_number_unsigned())
      throw Error(path + ": the pack header is corrupt: member " + key + " is not an unsigned integer");
    return m.at(key).get<uint64_t>();
  };
  try {
    for (const auto& m : j["members"]) {
      PackMember pm{m.at("name").get<std::string>(), u64(m, "bytes"), u64(m, "packed"), u64(m, "offset"),
                    m.at("sha256").get<std::string>()};
      if (!safe_member_name(pm.name)) throw Error(path + ": member name '" + pm.name + "' is not a relative path");
      if (pm.offset > data_bytes || pm.packed > data_bytes - pm.offset)
        throw Error(path + ": member " + pm.name + " lies past the end of the file (truncated pack?)");
      p.members.push_back(std::move(pm));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": the pack header is corrupt: " + e.what());
  }
  return p;
}

void extract_pack(const std::string& path, const std::string& dest_dir) {
  const PackHeader h = read_pack_header(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read the pack");
  make_dirs(dest_dir);
  for (const auto& m : h.members) {
    std::string packed(m.packed, '\0');
    in.seekg(static_cast<std::streamoff>(h.data_offset + m.offset));
    in.read(packed.data(), static_cast<std::streamsize>(m.packed));
    if (!in) throw Error(path + ": member " + m.name + " cannot be read (truncated pack?)");
    const std::string bytes = xz_decompress(packed, m.bytes, path + ": member " + m.name);
    if (sha256_hex(bytes) != m.sha256) throw Error(path + ": member " + m.name + " fails its SHA-256 check");
    const std::string out = dest_dir + "/" + m.name;
    make_parent_dirs(out);
    write_file_atomic(out, bytes);
  }
  write_file_atomic(dest_dir + "/.slmpack", h.header_sha256 + "\n");
}

std::string resolve_training_data(const std::string& data, std::ostream& log) {
  if (!data.ends_with(".slmpack")) return data;
  const PackHeader h = read_pack_header(data);
  const std::string dest = data + ".d";
  auto complete = [&](const std::string& dir) {
    std::ifstream m(dir + "/.slmpack");
    std::string line;
    return std::getline(m, line) && line == h.header_sha256;
  };
  if (complete(dest)) return dest;
  log << "slm: unpacking " << data << " (" << h.members.size() << " files, " << h.tokens << " tokens) into " << dest
      << "\n";
  // Into a private directory first, then renamed: a half-written directory is never taken for a complete one, and
  // when several processes of one run unpack at once the first rename wins and the others use its result.
  std::string tmpl = dest + ".tmp-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw Error(dest + ": cannot make a temporary directory next to the pack");
  try {
    extract_pack(data, tmpl);
  } catch (...) {
    remove_tree(tmpl);
    throw;
  }
  if (!complete(dest)) remove_tree(dest);  // a stale or partial directory of another pack
  if (std::rename(tmpl.c_str(), dest.c_str()) != 0) {
    remove_tree(tmpl);
    if (!complete(dest)) throw Error(dest + ": cannot move the unpacked pack into place");
  }
  return dest;
}

}  // namespace slm::data
