#pragma once
// Data-parallel training over c10d (docs/training.md, "Several GPUs"): one process per device, a TCPStore
// rendezvous, ProcessGroupNCCL on GPUs and ProcessGroupGloo on CPUs (so the CPU tests run several processes).
//
// Every rank reads the same global micro-batch from its own loader (same seed, same cursor: checkpoints stay
// rank-independent) and trains on its 1/world slice. Gradients travel in buckets of whole parameters, walked in
// reverse parameter order (roughly the order backward produces them), launched from gradient hooks as soon as a
// bucket is complete, strictly in bucket order so that every rank issues the same collectives in the same order:
//   AdamW parameters   all-reduce (every rank updates them identically)
//   Muon matrices      reduce-scatter to their owner rank (whole matrices; owners balanced within each bucket),
//                      the owner orthogonalises, then all-gather of the updated matrices (distributed Muon,
//                      notes §6.5 A). Momentum stays with the owner and is gathered only for checkpoints.
// MoE expert loads are summed over ranks before the balancing-bias update, so the bias moves as for one process
// on the whole batch.
//
// Expert parallelism E (a divisor of the world size): ranks [E g, E g + E) form expert group g, and rank E g + q
// holds experts [q L, (q + 1) L) of every MoE layer (L = routed experts / E); tokens reach their experts by
// all-to-all inside the group (model::parallel_experts). The ranks holding the same experts (q, q + E, ...) form a
// replica group over which those experts' gradients are summed after the backward; every rank then runs Muon on
// its own experts' matrices (no gather), their momentum stays with them, and checkpoints hold the whole stacked
// tensors (gather_experts), so a run resumes under any E and world size.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "slm/model/layers/moe.h"
#include "slm/train/optimizer.h"

namespace slm::train {

// The launcher's environment (torchrun's names): RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct DistEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // World size 1 when WORLD_SIZE is unset; slm::Error naming the variable when a value is malformed.
  static DistEnv from_environment();
};

class DataParallel {
 public:
  // Joins the rendezvous (rank 0 hosts the TCPStore) and creates the process groups for device (NCCL for cuda,
  // gloo for cpu): the world, and with expert_parallel > 1 this rank's expert group and replica group.
  DataParallel(const DistEnv& env, torch::Device device, int expert_parallel = 1);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // For HybridLM::spread_experts; null without expert parallelism.
  std::shared_ptr<model::ExpertGroup> expert_group() const;
  int expert_parallel() const { return expert_parallel_; }
  // Gradient buckets and hooks over the optimizer's parameters (after spread_experts: the routed expert tensors are
  // this rank's share, reduced over the replica group instead). bucket_elements bounds one bucket (float32).
  void attach(Optimizer& optimizer, int64_t bucket_elements = int64_t{1} << 23);

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  // rank, world size and the Muon owners for Optimizer::step.
  const MuonShard& shard() const { return shard_; }

  // Copies rank 0's tensors to every rank.
  void broadcast(const std::vector<torch::Tensor>& tensors);
  // Copies the replica group's first rank's tensors (expert shares) to the other ranks holding the same experts.
  void broadcast_replicas(const std::vector<torch::Tensor>& tensors);
  // The whole stacked tensor [E L, ...] from the expert group's shares [L, ...] (every rank of the group calls it,
  // in the same order; all receive it), for checkpoints.
  torch::Tensor gather_experts(const torch::Tensor& share);
  // Arms the gradient hooks: the next backward launches the reductions (call before the last micro-batch's
  // backward; earlier micro-batches accumulate locally).
  void arm();
  struct Reduced {
    double loss;             // mean of the ranks' losses
    double grad_sq;          // squared norm of the averaged gradients, `apart` excluded
    double indexer_grad_sq;  // the same over `apart`
  };
  // After the backward: launches what is left, waits, and leaves the averaged gradient in .grad of every AdamW
  // parameter, of the Muon matrices this rank owns and of its experts (parameters no rank had a gradient for stay
  // undefined).
  // apart: AdamW parameters normed on their own (the DSA indexers, which trainer.h clips apart from the LM).
  Reduced finish(double local_loss, const std::vector<torch::Tensor>& apart = {});
  // After Optimizer::step(m, shard()): every rank receives the Muon matrices the others updated.
  void gather_muon_weights();
  // Before a checkpoint: every rank receives the owners' Muon momentum.
  void gather_muon_momentum();
  // In place: sum over ranks (MoE expert loads, int64).
  void all_reduce_sum(torch::Tensor& t);
  // True on every rank when it is true on any (stop requests, time limits).
  bool any(bool flag);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_ = 1, expert_parallel_ = 1;
  MuonShard shard_;
};

}  // namespace slm::train
