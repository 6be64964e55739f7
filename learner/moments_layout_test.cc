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

TEST_CASE("ReadWholeMoments rebuilds expert parallelism's per-rank files") {
  rlmesh::testing::TempDir dir;
  // Experts interleaved with replicated parameters, as a MoE model's
  // NamedParameters() lists them: 4 experts in each of 2 layers over ep=2.
  ParameterShapes shapes;
  std::vector<int> expert;  // -1: replicated
  for (int layer = 0; layer < 2; ++layer) {
    shapes.push_back({absl::StrFormat("model.layers.%d.input_layernorm.weight", layer), {3}});
    expert.push_back(-1);
    for (int e = 0; e < 4; ++e) {
      shapes.push_back({absl::StrFormat("model.layers.%d.mlp.experts.%d.up_proj.weight", layer, e), {2, 3}});
      expert.push_back(e);
    }
    shapes.push_back({absl::StrFormat("model.layers.%d.mlp.gate.weight", layer), {4, 3}});
    expert.push_back(-1);
  }
  int64_t total = 0;
  std::vector<int64_t> offset;
  for (const auto& [name, shape] : shapes) {
    offset.push_back(total);
    total += shape[0] * (shape.size() > 1 ? shape[1] : 1);
  }
  const at::Tensor m = at::arange(total, at::kFloat);
  const at::Tensor v = m * 3 + 1;
  for (int r = 0; r < 2; ++r) {
    auto own = [&](const at::Tensor& whole) {
      std::vector<at::Tensor> parts;
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (expert[i] < 0) parts.push_back(whole.narrow(0, offset[i], shapes[i].second[0] * (shapes[i].second.size() > 1 ? shapes[i].second[1] : 1)));
      }
      for (size_t i = 0; i < shapes.size(); ++i) {
        if (expert[i] >= 0 && expert[i] / 2 == r) parts.push_back(whole.narrow(0, offset[i], 6));
      }
      return at::cat(parts);
    };
    REQUIRE(actor::WriteSafetensors(absl::StrFormat("%s/optimizer-rank-%d.safetensors", dir.path(), r),
                                    {{"policy.exp_avg", own(m)}, {"policy.exp_avg_sq", own(v)}})
                .ok());
  }
  MomentsLayout layout;
  layout.world_size = 2;
  layout.ep = 2;
  auto got = ReadWholeMoments(dir.path(), layout, "policy", shapes);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  CHECK(at::equal(got->first, m));
  CHECK(at::equal(got->second, v));
  // Two groups of 2: the second group's files (absent here) are not read.
  layout.world_size = 4;
  auto two_groups = ReadWholeMoments(dir.path(), layout, "policy", shapes);
  REQUIRE(two_groups.ok());
  CHECK(at::equal(two_groups->first, m));
  layout.world_size = 2;
  layout.ep = 4;  // more than the world size
  auto bad = ReadWholeMoments(dir.path(), layout, "policy", shapes);
  REQUIRE(!bad.ok());
  CHECK(absl::StrContains(bad.status().message(), "ep 4 with world_size 2"));
}

}  // namespace
}  // namespace rlmesh::learner
