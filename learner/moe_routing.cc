#include "learner/moe_routing.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"

namespace rlmesh::learner {

absl::Status CheckRoutes(const Trajectory& t, const actor::ModelConfig& config, const std::string& field) {
  if (t.routes_size() == 0) return absl::OkStatus();
  const int64_t per_pos = config.NumMoeLayers() * config.num_experts_per_tok;
  if (per_pos == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".routes: ", t.routes_size(),
                                                   " expert ids, but the policy has no MoE layers"));
  }
  const int64_t positions = t.prompt_token_ids_size() + t.response_token_ids_size() - 1;
  if (t.routes_size() != positions * per_pos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".routes: ", t.routes_size(), " expert ids; expected ", positions * per_pos, " (", positions,
        " positions x ", config.NumMoeLayers(), " MoE layers x k=", config.num_experts_per_tok, ")"));
  }
  for (int i = 0; i < t.routes_size(); ++i) {
    if (t.routes(i) < 0 || t.routes(i) >= config.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".routes[", i, "]: expert ", t.routes(i),
                                                     " outside [0, ", config.num_experts, ")"));
    }
  }
  return absl::OkStatus();
}

MoeForward::MoeForward(actor::Transformer& model, const std::vector<std::vector<int32_t>>* routes, int64_t begin,
                       int64_t end, int64_t T, const PackedRows* packed)
    : model_(model), config_(model->config()) {
  if (routes != nullptr) {
    std::vector<std::vector<int32_t>> rows(routes->begin() + begin, routes->begin() + end);
    routing_.replay = actor::RoutesToReplay(rows, T, config_);
    // [rows * T, k] per layer -> the packed rows' positions (-1, route
    // freely, where they hold padding).
    if (packed != nullptr) {
      for (at::Tensor& layer : routing_.replay) layer = packed->Pack(layer, -1);
    }
  }
  routing_.record = true;
  model_->set_routing(&routing_);
}

MoeForward::~MoeForward() { model_->set_routing(nullptr); }

at::Tensor MoeForward::AuxLoss(const at::Tensor& real) const {
  return actor::LoadBalancingLoss(routing_.router_logits, config_.num_experts, config_.num_experts_per_tok,
                                  real.reshape({-1}));
}

std::pair<int64_t, int64_t> MoeForward::Mismatch() const {
  if (routing_.replay.empty() || routing_.router_logits.empty()) return {0, 0};
  at::Tensor differs, replayed;
  for (size_t l = 0; l < routing_.replay.size() && l < routing_.router_logits.size(); ++l) {
    const at::Tensor& given = routing_.replay[l];  // [N, k], -1 rows free
    // The router's own top-k, as MoeImpl computes it (fp32 probabilities).
    auto own = std::get<1>(at::softmax(routing_.router_logits[l].detach(), -1, at::kFloat)
                               .topk(config_.num_experts_per_tok, -1))
                   .to(at::kCPU);
    auto a = std::get<0>(given.to(at::kLong).sort(-1));
    auto b = std::get<0>(own.sort(-1));
    auto d = a.ne(b).any(-1);
    auto r = given.select(1, 0).ge(0);
    differs = differs.defined() ? differs.logical_or(d) : d;
    replayed = r;
  }
  return {differs.logical_and(replayed).sum().item<int64_t>(), replayed.sum().item<int64_t>()};
}

}  // namespace rlmesh::learner
