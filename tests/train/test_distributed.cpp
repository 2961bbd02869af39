// Data-parallel training: two gloo worker processes started by `slm train --nproc 2` train the same model as one
// process on the same global batch (losses, weights and Muon momentum equal within float tolerance), with buckets
// small enough that Muon matrices of one parameter land on different owners.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "slm/train/checkpoint.h"
#include "slm/train/distributed.h"
#include "slm/util/error.h"
#include "slm/util/files.h"
#include "test_util.h"
#include "train/train_test_util.h"

namespace slm::test {
namespace {

struct DataParallelCli : ::testing::Test {
  void SetUp() override {
    dir = fresh_dir("ddp");
    data = dir + "/shards";
    ::mkdir(data.c_str(), 0755);
    write_counting_shards(data, "count", 48, 64, 11);
    recipe = write_recipe(dir, micro_hybrid_json());
  }
  // float32 Newton-Schulz: the comparison is about the data-parallel plumbing, and bf16 rounding of two slightly
  // different (summation-order) gradients would blur it.
  std::string args(const std::string& out, const std::string& extra = "") {
    return "train --recipe " + recipe + " --data " + data + " --out " + out +
           " --steps 8 --batch 4 --seq-len 24 --seed 7 --warmup 2 --eval-every 0 --checkpoint-every 0 --threads 1"
           " --optim ns_dtype=float32 --tokenizer none " +
           extra;
  }
  std::string dir, data, recipe;
};

double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max() / (b.to(torch::kDouble).abs().max() + 1e-12))
      .item<double>();
}

TEST_F(DataParallelCli, TwoGlooProcessesMatchOneProcessOnTheSameGlobalBatch) {
  const std::string one = dir + "/one", two = dir + "/two";
  auto r1 = run_slm(args(one));
  ASSERT_EQ(r1.code, 0) << r1.out;
  // 3000-element buckets: many buckets, each stacked expert tensor split between the two owners.
  auto r2 = run_slm(args(two, "--nproc 2 --bucket-elements 3000"));
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_NE(r2.out.find("starting 2 data-parallel workers"), std::string::npos) << r2.out;

  auto l1 = train_losses(one), l2 = train_losses(two);
  ASSERT_EQ(l1.size(), 8u);
  ASSERT_EQ(l2.size(), 8u) << "rank 0 alone writes metrics.jsonl, once per step";
  for (const auto& [step, loss] : l1) EXPECT_NEAR(l2.at(step), loss, 1e-4 * std::abs(loss)) << "step " << step;
  EXPECT_LT(l1.at(8), l1.at(1));  // it trained
  // The clip norm is the averaged gradient's: owned Muon parts and replicated AdamW parts summed over ranks.
  std::map<int64_t, double> g1, g2;
  for (const auto& j : read_metrics(one))
    if (j.contains("grad_norm")) g1[j["step"]] = j["grad_norm"];
  for (const auto& j : read_metrics(two))
    if (j.contains("grad_norm")) g2[j["step"]] = j["grad_norm"];
  ASSERT_EQ(g1.size(), 8u);
  for (const auto& [step, g] : g1) EXPECT_NEAR(g2.at(step), g, 1e-4 * g) << "grad norm, step " << step;

  auto c1 = train::load_checkpoint(one), c2 = train::load_checkpoint(two);
  ASSERT_EQ(c1.model.size(), c2.model.size());
  for (const auto& [name, t] : c1.model) {
    ASSERT_TRUE(c2.model.count(name)) << name;
    EXPECT_LT(max_rel_diff(c2.model.at(name), t), 1e-4) << name;
  }
  // The checkpoint holds every Muon matrix's momentum, gathered from the owners.
  int momenta = 0;
  for (const auto& [name, t] : c1.optimizer) {
    if (name.rfind("muon.momentum/", 0) != 0) continue;
    ++momenta;
    ASSERT_TRUE(c2.optimizer.count(name)) << name;
    EXPECT_LT(max_rel_diff(c2.optimizer.at(name), t), 1e-3) << name;
  }
  EXPECT_GT(momenta, 4);
}

// With DSA the indexers' gradient norm is reduced and clipped apart from the LM's (trainer.h), the same with two
// workers as with one. Only the norms and losses are compared: at this toy initialisation the x0/resid lambdas'
// gradients are a few 1e-10, near AdamW's ε = 1e-10, where the update turns float summation noise (larger with
// DSA) into weight differences above the other test's 1e-4.
TEST_F(DataParallelCli, TwoGlooProcessesNormTheDsaIndexersApartAsOneProcess) {
  auto j = micro_hybrid_json();
  j["attention"]["dsa_enabled"] = true;
  j["attention"]["dsa_local_window"] = 4;
  j["attention"]["dsa_indexer_heads"] = 2;
  j["attention"]["dsa_indexer_dim"] = 4;
  recipe = write_recipe(dir, j);
  const std::string one = dir + "/one", two = dir + "/two";
  auto r1 = run_slm(args(one));
  ASSERT_EQ(r1.code, 0) << r1.out;
  auto r2 = run_slm(args(two, "--nproc 2 --bucket-elements 3000"));
  ASSERT_EQ(r2.code, 0) << r2.out;
  for (const char* key : {"loss", "grad_norm", "indexer_grad_norm"}) {
    std::map<int64_t, double> v1, v2;
    for (const auto& m : read_metrics(one))
      if (m.contains(key)) v1[m["step"]] = m[key];
    for (const auto& m : read_metrics(two))
      if (m.contains(key)) v2[m["step"]] = m[key];
    ASSERT_EQ(v1.size(), 8u) << key;
    for (const auto& [step, v] : v1) {
      EXPECT_GT(v, 0) << key << ", step " << step;
      EXPECT_NEAR(v2.at(step), v, 1e-4 * v) << key << ", step " << step;
    }
  }
}

// With --accum the first micro-batches accumulate in .grad on each worker and only the last backward communicates
// (the bucket takes .grad after autograd added the last micro-batch to it).
TEST_F(DataParallelCli, AccumulatedMicroBatchesMatchOneProcess) {
  const std::string one = dir + "/one", two = dir + "/two";
  auto r1 = run_slm(args(one, "--accum 2"));
  ASSERT_EQ(r1.code, 0) << r1.out;
  auto r2 = run_slm(args(two, "--accum 2 --nproc 2 --bucket-elements 3000"));
  ASSERT_EQ(r2.code, 0) << r2.out;
  auto l1 = train_losses(one), l2 = train_losses(two);
  ASSERT_EQ(l1.size(), 8u);
  ASSERT_EQ(l2.size(), 8u);
  for (const auto& [step, loss] : l1) EXPECT_NEAR(l2.at(step), loss, 1e-4 * std::abs(loss)) << "step " << step;
  auto c1 = train::load_checkpoint(one), c2 = train::load_checkpoint(two);
  for (const auto& [name, t] : c1.model) {
    const bool lambdas = name.find("lambdas") != std::string::npos;  // see ExpertParallelCli
    EXPECT_LT(max_rel_diff(c2.model.at(name), t), lambdas ? 1e-3 : 1e-4) << name;
  }
}

TEST_F(DataParallelCli, AGlobalBatchThatDoesNotSplitIsRefusedByEveryWorker) {
  auto r = run_slm("train --recipe " + recipe + " --data " + data + " --out " + dir +
                   "/odd --steps 2 --batch 3 --seq-len 24 --threads 1 --tokenizer none --nproc 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("must divide by the 2 workers"), std::string::npos) << r.out;
}

// Expert parallelism: the MoE layer's 4 routed experts spread over groups of 2 workers (all-to-all dispatch, expert
// gradients summed over the replica groups, Muon on each rank's own experts) train the same model as one process.
struct ExpertParallelCli : DataParallelCli {
  // DataParallelCli's run with a checkpoint at step 4 too, to resume from.
  std::string ep_args(const std::string& out, const std::string& extra = "") {
    return "train --recipe " + recipe + " --data " + data + " --out " + out +
           " --steps 8 --batch 4 --seq-len 24 --seed 7 --warmup 2 --eval-every 0 --checkpoint-every 4 --threads 1"
           " --optim ns_dtype=float32 --tokenizer none " +
           extra;
  }
  // The weights and the Muon momentum (whole expert tensors in every checkpoint) against one process's.
  static void expect_same_state(const std::string& run, const std::string& reference, double tol) {
    auto c = train::load_checkpoint(run), r = train::load_checkpoint(reference);
    ASSERT_EQ(c.model.size(), r.model.size());
    int experts = 0;
    for (const auto& [name, t] : r.model) {
      ASSERT_TRUE(c.model.count(name)) << name;
      ASSERT_EQ(c.model.at(name).sizes(), t.sizes()) << name;
      // The x0/resid lambdas' gradients are near AdamW's eps at this initialisation (see the DSA test above), where
      // float summation order shows in the update; every other tensor meets tol.
      const bool lambdas = name.find("lambdas") != std::string::npos;
      EXPECT_LT(max_rel_diff(c.model.at(name), t), lambdas ? 10 * tol : tol) << name << " in " << run;
      experts += name.find(".moe.experts.") != std::string::npos;
    }
    EXPECT_EQ(experts, 2) << "w13 and w2 of the one MoE layer";
    for (const auto& [name, t] : r.optimizer) {
      if (name.rfind("muon.momentum/", 0) != 0) continue;
      ASSERT_TRUE(c.optimizer.count(name)) << name;
      ASSERT_EQ(c.optimizer.at(name).sizes(), t.sizes()) << name;
      EXPECT_LT(max_rel_diff(c.optimizer.at(name), t), 10 * tol) << name << " in " << run;
    }
  }
  static void expect_same_metrics(const std::string& run, const std::string& reference) {
    for (const char* key : {"loss", "grad_norm"}) {
      std::map<int64_t, double> v, r;
      for (const auto& m : read_metrics(run))
        if (m.contains(key)) v[m["step"]] = m[key];
      for (const auto& m : read_metrics(reference))
        if (m.contains(key)) r[m["step"]] = m[key];
      ASSERT_EQ(r.size(), 8u) << key;
      ASSERT_EQ(v.size(), 8u) << key;
      for (const auto& [step, x] : r) EXPECT_NEAR(v.at(step), x, 1e-4 * std::abs(x)) << key << ", step " << step;
    }
  }
  // A copy of run whose latest checkpoint is the one at `step` (later ones removed), to resume from there. POSIX
  // calls rather than std::filesystem (util/files.h says why).
  std::string rewound_copy(const std::string& run, int64_t step, const std::string& to) {
    EXPECT_EQ(std::system(("cp -r '" + run + "' '" + to + "'").c_str()), 0);
    std::string keep;
    DIR* d = ::opendir(to.c_str());
    EXPECT_NE(d, nullptr) << to;
    while (dirent* e = d ? ::readdir(d) : nullptr) {
      const std::string name = e->d_name, meta = to + "/" + name + "/meta.json";
      if (name == "." || name == ".." || ::access(meta.c_str(), F_OK) != 0) continue;
      if (nlohmann::json::parse(read_file(meta)).at("step").get<int64_t>() == step)
        keep = name;
      else
        remove_tree(to + "/" + name);
    }
    if (d) ::closedir(d);
    EXPECT_FALSE(keep.empty()) << "no checkpoint at step " << step << " in " << run;
    write_file(to + "/latest", keep + "\n");
    return to;
  }
};

TEST_F(ExpertParallelCli, TwoAndFourGlooProcessesMatchOneProcessAndResumeAcrossLayouts) {
  const std::string one = dir + "/one", ep2 = dir + "/ep2", ep2x2 = dir + "/ep2x2";
  auto r1 = run_slm(ep_args(one));
  ASSERT_EQ(r1.code, 0) << r1.out;
  auto r2 = run_slm(ep_args(ep2, "--nproc 2 --expert-parallel 2 --bucket-elements 3000"));
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_NE(r2.out.find("routed experts spread over groups of 2"), std::string::npos) << r2.out;
  expect_same_metrics(ep2, one);
  expect_same_state(ep2, one, 1e-4);
  EXPECT_LT(train_losses(one).at(8), train_losses(one).at(1));  // it trained

  // Two expert groups of two: each expert on two ranks, its gradient summed over that replica pair.
  auto r4 = run_slm(ep_args(ep2x2, "--nproc 4 --expert-parallel 2"));
  ASSERT_EQ(r4.code, 0) << r4.out;
  expect_same_metrics(ep2x2, one);
  expect_same_state(ep2x2, one, 1e-4);

  // A checkpoint written with the experts spread resumes in one process, and one process's resumes spread.
  const std::string a = rewound_copy(ep2, 4, dir + "/ep2-then-one");
  auto ra = run_slm("train --resume " + a + " --threads 1 --expert-parallel 1");
  ASSERT_EQ(ra.code, 0) << ra.out;
  expect_same_state(a, one, 1e-4);
  const std::string b = rewound_copy(one, 4, dir + "/one-then-ep2");
  auto rb = run_slm("train --resume " + b + " --threads 1 --nproc 2 --expert-parallel 2");
  ASSERT_EQ(rb.code, 0) << rb.out;
  expect_same_state(b, one, 1e-4);
}

TEST_F(ExpertParallelCli, LayoutsThatDoNotSplitAreRefused) {
  auto run = [&](const std::string& name, const std::string& extra) {
    return run_slm("train --recipe " + recipe + " --data " + data + " --out " + dir + "/" + name +
                   " --steps 2 --batch 4 --seq-len 24 --threads 1 --tokenizer none " + extra);
  };
  auto r = run("one", "--expert-parallel 2");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("must divide the 1 worker(s)"), std::string::npos) << r.out;
  r = run("three", "--nproc 4 --expert-parallel 3");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--expert-parallel 3"), std::string::npos) << r.out;
  auto j = micro_hybrid_json();
  j["pattern"] = "AFMR";
  j["mlp"] = {{"hidden", 16}};
  j.erase("moe");
  recipe = write_recipe(dir, j);
  r = run("dense", "--nproc 2 --expert-parallel 2");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("has no MoE layers"), std::string::npos) << r.out;
}

void expect_env_error(std::initializer_list<std::string> fragments) {
  try {
    train::DistEnv::from_environment();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

struct EnvGuard {
  explicit EnvGuard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      names.push_back(k);
      if (v)
        ::setenv(k, v, 1);
      else
        ::unsetenv(k);
    }
  }
  ~EnvGuard() {
    for (const auto& k : names) ::unsetenv(k.c_str());
  }
  std::vector<std::string> names;
};

TEST(DistEnv, ReadsTheLauncherVariables) {
  {
    EnvGuard g({{"WORLD_SIZE", nullptr}, {"RANK", nullptr}});
    auto e = train::DistEnv::from_environment();
    EXPECT_EQ(e.world_size, 1);
    EXPECT_EQ(e.rank, 0);
  }
  {
    EnvGuard g({{"WORLD_SIZE", "4"},
                {"RANK", "3"},
                {"LOCAL_RANK", "1"},
                {"MASTER_ADDR", "10.0.0.2"},
                {"MASTER_PORT", "1234"}});
    auto e = train::DistEnv::from_environment();
    EXPECT_EQ(e.world_size, 4);
    EXPECT_EQ(e.rank, 3);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_EQ(e.master_addr, "10.0.0.2");
    EXPECT_EQ(e.master_port, 1234);
  }
  {
    EnvGuard g({{"WORLD_SIZE", "2"}, {"RANK", "2"}});
    expect_env_error({"RANK=2", "WORLD_SIZE=2"});
  }
  {
    EnvGuard g({{"WORLD_SIZE", "two"}});
    expect_env_error({"WORLD_SIZE=two"});
  }
  {
    EnvGuard g({{"WORLD_SIZE", "2"}, {"RANK", nullptr}});
    expect_env_error({"RANK"});
  }
}

}  // namespace
}  // namespace slm::test
