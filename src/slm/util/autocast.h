#pragma once
// The one way autocast is switched: a scope. Autocast is thread-local state (PyTorch's torch.autocast context
// manager is the same idea); the trainer and evaluation turn BF16 on around a forward, the hand-written scans turn it
// off around kernels with their own FP32 backward, and activation checkpointing replays the forward's state on
// autograd's thread. Each leaves the state as it found it however its scope ends, an exception included.
#include <ATen/autocast_mode.h>

namespace slm {

class AutocastScope {
 public:
  // Autocast on `device` on in `dtype`, or off (dtype and cache untouched). cache = false: no weight-cast cache inside,
  // for a CUDA graph capture whose replays would otherwise read the capture's casts as stale copies.
  AutocastScope(c10::DeviceType device, bool enabled, at::ScalarType dtype = at::kBFloat16, bool cache = true)
      : device_(device),
        enabled_(enabled),
        cache_(cache),
        was_enabled_(at::autocast::is_autocast_enabled(device)),
        was_cache_(at::autocast::is_autocast_cache_enabled()),
        was_dtype_(at::autocast::get_autocast_dtype(device)) {
    if (enabled) {
      at::autocast::set_autocast_dtype(device, dtype);
      at::autocast::set_autocast_cache_enabled(cache);
    }
    at::autocast::set_autocast_enabled(device, enabled);
  }
  ~AutocastScope() {
    // The casts of the weights made inside belong to this scope's forward (their weights change at the next step).
    if (enabled_ && cache_) at::autocast::clear_cache();
    at::autocast::set_autocast_cache_enabled(was_cache_);
    at::autocast::set_autocast_enabled(device_, was_enabled_);
    at::autocast::set_autocast_dtype(device_, was_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool enabled_, cache_, was_enabled_, was_cache_;
  at::ScalarType was_dtype_;
};

}  // namespace slm
