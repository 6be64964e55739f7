#include "learner/moments_layout.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "actor/safetensors.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh::learner {
namespace {

// Split along 0, replicated, split along 1, split along 0: 45 elements, 24
// in each of two TP slices.
const ParameterShapes kShapes = {
    {"model.embed_tokens.weight", {6, 3}},
    {"model.layers.0.input_layernorm.weight", {3}},
    {"model.layers.0.self_attn.o_proj.weight", {3, 4}},
    {"model.layers.0.mlp.up_proj.weight", {4, 3}},
};
const std::vector<int> kSplitDim = {0, -1, 1, 0};

std::vector<at::Tensor> Unflatten(const at::Tensor& flat) {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& [name, shape] : kShapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out.push_back(flat.narrow(0, offset, n).view(shape));
    offset += n;
  }
  return out;
}

// Writes `m` and `v` (whole, flat) as the trainer's ZeRO-1 ranks would under
// world_size `W` and tp `T`: rank d*T + t holds share d of TP slice t.
void WriteRankFiles(const std::string& dir, const at::Tensor& m, const at::Tensor& v, int W, int T) {
  const int D = W / T;
  for (int t = 0; t < T; ++t) {
    auto slice_of = [&](const at::Tensor& whole) {
      std::vector<at::Tensor> parts;
      std::vector<at::Tensor> params = Unflatten(whole);
      for (size_t i = 0; i < params.size(); ++i) {
        const int dim = T > 1 ? kSplitDim[i] : -1;
        parts.push_back(dim < 0 ? params[i].reshape(-1)
                                : params[i].chunk(T, dim)[t].reshape(-1));
      }
      at::Tensor flat = at::cat(parts);
      const int64_t share = (flat.numel() + D - 1) / D;
      return at::cat({flat, at::zeros({share * D - flat.numel()})}).chunk(D);
    };
    auto ms = slice_of(m), vs = slice_of(v);
    for (int d = 0; d < D; ++d) {
      REQUIRE(actor::WriteSafetensors(absl::StrFormat("%s/optimizer-rank-%d.safetensors", dir, d * T + t),
                                      {{"policy.exp_avg", ms[d].clone()}, {"policy.exp_avg_sq", vs[d].clone()}})
                  .ok());
    }
  }
}

TEST_CASE("ReadWholeMoments rebuilds the whole flat layout from every layout the trainer writes") {
  rlmesh::testing::TempDir dir;
  const at::Tensor m = at::arange(45, at::kFloat);
  const at::Tensor v = m * 10 + 0.5;
  SECTION("one file, plain DP's layout") {
    REQUIRE(actor::WriteSafetensors(dir.File("optimizer.safetensors"),
                                    {{"policy.exp_avg", m}, {"policy.exp_avg_sq", v}})
                .ok());
    auto got = ReadWholeMoments(dir.path(), {1, 1, false}, "policy", kShapes);
    REQUIRE(got.ok());
    CHECK(at::equal(got->first, m));
    CHECK(at::equal(got->second, v));
  }
  // (world_size, tp): plain ZeRO-1 over 2 and over 4 (shares padded), TP
  // slices alone and over 5 replicas (24 elements in shares of 5).
  for (auto [W, T] : std::vector<std::pair<int, int>>{{2, 1}, {4, 1}, {2, 2}, {10, 2}}) {
    DYNAMIC_SECTION("ZeRO-1, world_size " << W << ", tp " << T) {
      WriteRankFiles(dir.path(), m, v, W, T);
      auto got = ReadWholeMoments(dir.path(), {W, T, true}, "policy", kShapes);
      INFO(got.status().ToString());
      REQUIRE(got.ok());
      CHECK(at::equal(got->first, m));
      CHECK(at::equal(got->second, v));
    }
  }
}

TEST_CASE("ReadWholeMoments refuses what its layout cannot have written, naming it") {
  rlmesh::testing::TempDir dir;
  const at::Tensor m = at::arange(45, at::kFloat);
  WriteRankFiles(dir.path(), m, m, 4, 2);
  SECTION("tp not dividing world_size") {
    auto got = ReadWholeMoments(dir.path(), {4, 3, true}, "policy", kShapes);
    REQUIRE(!got.ok());
    CHECK(absl::StrContains(got.status().message(), "world_size 4 and tp 3"));
  }
  SECTION("another layout's shares") {
    auto got = ReadWholeMoments(dir.path(), {2, 1, true}, "policy", kShapes);
    REQUIRE(!got.ok());
    CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(got.status().message(), "optimizer-rank-0.safetensors"));
  }
  SECTION("another model") {
    ParameterShapes bigger = kShapes;
    bigger[1].second = {5};
    auto got = ReadWholeMoments(dir.path(), {4, 2, true}, "policy", bigger);
    REQUIRE(!got.ok());
    CHECK(absl::StrContains(got.status().message(), "the layout expects"));
  }
  SECTION("a rank's file missing") {
    auto got = ReadWholeMoments(dir.path(), {6, 2, true}, "policy", kShapes);
    REQUIRE(!got.ok());
    CHECK(absl::StrContains(got.status().message(), "optimizer-rank-"));
  }
  SECTION("a split dimension tp cannot divide") {
    auto got = ReadWholeMoments(dir.path(), {6, 6, true}, "policy", kShapes);
    REQUIRE(!got.ok());
    CHECK(absl::StrContains(got.status().message(), "cannot be split over tp=6"));
  }
}

}  // namespace
}  // namespace rlmesh::learner
