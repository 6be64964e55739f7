#include "actor/rope.h"

#include <algorithm>
#include <cmath>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/where.h>

namespace rlmesh::actor {
namespace {

// exponent[i] = (2i) / dim in fp32: torch.arange(0, dim, 2, int64).float() / dim.
at::Tensor Exponents(int64_t dim) {
  return at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
}

// Python's `scalar / tensor` is tensor.reciprocal() * scalar (two roundings);
// LibTorch's C++ operator divides once. Spelled out to get Python's bits.
at::Tensor RDiv(double scalar, const at::Tensor& t) { return t.reciprocal() * scalar; }

// 1 / base^(2i/dim), base a double (a Python float in transformers).
at::Tensor DefaultInvFreq(double base, int64_t dim) { return RDiv(1.0, at::pow(base, Exponents(dim))); }

// transformers' _compute_dynamic_ntk_parameters as run from the forward pass:
// seq_len arrives as a tensor, so the new base is computed in fp32.
at::Tensor DynamicInvFreq(const ModelConfig& c, int64_t seq_len) {
  const int64_t dim = c.HeadDim();
  const double factor = c.rope.factor;
  auto seq = at::scalar_tensor(std::max(seq_len, c.max_positions), at::kLong);
  auto base = c.rope_theta * at::pow((seq * factor / static_cast<double>(c.max_positions)) - (factor - 1),
                                     static_cast<double>(dim) / static_cast<double>(dim - 2));
  return RDiv(1.0, at::pow(base, Exponents(dim)));
}

at::Tensor Llama3InvFreq(const ModelConfig& c) {
  const int64_t dim = c.HeadDim();
  const RopeScaling& r = c.rope;
  auto inv = DefaultInvFreq(c.rope_theta, dim);
  const double old_context =
      static_cast<double>(r.original_max_positions > 0 ? r.original_max_positions : c.max_positions);
  const double low_wavelen = old_context / r.low_freq_factor;
  const double high_wavelen = old_context / r.high_freq_factor;
  auto wavelen = RDiv(2 * M_PI, inv);
  auto scaled = at::where(wavelen > low_wavelen, inv / r.factor, inv);
  auto smooth = (RDiv(old_context, wavelen) - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  auto medium = (wavelen < high_wavelen).logical_not().logical_and((wavelen > low_wavelen).logical_not());
  return at::where(medium, smoothed, scaled);
}

double YarnMscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

RopeFrequencies Yarn(const ModelConfig& c) {
  const int64_t dim = c.HeadDim();
  const RopeScaling& r = c.rope;
  const double base = c.rope_theta;
  const double factor = r.factor;
  const double orig = static_cast<double>(r.original_max_positions > 0 ? r.original_max_positions : c.max_positions);
  double attention = r.attention_factor;
  if (attention <= 0) {
    attention = (r.mscale != 0 && r.mscale_all_dim != 0) ? YarnMscale(factor, r.mscale) / YarnMscale(factor, r.mscale_all_dim)
                                                          : YarnMscale(factor, 1.0);
  }
  // The dimension that turns `rotations` times over the original context.
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no zero-width ramp
  auto pos_freqs = at::pow(base, Exponents(dim));
  auto extrapolation = RDiv(1.0, pos_freqs);
  auto interpolation = RDiv(1.0, factor * pos_freqs);
  auto ramp = at::clamp((at::arange(dim / 2, at::kFloat) - low) / (high - low), 0, 1);
  auto extrapolation_weight = 1 - ramp;
  return {interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight, attention};
}

}  // namespace

RopeFrequencies ComputeRope(const ModelConfig& config, int64_t seq_len) {
  const std::string& type = config.rope.type;
  if (type == "linear") {
    auto inv = DefaultInvFreq(config.rope_theta, config.HeadDim());
    inv /= config.rope.factor;
    return {inv, 1.0};
  }
  if (type == "dynamic" && seq_len > config.max_positions) return {DynamicInvFreq(config, seq_len), 1.0};
  if (type == "llama3") return {Llama3InvFreq(config), 1.0};
  if (type == "yarn") return Yarn(config);
  return {DefaultInvFreq(config.rope_theta, config.HeadDim()), 1.0};
}

}  // namespace rlmesh::actor
