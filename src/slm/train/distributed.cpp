#include "slm/train/distributed.h"

// libtorch is built with gloo (and NCCL in its CUDA builds), but its headers declare those classes only under
// these macros; gloo's own headers come from Debian's libgloo-dev (only pointers to gloo types cross the API).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef SLM_WITH_CUDA
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "slm/train/muon.h"
#include "slm/util/error.h"

namespace slm::train {

namespace {

int env_int(const char* name, int fallback, int min_value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < min_value || x > (1 << 30))
    throw Error(std::string("environment variable ") + name + "=" + v +
                ": expected an integer >= " + std::to_string(min_value));
  return static_cast<int>(x);
}

// A bucket: whole parameters of one algorithm, contiguous in reverse parameter order.
struct Bucket {
  bool muon = false;
  std::vector<size_t> params;   // optimizer parameter indices
  std::vector<int64_t> offset;  // AdamW: offset of params[i] in flat
  struct Matrix {
    size_t param;
    int64_t index, numel;
    int owner;
    int64_t offset;  // within the owner's chunk
  };
  std::vector<Matrix> matrices;  // Muon
  int64_t elements = 0;          // AdamW: flat's size; Muon: one rank's chunk (flat holds world chunks)
  torch::Tensor flat, chunk;
  size_t pending = 0;
  c10::intrusive_ptr<c10d::Work> work;
};

torch::Tensor matrix_view(const torch::Tensor& t, int64_t index, int64_t numel) {
  return t.reshape({-1, numel})[index];
}

// The expert group as model::parallel_experts sees it: all-to-all over one c10d group.
class C10dExpertGroup : public model::ExpertGroup {
 public:
  C10dExpertGroup(c10::intrusive_ptr<c10d::Backend> pg, int rank, int size)
      : pg_(std::move(pg)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  torch::Tensor exchange(const torch::Tensor& x, const std::vector<int64_t>& send_rows,
                         const std::vector<int64_t>& recv_rows) override {
    at::Tensor in = x.contiguous();
    std::vector<int64_t> shape = in.sizes().vec();
    shape[0] = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
    at::Tensor out = torch::empty(shape, in.options());
    std::vector<int64_t> send = send_rows, recv = recv_rows;  // c10d takes them by non-const reference
    pg_->alltoall_base(out, in, recv, send)->wait();
    return out;
  }

 private:
  c10::intrusive_ptr<c10d::Backend> pg_;
  int rank_, size_;
};

}  // namespace

DistEnv DistEnv::from_environment() {
  DistEnv e;
  e.world_size = env_int("WORLD_SIZE", 1, 1);
  if (e.world_size == 1) return e;
  if (std::getenv("RANK") == nullptr)
    throw Error("WORLD_SIZE is set but RANK is not (launch with slm train --nproc N)");
  e.rank = env_int("RANK", 0, 0);
  if (e.rank >= e.world_size)
    throw Error("RANK=" + std::to_string(e.rank) + " is not below WORLD_SIZE=" + std::to_string(e.world_size));
  e.local_rank = env_int("LOCAL_RANK", e.rank, 0);
  if (const char* a = std::getenv("MASTER_ADDR"); a != nullptr && *a != '\0') e.master_addr = a;
  e.master_port = env_int("MASTER_PORT", 29500, 1);
  return e;
}

struct DataParallel::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  // Expert parallelism: this rank's expert group and replica group (null when that group would be one rank).
  c10::intrusive_ptr<c10d::Backend> experts_pg, replicas_pg;
  std::shared_ptr<C10dExpertGroup> expert_group;
  std::vector<size_t> spread;  // optimizer indices of the routed expert tensors, when spread
  std::vector<char> is_spread;
  Optimizer* opt = nullptr;
  torch::Device device{torch::kCPU};
  int rank = 0, world = 1;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // per parameter
  std::vector<char> got;          // per parameter: its gradient arrived in this backward
  size_t next_launch = 0;
  bool armed = false;
  std::mutex mu;

  // The gradient of parameter i (what every micro-batch accumulated in .grad) into its bucket's send buffer.
  void pack(size_t i) {
    const torch::Tensor& p = opt->param(i);
    const torch::Tensor& value = p.grad();
    Bucket& b = buckets[bucket_of[i]];
    if (!b.muon) {
      const auto k = static_cast<size_t>(std::find(b.params.begin(), b.params.end(), i) - b.params.begin());
      auto dst = b.flat.narrow(0, b.offset[k], p.numel());
      if (value.defined())
        dst.copy_(value.reshape({-1}));
      else
        dst.zero_();
      return;
    }
    for (const auto& m : b.matrices) {
      if (m.param != i) continue;
      auto dst = b.flat.narrow(0, m.owner * b.elements + m.offset, m.numel);
      if (value.defined())
        dst.copy_(matrix_view(value, m.index, m.numel));
      else
        dst.zero_();
    }
  }

  void launch(Bucket& b) {
    if (b.muon) {
      b.work = pg->_reduce_scatter_base(b.chunk, b.flat);
    } else {
      std::vector<at::Tensor> v{b.flat};
      b.work = pg->allreduce(v);
    }
  }

  // Buckets go out strictly in order, so every rank issues the same sequence of collectives.
  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(buckets[next_launch++]);
  }

  // After autograd accumulated parameter i's gradient of the armed backward into .grad.
  void on_grad(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed || got[i]) return;
    torch::NoGradGuard no_grad;
    pack(i);
    // The bucket holds it now: dropping .grad keeps a second copy of every gradient out of the backward's peak
    // memory (finish() gives back the averaged gradients, as views of the buckets).
    opt->param(i).mutable_grad() = torch::Tensor();
    got[i] = 1;
    --buckets[bucket_of[i]].pending;
    launch_ready();
  }

  void gather(const std::function<torch::Tensor(size_t)>& source) {
    torch::NoGradGuard no_grad;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& b : buckets) {
      if (!b.muon) continue;
      for (const auto& m : b.matrices)
        if (m.owner == rank) b.chunk.narrow(0, m.offset, m.numel).copy_(matrix_view(source(m.param), m.index, m.numel));
      works.push_back(pg->_allgather_base(b.flat, b.chunk));
    }
    size_t w = 0;
    for (auto& b : buckets) {
      if (!b.muon) continue;
      works[w++]->wait();
      for (const auto& m : b.matrices)
        if (m.owner != rank)
          source(m.param).reshape({-1, m.numel})[m.index].copy_(
              b.flat.narrow(0, m.owner * b.elements + m.offset, m.numel));
    }
  }
};

namespace {
// Runs after autograd accumulated a parameter's gradient (so .grad holds every micro-batch's sum).
struct Packer : torch::autograd::PostAccumulateGradHook {
  Packer(DataParallel::Impl* impl, size_t i) : impl(impl), i(i) {}
  void operator()(const torch::autograd::Variable&) override { impl->on_grad(i); }
  DataParallel::Impl* impl;
  size_t i;
};
}  // namespace

DataParallel::DataParallel(const DistEnv& env, torch::Device device, int expert_parallel)
    : impl_(std::make_unique<Impl>()), rank_(env.rank), world_(env.world_size), expert_parallel_(expert_parallel) {
  if (world_ < 2) throw Error("data-parallel training needs WORLD_SIZE >= 2");
  if (expert_parallel < 1 || world_ % expert_parallel != 0)
    throw Error("--expert-parallel " + std::to_string(expert_parallel) + " must divide the " + std::to_string(world_) +
                " workers");
  auto& s = *impl_;
  s.device = device;
  s.rank = rank_;
  s.world = world_;

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  so.isServer = rank_ == 0;
  so.numWorkers = world_;
  so.waitWorkers = true;
  so.timeout = std::chrono::seconds(300);
  try {
    s.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    // A process group over `size` ranks of the store's namespace `prefix` ("" for the world), as `rank` of them.
    auto make_group = [&](const std::string& prefix, int rank, int size) -> c10::intrusive_ptr<c10d::Backend> {
      c10::intrusive_ptr<c10d::Store> store = s.store;
      if (!prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(prefix, s.store);
      if (device.is_cuda()) {
#ifdef SLM_WITH_CUDA
        return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size,
                                                           c10d::ProcessGroupNCCL::Options::create());
#else
        throw Error("this build has no CUDA (configure with SLM_CUDA=ON for NCCL)");
#endif
      }
      auto opts = c10d::ProcessGroupGloo::Options::create();
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      const bool local = env.master_addr == "127.0.0.1" || env.master_addr == "localhost";
      opts->devices.push_back(ifname != nullptr && *ifname != '\0'
                                  ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                              : local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                      : c10d::ProcessGroupGloo::createDefaultDevice());
      return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
    };
    s.pg = make_group("", rank_, world_);
    if (expert_parallel > 1) {
      const int q = rank_ % expert_parallel, g = rank_ / expert_parallel, replicas = world_ / expert_parallel;
      s.experts_pg = make_group("experts/" + std::to_string(g) + "/", q, expert_parallel);
      if (replicas > 1) s.replicas_pg = make_group("replicas/" + std::to_string(q) + "/", g, replicas);
      s.expert_group = std::make_shared<C10dExpertGroup>(s.experts_pg, q, expert_parallel);
    }
  } catch (const c10::Error& e) {
    throw Error("rendezvous at " + env.master_addr + ":" + std::to_string(env.master_port) + " as rank " +
                std::to_string(rank_) + " of " + std::to_string(world_) + " failed: " + e.what_without_backtrace());
  }
}

std::shared_ptr<model::ExpertGroup> DataParallel::expert_group() const {
  return impl_->expert_group;
}

void DataParallel::attach(Optimizer& optimizer, int64_t bucket_elements) {
  auto& s = *impl_;
  if (s.opt != nullptr) throw Error("DataParallel::attach: attached already");
  s.opt = &optimizer;
  const torch::Device device = s.device;
  const size_t n = optimizer.num_params();
  s.is_spread.assign(n, 0);
  if (s.expert_group)
    for (size_t i = 0; i < n; ++i)
      if (model::is_routed_expert(optimizer.param_name(i))) {
        s.spread.push_back(i);
        s.is_spread[i] = 1;
      }

  // Buckets: walk the parameters backwards in segments of about bucket_elements; each segment gives one Muon and
  // one AdamW bucket, so no bucket waits for gradients from far away in the backward.
  std::map<size_t, size_t> first_matrix;  // parameter -> index of its first matrix in muon_matrices()
  const auto& mats = optimizer.muon_matrices();
  for (size_t k = mats.size(); k-- > 0;) first_matrix[mats[k].param] = k;
  shard_.rank = rank_;
  shard_.world_size = world_;
  shard_.owners.assign(mats.size(), 0);
  s.bucket_of.assign(n, 0);
  std::vector<size_t> seg_muon, seg_adam;
  int64_t seg_elements = 0;
  auto close_segment = [&] {
    if (!seg_muon.empty()) {
      Bucket b;
      b.muon = true;
      b.params = seg_muon;
      std::vector<MuonMatrix> sub;
      for (size_t i : seg_muon) {
        const size_t f = first_matrix.at(i);
        for (size_t k = f; k < mats.size() && mats[k].param == i; ++k) sub.push_back(mats[k]);
      }
      const auto owners = assign_muon_owners(sub, world_);
      std::vector<int64_t> fill(static_cast<size_t>(world_), 0);
      for (size_t k = 0; k < sub.size(); ++k) {
        const int64_t numel = sub[k].rows * sub[k].cols;
        b.matrices.push_back({sub[k].param, sub[k].index, numel, owners[k], fill[static_cast<size_t>(owners[k])]});
        fill[static_cast<size_t>(owners[k])] += numel;
        shard_.owners[first_matrix.at(sub[k].param) + static_cast<size_t>(sub[k].index)] = owners[k];
      }
      b.elements = std::max<int64_t>(1, *std::max_element(fill.begin(), fill.end()));
      s.buckets.push_back(std::move(b));
    }
    if (!seg_adam.empty()) {
      Bucket b;
      b.params = seg_adam;
      for (size_t i : seg_adam) {
        b.offset.push_back(b.elements);
        b.elements += optimizer.param(i).numel();
      }
      s.buckets.push_back(std::move(b));
    }
    seg_muon.clear();
    seg_adam.clear();
    seg_elements = 0;
  };
  for (size_t k = 0; k < mats.size(); ++k)  // each rank orthogonalises its own experts' matrices
    if (s.is_spread[mats[k].param]) shard_.owners[k] = rank_;
  for (size_t i = n; i-- > 0;) {
    if (s.is_spread[i]) continue;  // reduced over the replica group in finish()
    (optimizer.param_algorithm(i) == Algorithm::Muon ? seg_muon : seg_adam).push_back(i);
    seg_elements += optimizer.param(i).numel();
    if (seg_elements >= bucket_elements) close_segment();
  }
  close_segment();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  for (size_t k = 0; k < s.buckets.size(); ++k) {
    auto& b = s.buckets[k];
    for (size_t i : b.params) s.bucket_of[i] = k;
    b.flat = torch::zeros({b.muon ? b.elements * world_ : b.elements}, f32);
    if (b.muon) b.chunk = torch::zeros({b.elements}, f32);
  }
  s.got.assign(n, 0);
  Impl* self = impl_.get();
  for (size_t i = 0; i < n; ++i)
    if (!s.is_spread[i])
      torch::autograd::impl::set_post_acc_grad_hooks(optimizer.param(i), std::make_unique<Packer>(self, i));
}

DataParallel::~DataParallel() {
  if (!impl_) return;
  if (impl_->opt)
    for (size_t i = 0; i < impl_->opt->num_params(); ++i)
      if (!impl_->is_spread[i]) torch::autograd::impl::set_post_acc_grad_hooks(impl_->opt->param(i), nullptr);
  for (auto* pg : {&impl_->pg, &impl_->experts_pg, &impl_->replicas_pg})
    if (*pg) (*pg)->shutdown();
}

void DataParallel::broadcast(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> staged;  // host-resident tensors (Engram tables) under NCCL
  for (const auto& t : tensors) {
    std::vector<at::Tensor> v{t.device() == impl_->device ? t : t.to(impl_->device)};
    if (!v[0].is_same(t)) staged.emplace_back(t, v[0]);
    works.push_back(impl_->pg->broadcast(v));
  }
  for (auto& w : works) w->wait();
  for (auto& [dst, src] : staged) dst.copy_(src);
}

void DataParallel::broadcast_replicas(const std::vector<torch::Tensor>& tensors) {
  if (!impl_->replicas_pg) return;
  torch::NoGradGuard no_grad;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (const auto& t : tensors) {
    std::vector<at::Tensor> v{t};
    works.push_back(impl_->replicas_pg->broadcast(v));
  }
  for (auto& w : works) w->wait();
}

torch::Tensor DataParallel::gather_experts(const torch::Tensor& share) {
  if (!impl_->experts_pg) return share;
  torch::NoGradGuard no_grad;
  at::Tensor in = share.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] *= expert_parallel_;
  at::Tensor out = torch::empty(shape, in.options());
  impl_->experts_pg->_allgather_base(out, in)->wait();
  return out;
}

void DataParallel::arm() {
  auto& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& b : s.buckets) {
    b.pending = b.params.size();
  }
  std::fill(s.got.begin(), s.got.end(), 0);
  s.next_launch = 0;
  s.armed = true;
}

DataParallel::Reduced DataParallel::finish(double local_loss, const std::vector<torch::Tensor>& apart) {
  auto& s = *impl_;
  torch::NoGradGuard no_grad;
  const size_t n = s.opt->num_params();
  // Which parameters had a gradient here, and the loss: one small all-reduce beside the buckets.
  auto info = torch::zeros({static_cast<int64_t>(n) + 1}, torch::kDouble);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.armed) throw Error("DataParallel::finish without arm()");
    auto a = info.accessor<double, 1>();
    for (size_t i = 0; i < n; ++i) a[static_cast<int64_t>(i)] = (s.got[i] || s.opt->param(i).grad().defined()) ? 1 : 0;
    a[static_cast<int64_t>(n)] = local_loss;
    // Parameters whose hook did not fire (no gradient in this backward) still take part, with what they have.
    for (size_t i = 0; i < n; ++i)
      if (!s.got[i] && !s.is_spread[i]) {
        s.pack(i);
        s.got[i] = 1;
        --s.buckets[s.bucket_of[i]].pending;
      }
    s.launch_ready();
    s.armed = false;
  }
  info = info.to(s.device);
  {
    std::vector<at::Tensor> v{info};
    s.pg->allreduce(v)->wait();
  }
  for (auto& b : s.buckets) b.work->wait();
  info = info.cpu();
  auto a = info.accessor<double, 1>();
  const double inv = 1.0 / world_;

  std::set<const void*> apart_set;
  for (const auto& p : apart) apart_set.insert(p.unsafeGetTensorImpl());
  std::vector<torch::Tensor> shared, shared_apart, owned;  // the averaged gradients, for the norms
  for (auto& b : s.buckets) {
    if (!b.muon) {
      for (size_t k = 0; k < b.params.size(); ++k) {
        const size_t i = b.params[k];
        torch::Tensor p = s.opt->param(i);
        if (a[static_cast<int64_t>(i)] == 0) {
          p.mutable_grad() = torch::Tensor();
          continue;
        }
        // A view of the bucket (no copy), averaged in place once the norms are taken.
        auto g = b.flat.narrow(0, b.offset[k], p.numel());
        (apart_set.count(p.unsafeGetTensorImpl()) ? shared_apart : shared).push_back(g);
        p.mutable_grad() = g.view(p.sizes());
      }
      continue;
    }
    // Only parameters with a matrix this rank owns need a gradient tensor (the optimizer skips the others).
    std::set<size_t> owns;
    for (const auto& m : b.matrices)
      if (m.owner == rank_) owns.insert(m.param);
    for (size_t i : b.params) {
      torch::Tensor p = s.opt->param(i);
      if (a[static_cast<int64_t>(i)] == 0 || !owns.count(i))
        p.mutable_grad() = torch::Tensor();
      else if (!p.grad().defined())
        p.mutable_grad() = torch::zeros_like(p);
    }
    for (const auto& m : b.matrices) {
      if (m.owner != rank_ || a[static_cast<int64_t>(m.param)] == 0) continue;
      auto dst = s.opt->param(m.param).grad().reshape({-1, m.numel})[m.index];
      dst.copy_(b.chunk.narrow(0, m.offset, m.numel)).mul_(inv);
      owned.push_back(b.chunk.narrow(0, m.offset, m.numel));
    }
  }
  // AdamW gradients are the same on every rank: each contributes 1/world of their square. One multi-tensor norm
  // per list (of the sums, hence the inv^2) instead of a few kernels per tensor.
  auto sum_sq = [&](const std::vector<torch::Tensor>& ts) {
    if (ts.empty()) return torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(s.device));
    return torch::stack(at::_foreach_norm(ts)).to(torch::kDouble).pow(2).sum();
  };
  // This rank's experts: the backward's exchanges brought every rank's gradient of them here, so their sum over
  // the replica group is the sum over all ranks. Each expert lives on world/E ranks, hence E/world of its square.
  std::vector<torch::Tensor> experts;
  for (size_t i : s.spread) {
    torch::Tensor p = s.opt->param(i);
    if (a[static_cast<int64_t>(i)] == 0) {  // frozen everywhere (the DSA warm-up)
      p.mutable_grad() = torch::Tensor();
      continue;
    }
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // no token reached these experts
    if (s.replicas_pg) {
      std::vector<at::Tensor> v{p.mutable_grad()};
      s.replicas_pg->allreduce(v)->wait();
    }
    experts.push_back(p.grad());
  }
  auto expert_sq = sum_sq(experts) * (static_cast<double>(expert_parallel_) * inv);
  if (!experts.empty()) at::_foreach_mul_(experts, inv);
  auto sq = at::stack({sum_sq(owned) + sum_sq(shared) * inv + expert_sq, sum_sq(shared_apart) * inv}) * (inv * inv);
  for (auto* list : {&shared, &shared_apart})
    if (!list->empty()) at::_foreach_mul_(*list, inv);
  {
    std::vector<at::Tensor> v{sq};
    s.pg->allreduce(v)->wait();
  }
  sq = sq.cpu();
  return {a[static_cast<int64_t>(n)] * inv, sq[0].item<double>(), sq[1].item<double>()};
}

void DataParallel::gather_muon_weights() {
  impl_->gather([this](size_t i) { return impl_->opt->param(i); });
}

void DataParallel::gather_muon_momentum() {
  impl_->gather([this](size_t i) { return impl_->opt->muon_momentum_buffer(i); });
}

void DataParallel::all_reduce_sum(torch::Tensor& t) {
  std::vector<at::Tensor> v{t};
  impl_->pg->allreduce(v)->wait();
}

bool DataParallel::any(bool flag) {
  auto t = torch::full({1}, flag ? 1.0f : 0.0f, torch::TensorOptions().device(impl_->device));
  all_reduce_sum(t);
  return t.item<float>() > 0;
}

}  // namespace slm::train
