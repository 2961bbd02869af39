// The training-window loader: shapes, document boundaries, determinism, exact resume, mixing and ranks.
#include <set>

#include "data_test_util.h"
#include "slm/data/loader.h"

using namespace slm;
using namespace slm::data;
using namespace slm::test;

namespace {

// Token stream of a source: its shards concatenated, with the document start positions.
struct Stream {
  std::vector<int64_t> tokens;
  std::set<uint64_t> starts;
};

Stream stream_of(const std::vector<std::string>& paths) {
  Stream s;
  for (const auto& p : paths) {
    auto sh = Shard::open(p);
    for (uint64_t d = 0; d < sh->doc_count(); ++d) {
      if (sh->doc_begin(d) < sh->doc_begin(d + 1)) s.starts.insert(s.tokens.size());
      for (auto t : sh->document(d)) s.tokens.push_back(t);
    }
  }
  return s;
}

bool same(const Batch& a, const Batch& b) {
  return torch::equal(a.tokens, b.tokens) && torch::equal(a.doc_ids, b.doc_ids) && torch::equal(a.source, b.source);
}

}  // namespace

TEST(PermuteIndex, IsABijection) {
  for (uint64_t n : {1ull, 2ull, 3ull, 17ull, 64ull, 1000ull}) {
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) seen.insert(permute_index(i, n, 12345));
    EXPECT_EQ(seen.size(), n);
    EXPECT_LT(*seen.rbegin(), n);
  }
}

TEST(TokenLoader, WindowsMatchTheStreamAndMarkDocuments) {
  auto dir = fresh_dir("l");
  auto paths = write_synthetic_shards(dir, "a", 300, 40, 1, 30, 3, 11);
  const Stream st = stream_of(paths);
  LoaderOptions o;
  o.batch_size = 4;
  o.seq_len = 16;
  o.seed = 5;
  TokenLoader loader({{"a", paths, 1.0}}, o);
  EXPECT_EQ(loader.windows(0), (st.tokens.size() - 1) / 16);
  std::set<uint64_t> windows;
  const uint64_t W = loader.windows(0);
  for (uint64_t b = 0; b < W / 4; ++b) {
    Batch batch = loader.next();
    ASSERT_EQ(batch.tokens.sizes(), (std::vector<int64_t>{4, 17}));
    ASSERT_EQ(batch.doc_ids.sizes(), (std::vector<int64_t>{4, 17}));
    for (int64_t r = 0; r < 4; ++r) {
      const uint64_t w = batch.window[r];
      windows.insert(w);
      int32_t seg = 0;
      for (int64_t t = 0; t < 17; ++t) {
        const uint64_t pos = w * 16 + t;
        ASSERT_EQ(batch.tokens[r][t].item<int64_t>(), st.tokens[pos]);
        if (t > 0 && st.starts.count(pos)) ++seg;  // a document (or shard) starts here
        ASSERT_EQ(batch.doc_ids[r][t].item<int32_t>(), seg) << "window " << w << " t " << t;
      }
    }
  }
  // One epoch visits distinct windows.
  EXPECT_EQ(windows.size(), W / 4 * 4);
}

TEST(TokenLoader, DeterministicAndResumesExactly) {
  auto dir = fresh_dir("l");
  auto a = write_synthetic_shards(dir, "a", 1000, 30, 10, 200, 2, 1);
  auto b = write_synthetic_shards(dir, "b", 1000, 10, 10, 100, 1, 2);
  LoaderOptions o;
  o.batch_size = 3;
  o.seq_len = 32;
  o.seed = 99;
  std::vector<ShardSource> src = {{"a", a, 3.0}, {"b", b, 1.0}};
  TokenLoader l1(src, o), l2(src, o);
  std::vector<Batch> first;
  nlohmann::json saved;
  for (int i = 0; i < 40; ++i) {  // several epochs of the small source
    if (i == 17) saved = l1.cursor().to_json();
    first.push_back(l1.next());
    ASSERT_TRUE(same(first.back(), l2.next())) << "batch " << i;
  }
  TokenLoader resumed(src, o);
  resumed.restore(LoaderCursor::from_json(nlohmann::json::parse(saved.dump())));
  for (int i = 17; i < 40; ++i) ASSERT_TRUE(same(first[i], resumed.next())) << "batch " << i;

  // Another seed gives another stream; a cursor from another seed is refused.
  LoaderOptions o2 = o;
  o2.seed = 100;
  TokenLoader other(src, o2);
  EXPECT_FALSE(same(other.next(), TokenLoader(src, o).next()));
  EXPECT_NE(error_of([&] { other.restore(LoaderCursor::from_json(saved)); }).find("different seed"), std::string::npos);
}

TEST(TokenLoader, MixesSourcesByWeightAndEpochsReshuffle) {
  auto dir = fresh_dir("l");
  auto a = write_synthetic_shards(dir, "a", 500, 20, 50, 60, 1, 1);
  auto b = write_synthetic_shards(dir, "b", 500, 20, 50, 60, 1, 2);
  LoaderOptions o;
  o.batch_size = 50;
  o.seq_len = 8;
  o.seed = 3;
  TokenLoader l({{"a", a, 3.0}, {"b", b, 1.0}}, o);
  int64_t from_a = 0, total = 0;
  for (int i = 0; i < 40; ++i) {
    auto bt = l.next();
    from_a += (bt.source == 0).sum().item<int64_t>();
    total += bt.source.numel();
  }
  EXPECT_NEAR(static_cast<double>(from_a) / total, 0.75, 0.03);

  // Epoch 2 of a source is a different order of the same windows.
  TokenLoader single({{"a", a, 1.0}}, {.batch_size = 1, .seq_len = 8, .seed = 3});
  const uint64_t W = single.windows(0);
  std::vector<uint64_t> e1, e2;
  for (uint64_t i = 0; i < W; ++i) e1.push_back(single.next().window[0]);
  for (uint64_t i = 0; i < W; ++i) e2.push_back(single.next().window[0]);
  EXPECT_NE(e1, e2);
  std::sort(e1.begin(), e1.end());
  std::sort(e2.begin(), e2.end());
  EXPECT_EQ(e1, e2);
}

TEST(TokenLoader, RanksPartitionTheSingleProcessStream) {
  auto dir = fresh_dir("l");
  auto a = write_synthetic_shards(dir, "a", 700, 30, 20, 80, 2, 8);
  auto b = write_synthetic_shards(dir, "b", 700, 30, 20, 80, 2, 9);
  std::vector<ShardSource> src = {{"a", a, 1.0}, {"b", b, 2.0}};
  TokenLoader whole(src, {.batch_size = 4, .seq_len = 16, .seed = 1});
  TokenLoader r0(src, {.batch_size = 2, .seq_len = 16, .seed = 1, .rank = 0, .world_size = 2});
  TokenLoader r1(src, {.batch_size = 2, .seq_len = 16, .seed = 1, .rank = 1, .world_size = 2});
  for (int i = 0; i < 5; ++i) {
    auto w = whole.next();
    auto x = r0.next(), y = r1.next();
    // Global samples 4i..4i+3: rank 0 holds the even ones, rank 1 the odd ones.
    EXPECT_TRUE(torch::equal(w.tokens.index({torch::indexing::Slice(0, 4, 2)}), x.tokens));
    EXPECT_TRUE(torch::equal(w.tokens.index({torch::indexing::Slice(1, 4, 2)}), y.tokens));
  }
}

TEST(TokenLoader, RejectsTooSmallSources) {
  auto dir = fresh_dir("l");
  auto a = write_synthetic_shards(dir, "a", 100, 1, 5, 5, 1, 1);
  auto e = error_of([&] { TokenLoader({{"a", a, 1.0}}, {.batch_size = 1, .seq_len = 16}); });
  EXPECT_NE(e.find("fewer than one window"), std::string::npos) << e;
}

TEST(TokenLoader, ARangeReadsOnlyItsTokens) {
  auto dir = fresh_dir("l");
  auto paths = write_synthetic_shards(dir, "a", 300, 40, 1, 30, 3, 12);
  const Stream st = stream_of(paths);
  ASSERT_GT(st.tokens.size(), 200u);
  const uint64_t begin = 57, end = st.tokens.size() - 31, T = 8;
  TokenLoader loader({{"a", paths, 1.0, begin, end}}, {.batch_size = 1, .seq_len = static_cast<int64_t>(T)});
  EXPECT_EQ(loader.tokens(0), end - begin);
  ASSERT_EQ(loader.windows(0), (end - begin - 1) / T);
  std::vector<int64_t> tokens(T + 1);
  std::vector<int32_t> docs(T + 1);
  for (uint64_t w = 0; w < loader.windows(0); ++w) {
    loader.read_window(0, w, tokens.data(), docs.data());
    for (uint64_t t = 0; t <= T; ++t) ASSERT_EQ(tokens[t], st.tokens[begin + w * T + t]) << "window " << w;
  }
  // The last window ends inside the range.
  EXPECT_LE(begin + loader.windows(0) * T + 1, end);

  // A cursor of the whole source does not resume the range, and a range past the end is refused.
  TokenLoader whole({{"a", paths, 1.0}}, {.batch_size = 1, .seq_len = static_cast<int64_t>(T)});
  EXPECT_NE(error_of([&] { loader.restore(whole.cursor()); }).find("different seed"), std::string::npos);
  auto e = error_of([&] {
    TokenLoader({{"a", paths, 1.0, st.tokens.size() + 1}}, {.batch_size = 1, .seq_len = static_cast<int64_t>(T)});
  });
  EXPECT_NE(e.find("past its end"), std::string::npos) << e;
}
