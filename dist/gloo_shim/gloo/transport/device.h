#pragma once
// rlmesh shim: see learner/gloo_shim/README.md. Only handled by pointer.
namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
