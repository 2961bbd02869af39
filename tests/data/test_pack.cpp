// Packs for the GPU machine: SHA-256 against FIPS 180-4's vectors and sha256sum, xz round trips, packing under a
// size limit, byte-identical unpacking, corruption caught, and `slm train --data X.slmpack` continuing on the next
// pack with --resume.
#include <sys/stat.h>

#include <fstream>
#include <set>

#include "data_test_util.h"
#include "slm/data/pack.h"
#include "slm/data/shards.h"
#include "slm/util/files.h"
#include "slm/util/process.h"
#include "slm/util/sha256.h"
#include "train/train_test_util.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;

TEST(Sha256, MatchesTheStandardsVectorsAndSha256sum) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Pieces of every size add up to the one-shot digest (block boundaries inside and across updates).
  std::string msg;
  for (int i = 0; i < 1000; ++i) msg += static_cast<char>(i * 37 + 11);
  Sha256 h;
  for (size_t at = 0, n = 1; at < msg.size(); at += n, n = n % 97 + 1) h.update(msg.substr(at, n));
  EXPECT_EQ(h.hex(), sha256_hex(msg));
  if (!program_available("sha256sum")) GTEST_SKIP() << "sha256sum not installed";
  const std::string dir = fresh_dir("sha");
  write_file(dir + "/f", msg);
  const auto r = run_process({"sha256sum", dir + "/f"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.out.substr(0, 64), sha256_file(dir + "/f"));
}

TEST(Xz, RoundTripsAndRejectsDamage) {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "token " + std::to_string(i % 97) + "\n";
  const std::string packed = xz_compress(text, 6);
  EXPECT_LT(packed.size(), text.size() / 4);
  EXPECT_EQ(xz_decompress(packed, text.size(), "t"), text);
  std::string bad = packed;
  bad[bad.size() / 2] ^= 0x40;
  EXPECT_NE(error_of([&] { xz_decompress(bad, text.size(), "member x"); }).find("member x"), std::string::npos);
  EXPECT_NE(error_of([&] { xz_decompress(packed.substr(0, packed.size() - 9), text.size(), "m"); }), "<no error>");
  EXPECT_NE(error_of([&] { xz_decompress(packed, text.size() + 1, "m"); }), "<no error>");
}

namespace {

std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(std::filesystem::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(Packs, SplitUnderTheLimitAndUnpackByteForByte) {
  const std::string dir = fresh_dir("packs"), shards = dir + "/shards", out = dir + "/packs";
  // Random ids barely compress: 6 shards of ~40 KB each need several 100 KB packs.
  write_synthetic_shards(shards + "/cpp", "train", 30000, 300, 100, 300, 3, 1);
  write_synthetic_shards(shards + "/cmake", "train", 30000, 300, 100, 300, 3, 2);
  uint64_t shard_tokens = 0;
  for (const auto& p : list_shards(shards + "/cpp")) shard_tokens += Shard::open(p)->token_count();
  for (const auto& p : list_shards(shards + "/cmake")) shard_tokens += Shard::open(p)->token_count();
  PackOptions o;
  o.shard_dir = shards;
  o.out_dir = out;
  o.max_pack_bytes = 100000;
  uint64_t last_done = 0, last_total = 0;
  const auto packs = write_packs(o, [&](uint64_t d, uint64_t t) { last_done = d, last_total = t; });
  ASSERT_GE(packs.size(), 2u);
  EXPECT_EQ(last_done, last_total);
  std::multiset<std::string> members;
  uint64_t tokens = 0;
  for (const auto& p : packs) {
    struct stat st {};
    ASSERT_EQ(::stat((out + "/" + p.file).c_str(), &st), 0);
    EXPECT_LE(static_cast<uint64_t>(st.st_size), o.max_pack_bytes) << p.file;
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), p.bytes);
    EXPECT_EQ(sha256_file(out + "/" + p.file), p.sha256);
    members.insert(p.members.begin(), p.members.end());
    for (const auto& m : p.members)  // a shard and its sidecar travel in one pack
      if (m.ends_with(".slmtok")) {
        EXPECT_NE(std::find(p.members.begin(), p.members.end(), m + ".json"), p.members.end()) << m;
      }
    tokens += p.tokens;
    EXPECT_EQ(read_pack_header(out + "/" + p.file).tokens, p.tokens);
  }
  EXPECT_EQ(tokens, shard_tokens);
  const auto originals = files_under(shards);
  EXPECT_EQ(std::vector<std::string>(members.begin(), members.end()), originals);  // each file exactly once
  const auto listed = nlohmann::json::parse(test::read_file(out + "/packs.json"));
  EXPECT_EQ(listed["packs"].size(), packs.size());

  const std::string un = dir + "/unpacked";
  for (const auto& p : packs) extract_pack(out + "/" + p.file, un);
  for (const auto& f : originals) EXPECT_EQ(test::read_file(un + "/" + f), test::read_file(shards + "/" + f)) << f;

  o.max_pack_bytes = 20000;  // one shard alone does not fit
  EXPECT_NE(error_of([&] { write_packs(o); }).find("--max-shard-tokens"), std::string::npos);
}

TEST(Packs, DamageIsCaughtAndNothingIsTakenForComplete) {
  const std::string dir = fresh_dir("damage"), shards = dir + "/shards", out = dir + "/packs";
  write_synthetic_shards(shards + "/cpp", "train", 30000, 20, 50, 100, 1, 3);
  PackOptions o;
  o.shard_dir = shards;
  o.out_dir = out;
  const auto packs = write_packs(o);
  ASSERT_EQ(packs.size(), 1u);
  const std::string good = out + "/" + packs[0].file;
  const std::string bytes = test::read_file(good);
  const auto h = read_pack_header(good);

  // A flipped byte in the last member, a truncated file, a foreign file.
  std::string flipped = bytes;
  flipped[flipped.size() - 40] ^= 0x01;
  write_file(dir + "/flipped.slmpack", flipped);
  EXPECT_NE(error_of([&] { extract_pack(dir + "/flipped.slmpack", dir + "/x"); }).find("flipped.slmpack: member"),
            std::string::npos);
  write_file(dir + "/short.slmpack", bytes.substr(0, bytes.size() - 100));
  EXPECT_NE(error_of([&] { read_pack_header(dir + "/short.slmpack"); }).find("past the end"), std::string::npos);
  write_file(dir + "/foreign.slmpack", "PK\x03\x04 not a pack at all");
  EXPECT_NE(error_of([&] { read_pack_header(dir + "/foreign.slmpack"); }).find("not a pack"), std::string::npos);
  // A header naming a path outside the destination.
  std::string evil = bytes;
  const size_t at = evil.find(h.members[0].name);
  ASSERT_NE(at, std::string::npos);
  evil.replace(at, 3, "../");
  write_file(dir + "/evil.slmpack", evil);
  EXPECT_NE(error_of([&] { read_pack_header(dir + "/evil.slmpack"); }).find("not a relative path"), std::string::npos);

  // slm train's resolution: unpacked once, reused, and a damaged pack leaves no directory behind.
  std::ostringstream log;
  const std::string d = resolve_training_data(good, log);
  EXPECT_EQ(d, good + ".d");
  EXPECT_NE(log.str().find("unpacking"), std::string::npos);
  std::ostringstream again;
  EXPECT_EQ(resolve_training_data(good, again), d);
  EXPECT_EQ(again.str(), "");  // nothing unpacked the second time
  EXPECT_EQ(resolve_training_data(shards, again), shards);
  std::ostringstream bad;
  EXPECT_NE(error_of([&] { resolve_training_data(dir + "/flipped.slmpack", bad); }), "<no error>");
  EXPECT_NE(::access((dir + "/flipped.slmpack.d").c_str(), F_OK), 0);
}

TEST(Packs, TrainingRunsOnAPackAndResumesOnTheNext) {
  const std::string dir = fresh_dir("train");
  const std::string recipe = write_recipe(dir, micro_hybrid_json());
  for (int i : {0, 1}) {
    const std::string s = dir + "/shards" + std::to_string(i);
    slm::make_dirs(s + "/count");
    write_counting_shards(s, "count", 48, 64, 11 + i);
    PackOptions o;
    o.shard_dir = s;
    o.out_dir = dir + "/packs" + std::to_string(i);
    o.name = "part" + std::to_string(i);
    ASSERT_EQ(write_packs(o).size(), 1u);
  }
  const std::string p0 = dir + "/packs0/part0-00000.slmpack", p1 = dir + "/packs1/part1-00000.slmpack";
  const std::string run = dir + "/run";
  const std::string common =
      " --batch 4 --seq-len 24 --seed 7 --warmup 2 --eval-every 0 --checkpoint-every 4 --threads 1 --tokenizer none";
  auto r = run_slm("train --recipe " + recipe + " --data " + p0 + " --out " + run + " --steps 4" + common);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("unpacking " + p0), std::string::npos) << r.out;
  r = run_slm("train --resume " + run + " --data " + p1 + " --steps 8 --checkpoint-every 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resuming on new data " + p1 + ".d"), std::string::npos) << r.out;
  const auto losses = train_losses(run);
  EXPECT_EQ(losses.size(), 8u);
  EXPECT_TRUE(losses.count(8));
  // Resuming on the same data again is the exact resume: no new-data note.
  r = run_slm("train --resume " + run + " --steps 10 --checkpoint-every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("new data"), std::string::npos) << r.out;
}
