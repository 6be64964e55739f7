#pragma once

// Autocast (mixed precision) state of one device type on the calling thread,
// captured and re-applied. LibTorch keeps it per thread, so a backward pass
// that recomputes a forward (activation checkpointing, ZeRO-3's units) runs
// outside the scope its forward ran in: the forward captures the state and
// the recomputation applies it again, so both compute in the same dtypes.

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace rlmesh::actor {

struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;

  static AutocastState Current(c10::DeviceType device_type) {
    return {at::autocast::is_autocast_enabled(device_type), at::autocast::get_autocast_dtype(device_type)};
  }
  // As one integer, for an autograd node's saved data, and back.
  int64_t Encode() const { return static_cast<int64_t>(dtype) * 2 + (enabled ? 1 : 0); }
  static AutocastState Decode(int64_t v) { return {(v & 1) != 0, static_cast<at::ScalarType>(v >> 1)}; }
};

// Sets `state` for `device_type` on this thread and restores the previous
// state on exit. A scope that enables autocast also counts as a nesting
// level: leaving the outermost one clears autocast's cast cache. A disabled
// `state` inside no enabled scope changes nothing.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device_type, AutocastState state)
      : device_type_(device_type), prev_(AutocastState::Current(device_type)), nested_(state.enabled) {
    at::autocast::set_autocast_enabled(device_type_, state.enabled);
    at::autocast::set_autocast_dtype(device_type_, state.dtype);
    if (nested_) at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, prev_.enabled);
    at::autocast::set_autocast_dtype(device_type_, prev_.dtype);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  const c10::DeviceType device_type_;
  const AutocastState prev_;
  const bool nested_;
};

}  // namespace rlmesh::actor
