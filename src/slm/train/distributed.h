#pragma once
// Data-parallel training over c10d (docs/training.md, "Several GPUs"): one process per device, a TCPStore
// rendezvous, ProcessGroupNCCL on GPUs and ProcessGroupGloo on CPUs (so the CPU tests run two processes).
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
// on the whole batch. Expert parallelism would add an all-to-all around MoEImpl's dispatch; not done.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

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
  // Joins the rendezvous (rank 0 hosts the TCPStore) and creates the backend for device (NCCL for cuda, gloo for
  // cpu). bucket_elements bounds one bucket (float32 elements).
  DataParallel(const DistEnv& env, torch::Device device, Optimizer& optimizer,
               int64_t bucket_elements = int64_t{1} << 23);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  // rank, world size and the Muon owners for Optimizer::step.
  const MuonShard& shard() const { return shard_; }

  // Copies rank 0's parameters and the given buffers to every rank.
  void broadcast(const std::vector<torch::Tensor>& tensors);
  // Arms the gradient hooks: the next backward launches the reductions (call before the last micro-batch's
  // backward; earlier micro-batches accumulate locally).
  void arm();
  struct Reduced {
    double loss;     // mean of the ranks' losses
    double grad_sq;  // squared norm of the averaged gradients, `apart` excluded
    double indexer_grad_sq;  // the same over `apart`
  };
  // After the backward: launches what is left, waits, and leaves the averaged gradient in .grad of every AdamW
  // parameter and of the Muon matrices this rank owns (parameters no rank had a gradient for stay undefined).
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
  int rank_ = 0, world_ = 1;
  MuonShard shard_;
};

}  // namespace slm::train
