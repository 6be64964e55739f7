#include "parallel/layout_shapes.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rlmesh::parallel {

int64_t DecoderLayerParameters(const actor::ModelConfig& m, int64_t layer) {
  const int64_t h = m.hidden_size, hd = m.HeadDim(), q = m.num_heads * hd, kv = m.num_kv_heads * hd;
  int64_t n = 2 * h;                    // the two RMSNorms
  n += h * q + 2 * h * kv + q * h;      // q, k, v, o
  if (m.HasQkvBias()) n += q + 2 * kv;  // q/k/v biases
  if (m.HasOBias()) n += h;
  if (m.HasQkNorm()) n += 2 * hd;
  const bool dense = !m.IsMoeArch() ||
                     std::find(m.mlp_only_layers.begin(), m.mlp_only_layers.end(), layer) != m.mlp_only_layers.end() ||
                     (layer + 1) % std::max<int64_t>(1, m.decoder_sparse_step) != 0;
  if (dense) return n + 3 * h * m.intermediate_size;
  n += m.num_experts * h + m.num_experts * 3 * h * m.moe_intermediate_size;  // router, experts
  if (m.shared_expert_intermediate_size > 0) n += 3 * h * m.shared_expert_intermediate_size + h;
  return n;
}

int64_t ParameterCount(const actor::ModelConfig& m) {
  // Embeddings, lm_head (once when tied), final norm, value head.
  int64_t n = m.vocab_size * m.hidden_size * (m.tie_embeddings ? 1 : 2) + m.hidden_size;
  if (m.value_head) n += m.hidden_size;
  for (int64_t layer = 0; layer < m.num_layers; ++layer) n += DecoderLayerParameters(m, layer);
  return n;
}

actor::ModelConfig TensorParallelShardConfig(const actor::ModelConfig& config, int tp) {
  actor::ModelConfig s = config;
  s.head_dim = config.HeadDim();
  s.num_heads /= tp;
  s.num_kv_heads /= tp;
  s.intermediate_size /= tp;
  s.vocab_size /= tp;
  return s;
}

namespace {

// The embedding's parameters (stage 0's extra) and the final norm's and
// output projection's (the last stage's: its own head, or with tied
// embeddings its copy of the embedding).
int64_t EmbeddingParameters(const actor::ModelConfig& c) { return c.vocab_size * c.hidden_size; }
int64_t HeadParameters(const actor::ModelConfig& c) { return c.vocab_size * c.hidden_size + c.hidden_size; }

}  // namespace

absl::StatusOr<std::vector<int64_t>> BalancedStageLayers(const actor::ModelConfig& config, int stages) {
  const int64_t L = config.num_layers;
  if (stages < 1 || stages > L) {
    return absl::InvalidArgumentError(absl::StrCat("learner.pp: ", stages,
                                                   " stages need between 1 and the model's num_layers (", L,
                                                   ") decoder layers, at least one per stage"));
  }
  // prefix[j]: the parameters of layers [0, j).
  std::vector<int64_t> prefix(L + 1, 0);
  for (int64_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + DecoderLayerParameters(config, l);
  auto extra = [&](int s) {
    return (s == 0 ? EmbeddingParameters(config) : 0) + (s == stages - 1 ? HeadParameters(config) : 0);
  };
  // best[s][j]: the smallest largest-stage cost of layers [0, j) over
  // stages [0, s); from[s][j] the first layer of stage s - 1 there.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(L + 1, kInf));
  std::vector<std::vector<int64_t>> from(stages + 1, std::vector<int64_t>(L + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int64_t j = s; j <= L; ++j) {
      for (int64_t i = s - 1; i < j; ++i) {
        if (best[s - 1][i] == kInf) continue;
        const int64_t cost = std::max(best[s - 1][i], prefix[j] - prefix[i] + extra(s - 1));
        // `<=`: among equal costs the latest start, so later stages hold fewer layers.
        if (cost <= best[s][j]) {
          best[s][j] = cost;
          from[s][j] = i;
        }
      }
    }
  }
  std::vector<int64_t> layers(stages);
  for (int64_t s = stages, j = L; s > 0; --s) {
    const int64_t i = from[s][j];
    layers[s - 1] = j - i;
    j = i;
  }
  return layers;
}

std::vector<int64_t> StageParameterCounts(const actor::ModelConfig& config, const std::vector<int64_t>& stage_layers) {
  const int stages = static_cast<int>(stage_layers.size());
  if (stages == 1) return {ParameterCount(config)};
  std::vector<int64_t> out(stages, 0);
  int64_t layer = 0;
  for (int s = 0; s < stages; ++s) {
    for (int64_t k = 0; k < stage_layers[s]; ++k) out[s] += DecoderLayerParameters(config, layer++);
  }
  out.front() += EmbeddingParameters(config);
  out.back() += HeadParameters(config);
  if (config.value_head) out.back() += config.hidden_size;
  return out;
}

absl::StatusOr<std::vector<int64_t>> PipelineChunkLayers(const actor::ModelConfig& config, int stages,
                                                         int virtual_stages) {
  if (virtual_stages <= 1 || stages <= 1) {
    if (virtual_stages > 1) {
      return absl::InvalidArgumentError("learner.pp_virtual_stages: > 1 needs learner.pp > 1");
    }
    return BalancedStageLayers(config, stages);
  }
  const int64_t chunks = static_cast<int64_t>(stages) * virtual_stages, L = config.num_layers;
  if (L < chunks) {
    return absl::InvalidArgumentError(absl::StrCat("learner.pp_virtual_stages: ", stages, " stages x ", virtual_stages,
                                                   " virtual stages need at least ", chunks,
                                                   " layers, the model has num_layers ", L));
  }
  std::vector<int64_t> layers(chunks, L / chunks);
  for (int64_t c = 1; c <= L % chunks; ++c) ++layers[c];
  return layers;
}

}  // namespace rlmesh::parallel
