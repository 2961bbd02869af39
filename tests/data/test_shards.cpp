// Token shards: round trip, dtypes, and rejection of corrupt or truncated files.
#include <filesystem>

#include "data_test_util.h"
#include "slm/data/hashing.h"
#include "slm/data/shards.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;
namespace fs = std::filesystem;

TEST(Crc32c, KnownVector) {
  // The standard check value of CRC-32C.
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  // Incremental == one shot, across the 8-byte fast path.
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7);
  EXPECT_EQ(crc32c(s.data() + 13, s.size() - 13, crc32c(s.data(), 13)), crc32c(s.data(), s.size()));
}

TEST(Shards, RoundTripU16WithMetadata) {
  auto dir = fresh_dir("s");
  std::string path = dir + "/a.slmtok";
  std::vector<std::vector<uint32_t>> docs = {{1, 2, 3}, {}, {65535, 0, 7, 7}, {42}};
  {
    ShardWriter w(path, 65536);
    for (size_t i = 0; i < docs.size(); ++i)
      w.add_document(docs[i], {"pkg" + std::to_string(i), "src/f" + std::to_string(i) + ".cpp", "MIT", "cpp"});
    w.close();
  }
  auto s = Shard::open(path);
  EXPECT_EQ(s->dtype(), TokenDtype::kU16);
  EXPECT_EQ(s->vocab_size(), 65536u);
  EXPECT_EQ(s->doc_count(), 4u);
  EXPECT_EQ(s->token_count(), 8u);
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(s->document(i), docs[i]);
  EXPECT_EQ(s->doc_at(0), 0u);
  EXPECT_EQ(s->doc_at(3), 2u);  // the empty document 1 holds no token
  EXPECT_EQ(s->doc_at(7), 3u);
  auto meta = s->metadata();
  ASSERT_EQ(meta.size(), 4u);
  EXPECT_EQ(meta[2].package, "pkg2");
  EXPECT_EQ(meta[2].path, "src/f2.cpp");
  EXPECT_EQ(meta[2].license, "MIT");
  EXPECT_EQ(meta[2].domain, "cpp");
  EXPECT_EQ(fs::file_size(path), 64u + 16u + 5u * 8u);  // header, 8 uint16 tokens, 5 offsets
}

TEST(Shards, LargeVocabUsesU32) {
  auto dir = fresh_dir("s");
  std::string path = dir + "/b.slmtok";
  ShardWriter w(path, 100000);
  std::vector<uint32_t> d = {99999, 65536, 3};
  w.add_document(d, {});
  w.close();
  auto s = Shard::open(path);
  EXPECT_EQ(s->dtype(), TokenDtype::kU32);
  EXPECT_EQ(s->document(0), d);
  EXPECT_NE(error_of([&] {
              ShardWriter w2(dir + "/c.slmtok", 10);
              std::vector<uint32_t> bad = {10};
              w2.add_document(bad, {});
            }).find("outside the vocabulary"),
            std::string::npos);
}

TEST(Shards, SyntheticWriterSplitsDocuments) {
  auto dir = fresh_dir("s");
  auto paths = write_synthetic_shards(dir, "syn", 1000, 25, 1, 40, 3, 7);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(list_shards(dir), paths);
  uint64_t docs = 0;
  for (const auto& p : paths) docs += Shard::open(p)->doc_count();
  EXPECT_EQ(docs, 25u);
}

class CorruptShard : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fresh_dir("s");
    path = write_synthetic_shards(dir, "x", 500, 10, 5, 50, 1, 3)[0];
    bytes = read_file(path);
  }
  std::string open_error() {
    return error_of([&] { Shard::open(path); });
  }
  std::string dir, path, bytes;
};

TEST_F(CorruptShard, FlippedTokenByteIsRejected) {
  std::string b = bytes;
  b[64 + 11] ^= 0x5a;
  write_file(path, b);
  auto e = open_error();
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("token checksum mismatch"), std::string::npos) << e;
  // Without verification the header still opens (the trainer may choose to skip the full scan).
  EXPECT_NO_THROW(Shard::open(path, /*verify=*/false));
}

TEST_F(CorruptShard, TruncatedFileIsRejected) {
  write_file(path, bytes.substr(0, bytes.size() - 3));
  auto e = open_error();
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("truncated token shard"), std::string::npos) << e;
  write_file(path, bytes.substr(0, 20));
  e = open_error();
  EXPECT_NE(e.find("smaller than the 64-byte header"), std::string::npos) << e;
}

TEST_F(CorruptShard, HeaderAndOffsetsDamageIsRejected) {
  std::string b = bytes;
  b[24] ^= 1;  // token_count
  write_file(path, b);
  EXPECT_NE(open_error().find("header checksum mismatch"), std::string::npos);
  b = bytes;
  b[b.size() - 9] ^= 1;  // inside the offsets table
  write_file(path, b);
  EXPECT_NE(open_error().find("offsets checksum mismatch"), std::string::npos);
  b = bytes;
  b[0] = 'X';
  write_file(path, b);
  EXPECT_NE(open_error().find("bad magic"), std::string::npos);
  write_file(path, bytes + "junk");
  EXPECT_NE(open_error().find("trailing bytes"), std::string::npos);
}

TEST_F(CorruptShard, MismatchedSidecarIsRejected) {
  auto other = write_synthetic_shards(dir, "y", 500, 4, 5, 50, 1, 4)[0];
  fs::copy_file(other + ".json", path + ".json", fs::copy_options::overwrite_existing);
  auto s = Shard::open(path);
  auto e = error_of([&] { s->metadata(); });
  EXPECT_NE(e.find("does not belong"), std::string::npos) << e;
}
