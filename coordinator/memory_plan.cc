#include "coordinator/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/experiment_config.h"

namespace rlmesh {
namespace {

constexpr double kFp32 = 4;
// Time steps per log-prob chunk (TrainerOptions.logprob_chunk).
constexpr int64_t kLogprobChunk = 64;
// Chunk-sized [rows, chunk, vocabulary] fp32 tensors alive at once in the
// log-prob backward (actor/logprobs.cc): the recomputed logits, their
// scaling, log p, p, the gradient and its temporaries (-p g, p (log p + H),
// the difference).
constexpr double kChunkTensors = 8;

std::string Gib(double bytes) { return absl::StrFormat("%.2f GiB", bytes / (1 << 30)); }

// The device a spec names, as the plan groups roles: "cpu" or "cuda:<i>".
std::string DeviceOf(const std::string& spec) {
  if (spec.empty() || spec == "cpu") return "cpu";
  if (spec == "cuda") return "cuda:0";
  return spec;
}

// Sequences one learner rank trains on per optimizer step of `stage`.
int64_t SequencesPerRank(const Stage& stage, int dp) {
  int64_t sequences = 0;
  if (stage.has_sft()) {
    sequences = stage.sft().batch();
  } else if (stage.has_dpo()) {
    sequences = 2 * static_cast<int64_t>(stage.dpo().batch());
  } else if (stage.has_reward_model()) {
    sequences = 2 * static_cast<int64_t>(stage.reward_model().batch());
  } else if (const RlStage* rl = RlSettings(stage)) {
    sequences = static_cast<int64_t>(rl->prompts_per_step()) * std::max(1, rl->samples_per_prompt()) /
                std::max(1, rl->mini_batches());
  }
  return std::max<int64_t>(1, (sequences + dp - 1) / dp);
}

// What one decoder layer keeps per token for its backward (bytes).
double LayerActivationBytes(const actor::ModelConfig& m) {
  const double h = m.hidden_size, a = m.num_heads, kv = m.num_kv_heads * m.HeadDim();
  // A MoE layer's MLP runs top-k experts per token.
  const double i = m.IsMoeArch() ? m.num_experts_per_tok * m.moe_intermediate_size : m.intermediate_size;
  return kFp32 * (9 * h + 4 * kv + 4 * i + a + 4);
}

}  // namespace

absl::Status PlanCapacity::Validate() const {
  if (!(host_bytes > 0)) return absl::InvalidArgumentError("PlanCapacity.host_bytes: must be > 0");
  if (gpu_bytes < 0) return absl::InvalidArgumentError("PlanCapacity.gpu_bytes: must be >= 0");
  if (runtime_bytes < 0) return absl::InvalidArgumentError("PlanCapacity.runtime_bytes: must be >= 0");
  if (replay_buffer_bytes < 0) return absl::InvalidArgumentError("PlanCapacity.replay_buffer_bytes: must be >= 0");
  return absl::OkStatus();
}

double RoleMemory::Each() const {
  double total = 0;
  for (const auto& p : parts) total += p.bytes;
  return total;
}

int64_t ParameterCount(const actor::ModelConfig& m) {
  const int64_t h = m.hidden_size, hd = m.HeadDim(), q = m.num_heads * hd, kv = m.num_kv_heads * hd;
  int64_t n = m.vocab_size * h * (m.tie_embeddings ? 1 : 2) + h;  // embeddings, lm_head, final norm
  if (m.value_head) n += h;
  for (int64_t layer = 0; layer < m.num_layers; ++layer) {
    int64_t l = 2 * h;                    // the two RMSNorms
    l += h * q + 2 * h * kv + q * h;      // q, k, v, o
    if (m.HasQkvBias()) l += q + 2 * kv;  // q/k/v biases
    if (m.HasOBias()) l += h;
    if (m.HasQkNorm()) l += 2 * hd;
    const bool dense = !m.IsMoeArch() ||
                       std::find(m.mlp_only_layers.begin(), m.mlp_only_layers.end(), layer) != m.mlp_only_layers.end() ||
                       (layer + 1) % std::max<int64_t>(1, m.decoder_sparse_step) != 0;
    if (dense) {
      l += 3 * h * m.intermediate_size;
    } else {
      l += m.num_experts * h + m.num_experts * 3 * h * m.moe_intermediate_size;  // router, experts
      if (m.shared_expert_intermediate_size > 0) l += 3 * h * m.shared_expert_intermediate_size + h;
    }
    n += l;
  }
  return n;
}

absl::StatusOr<MemoryPlan> PlanMemory(const ExperimentConfig& e, const actor::ModelConfig& m,
                                      const PlanSequences& lengths, const PlanCapacity& capacity) {
  if (absl::Status s = capacity.Validate(); !s.ok()) return s;
  const LearnerConfig& lc = e.learner();
  if (lc.tp() > 1) return absl::UnimplementedError("learner.tp: coordinator plan does not plan tensor parallelism yet");
  if (lc.ep() > 1) return absl::UnimplementedError("learner.ep: coordinator plan does not plan expert parallelism yet");
  if (lc.pp() > 1) return absl::UnimplementedError("learner.pp: coordinator plan does not plan pipeline parallelism yet");
  if (lc.cp() > 1) return absl::UnimplementedError("learner.cp: coordinator plan does not plan context parallelism yet");
  if (e.rollout().tp() > 1) {
    return absl::UnimplementedError("rollout.tp: coordinator plan does not plan tensor-parallel rollout yet");
  }
  MemoryPlan plan;
  const double p = static_cast<double>(ParameterCount(m));
  plan.parameters = static_cast<int64_t>(p);
  const int dp = std::max(1, lc.shards());
  auto bounded = [&](int64_t n) { return n > 0 ? std::min<int64_t>(n, m.max_positions) : m.max_positions; };
  const int64_t context = bounded(lengths.train);
  const int64_t generated = bounded(lengths.generate);

  // The largest micro-batch over the stages, and what the stages keep.
  bool reference = false, critic = false;
  int64_t sequences = 1;
  for (const Stage& stage : e.stages()) {
    sequences = std::max(sequences, SequencesPerRank(stage, dp));
    const RlStage* rl = RlSettings(stage);
    reference |= stage.has_dpo() || (rl != nullptr && rl->kl().coef() > 0);
    critic |= stage.has_ppo();
  }
  int64_t tokens = sequences * context;
  if (lc.micro_batch_tokens() > 0) tokens = std::min(tokens, std::max(lc.micro_batch_tokens(), context));
  plan.micro_batch_tokens = tokens;
  plan.micro_batch_rows = std::max<int64_t>(1, tokens / context);

  const double layer = LayerActivationBytes(m);
  const double kept = lc.gradient_checkpointing()
                          ? tokens * (m.num_layers * kFp32 * m.hidden_size + layer)
                          : tokens * m.num_layers * layer;
  const double activations = kept + tokens * kFp32 * 3 * m.hidden_size +
                             plan.micro_batch_rows * kLogprobChunk * m.vocab_size * kFp32 * kChunkTensors;

  auto learner_parts = [&](bool rank0) {
    std::vector<MemoryPart> parts;
    if (lc.zero() == 3) {
      parts.push_back({"training state (ZeRO-3, 20 B/param / dp)", 20 * p / dp});
      parts.push_back({"gradients (/ dp)", 4 * p / dp});
      if (rank0) parts.push_back({"gathered policy (rank 0)", 4 * p});
    } else {
      parts.push_back({"weights", 4 * p});
      parts.push_back({"flat weights and gradients", 8 * p});
      if (lc.zero() == 1) {
        parts.push_back({"AdamW moments (ZeRO-1, / dp)", 8 * p / dp});
        parts.push_back({"shard of gradients and weights (/ dp)", 8 * p / dp});
      } else {
        parts.push_back({"AdamW moments", 8 * p});
      }
      parts.push_back({"gradients", 4 * p});
    }
    if (reference) parts.push_back({"frozen reference", 4 * p});
    parts.push_back({lc.gradient_checkpointing() ? "activations (checkpointed)" : "activations", activations});
    if (critic) {
      double critic_bytes = 0;
      for (const auto& part : parts) {
        if (part.name.rfind("frozen", 0) != 0 && part.name.rfind("gathered", 0) != 0) critic_bytes += part.bytes;
      }
      parts.push_back({"critic (state and activations)", critic_bytes});
    }
    return parts;
  };

  const std::string learner_device = DeviceOf(e.model().device());
  const bool learners_on_gpu = learner_device != "cpu";
  if (!learners_on_gpu) {
    RoleMemory all{"learner", "cpu", dp, learner_parts(/*rank0=*/false)};
    if (lc.zero() == 3 && dp > 1) {
      RoleMemory zero{"learner 0", "cpu", 1, learner_parts(/*rank0=*/true)};
      zero.parts.push_back({"runtime", capacity.runtime_bytes});
      plan.roles.push_back(zero);
      all.count = dp - 1;
    }
    all.parts.push_back({"runtime", capacity.runtime_bytes});
    plan.roles.push_back(all);
  } else {
    // One GPU per shard, from model.device on (PlaceLearnerShardsOnGpus).
    const int first = learner_device == "cuda:0" ? 0 : std::stoi(learner_device.substr(5));
    for (int k = 0; k < dp; ++k) {
      plan.roles.push_back({dp == 1 ? "learner" : absl::StrCat("learner ", k), absl::StrCat("cuda:", first + k), 1,
                            learner_parts(/*rank0=*/k == 0)});
    }
  }

  // Rollout workers: the weights in rollout.dtype, the KV cache (the same
  // type) of max_batch sequences of the whole context, and one batch of
  // logits.
  const std::string rollout_spec = !e.rollout().device().empty() ? e.rollout().device() : e.model().device();
  const std::string rollout_device = DeviceOf(rollout_spec);
  const double rollout_bytes = RolloutDtype(e.rollout(), rollout_spec) == "fp32" ? kFp32 : kFp32 / 2;
  const int64_t max_batch = e.rollout().max_batch() > 0 ? e.rollout().max_batch() : 64;
  RoleMemory rollout{"rollout_worker", rollout_device, std::max(1, e.rollout().workers()), {}};
  rollout.parts.push_back({"weights", rollout_bytes * p});
  rollout.parts.push_back({absl::StrCat("KV cache (", max_batch, " x ", generated, " tokens)"),
                           2.0 * m.num_layers * m.num_kv_heads * m.HeadDim() * max_batch * generated * rollout_bytes});
  rollout.parts.push_back({"logits", 2.0 * max_batch * m.vocab_size * kFp32});
  if (rollout_device == "cpu") rollout.parts.push_back({"runtime", capacity.runtime_bytes});
  plan.roles.push_back(rollout);
  // The host's other roles: reward servers and the replay buffer.
  std::vector<MemoryPart> reward = {{"runtime", capacity.runtime_bytes}};
  if (!e.reward().reward_model().empty()) reward.push_back({"reward model (not planned)", 0});
  plan.roles.push_back({"reward_server", "cpu", std::max(1, e.reward().servers()), reward});
  plan.roles.push_back({"replay_buffer", "cpu", 1, {{"runtime", capacity.replay_buffer_bytes}}});

  // Sum per device.
  std::map<std::string, double> used;
  for (const RoleMemory& r : plan.roles) used[r.device] += r.Each() * r.count;
  for (const auto& [device, bytes] : used) {
    plan.devices.push_back({device, bytes, device == "cpu" ? capacity.host_bytes : capacity.gpu_bytes});
  }
  return plan;
}

std::string FormatMemoryPlan(const MemoryPlan& plan) {
  std::string out = absl::StrFormat("parameters %.1fM; largest learner micro-batch %d tokens in %d rows\n",
                                    plan.parameters / 1e6, plan.micro_batch_tokens, plan.micro_batch_rows);
  for (const RoleMemory& r : plan.roles) {
    absl::StrAppendFormat(&out, "%-16s x%-2d %-7s %10s each:", r.role, r.count, r.device, Gib(r.Each()));
    std::vector<std::string> parts;
    for (const auto& part : r.parts) parts.push_back(absl::StrCat(part.name, " ", Gib(part.bytes)));
    absl::StrAppend(&out, " ", absl::StrJoin(parts, ", "), "\n");
  }
  for (const DeviceUse& d : plan.devices) {
    if (d.capacity > 0) {
      absl::StrAppendFormat(&out, "%-7s %s of %s (%.0f%%)%s\n", d.device, Gib(d.used), Gib(d.capacity),
                            100 * d.used / d.capacity, d.used > d.capacity ? "  DOES NOT FIT" : "");
    } else {
      absl::StrAppendFormat(&out, "%-7s %s (its memory unknown: give --gpu_memory_gib to check)\n", d.device,
                            Gib(d.used));
    }
  }
  return out;
}

nlohmann::json MemoryPlanJson(const MemoryPlan& plan) {
  nlohmann::json j = {{"parameters", plan.parameters},
                      {"micro_batch_tokens", plan.micro_batch_tokens},
                      {"micro_batch_rows", plan.micro_batch_rows}};
  for (const RoleMemory& r : plan.roles) {
    nlohmann::json parts = nlohmann::json::object();
    for (const auto& part : r.parts) parts[part.name] = part.bytes;
    j["roles"].push_back({{"role", r.role}, {"device", r.device}, {"count", r.count}, {"each", r.Each()},
                          {"parts", parts}});
  }
  for (const DeviceUse& d : plan.devices) {
    j["devices"].push_back({{"device", d.device}, {"used", d.used}, {"capacity", d.capacity}});
  }
  return j;
}

absl::Status CheckMemoryPlan(const MemoryPlan& plan) {
  std::vector<std::string> full;
  for (const DeviceUse& d : plan.devices) {
    if (d.capacity <= 0 || d.used <= d.capacity) continue;
    std::vector<std::string> roles;
    for (const RoleMemory& r : plan.roles) {
      if (r.device == d.device) roles.push_back(absl::StrCat(r.role, " x", r.count, " (", Gib(r.Each()), " each)"));
    }
    full.push_back(absl::StrCat(d.device, " needs ", Gib(d.used), " for ", absl::StrJoin(roles, ", "),
                                ", more than its ", Gib(d.capacity)));
  }
  if (full.empty()) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("does not fit: ", absl::StrJoin(full, "; ")));
}

}  // namespace rlmesh
