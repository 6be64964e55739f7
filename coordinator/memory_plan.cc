#include "coordinator/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/experiment_config.h"
#include "parallel/layout_shapes.h"
#include "parallel/pipeline_schedule.h"
#include "weight_sync/pieces.h"

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
// [tokens, vocabulary / tp] fp32 tensors alive at once in the
// vocabulary-parallel log-softmax (parallel/tensor_parallel.cc's
// VocabParallelLogProbs): the scaled logits and their exponentials kept
// for the backward, and two gradients of that size in it.
constexpr double kVocabParallelTensors = 4;

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

namespace {

// A learner group's layout, as the plan counts it.
struct LearnerLayout {
  int shards = 1, tp = 1, pp = 1, cp = 1, zero = 0;
  // Model chunks per pipeline stage (learner.pp_virtual_stages).
  int virtual_stages = 1;
  // Data-parallel replicas: shards / (tp x pp x cp).
  int replicas = 1;
  // Micro-batches per mini-batch under the pipeline (1 without).
  int64_t micro_batches = 1;
  bool gradient_checkpointing = false;
  // Rank 0 keeps the whole policy between steps for weight sync (a split
  // layout that syncs it whole); with ZeRO-3's pieces each rank keeps its
  // slice instead.
  bool whole_on_rank0 = false;
  bool sync_slices = false;
};

// What one learner rank holds and runs.
struct RankShape {
  // Its parameters (a tensor-parallel slice, a pipeline stage's).
  double params = 0;
  // Decoder layers it runs, and micro-batches whose activations it holds at
  // once, in whole passes through those layers (1F1B: stage s of P holds
  // min(P - s, M); interleaved: the schedule's most layers held at once,
  // each held chunk counting its layers, over the stage's layers).
  int64_t layers = 0;
  double in_flight = 1;
  // Whether it scores the vocabulary (the last stage).
  bool head = true;
  bool rank0 = false;
};

// The learner's terms for one rank (see memory_plan.h), less the runtime.
std::vector<MemoryPart> LearnerParts(const LearnerLayout& l, const RankShape& r, const actor::ModelConfig& shard,
                                     double whole_params, int64_t tokens, int64_t rows, bool reference, bool critic) {
  std::vector<MemoryPart> parts;
  const double p = r.params;
  if (l.zero == 3) {
    // Over the replicas of each tensor-parallel slice.
    const int over = l.shards / l.tp;
    parts.push_back({"training state (ZeRO-3, 20 B/param / dp)", 20 * p / over});
    parts.push_back({"gradients (/ dp)", 4 * p / over});
  } else {
    parts.push_back({"weights", 4 * p});
    parts.push_back({"flat weights and gradients", 8 * p});
    if (l.zero == 1) {
      // Over the ranks holding the same slice or stage.
      const int over = l.shards / (l.tp * l.pp);
      parts.push_back({"AdamW moments (ZeRO-1, / dp)", 8 * p / over});
      parts.push_back({"shard of gradients and weights (/ dp)", 8 * p / over});
    } else {
      parts.push_back({"AdamW moments", 8 * p});
    }
    parts.push_back({"gradients", 4 * p});
  }
  if (r.rank0 && l.whole_on_rank0) parts.push_back({"gathered policy (rank 0)", 4 * whole_params});
  if (l.sync_slices) parts.push_back({"weight-sync slice (4 B/param / shards)", 4 * whole_params / l.shards});
  // Split like the policy under TP and PP (whole under ZeRO-3).
  if (reference) parts.push_back({"frozen reference", 4 * (l.zero == 3 ? whole_params : p)});
  // Each context-parallel rank runs its share of the tokens.
  const int64_t own = (tokens + l.cp - 1) / l.cp;
  const double layer = LayerActivationBytes(shard);
  // Checkpointed, a micro-batch in flight keeps each layer's input, and
  // one layer's activations at a time are rebuilt in the backward pass.
  double activations = l.gradient_checkpointing
                           ? r.in_flight * own * r.layers * kFp32 * shard.hidden_size + own * layer
                           : r.in_flight * own * r.layers * layer;
  activations += own * kFp32 * 3 * shard.hidden_size;
  if (r.head && l.tp > 1) {
    // The vocabulary-parallel log-softmax is not chunked: the scaled
    // logits and their exponentials, [tokens, vocabulary / tp] fp32, and
    // two gradients of their size in the backward.
    activations += kVocabParallelTensors * own * shard.vocab_size * kFp32;
  } else if (r.head) {
    activations += rows * kLogprobChunk * shard.vocab_size * kFp32 * kChunkTensors;
  }
  if (l.cp > 1) {
    // One layer's keys and values of every rank, repeated for the query
    // heads, and their gradients in the backward.
    activations += 4.0 * tokens * shard.num_heads * shard.HeadDim() * kFp32;
  }
  parts.push_back({l.gradient_checkpointing ? "activations (checkpointed)" : "activations", activations});
  if (critic) {
    double critic_bytes = 0;
    for (const auto& part : parts) {
      if (part.name.rfind("frozen", 0) != 0 && part.name.rfind("gathered", 0) != 0) critic_bytes += part.bytes;
    }
    parts.push_back({"critic (state and activations)", critic_bytes});
  }
  return parts;
}

// The learner's roles, one per kind of rank: on GPUs one per shard; on the
// CPU rank 0 apart when it keeps the whole policy, and each pipeline stage
// apart. `parts` gives a rank's terms; `runtime` is added to each role on
// the CPU.
using PartsOf = std::function<std::vector<MemoryPart>(const RankShape&)>;
absl::StatusOr<std::vector<RoleMemory>> LearnerRoles(const ExperimentConfig& e, const LearnerLayout& l,
                                                     const actor::ModelConfig& m, const actor::ModelConfig& shard,
                                                     double p, double runtime, const PartsOf& parts) {
  const LearnerConfig& lc = e.learner();
  std::vector<RoleMemory> roles;
  const std::string learner_device = DeviceOf(e.model().device());
  if (learner_device != "cpu") {
    // One GPU per shard, from model.device on (PlaceLearnerShardsOnGpus);
    // only data parallelism and ZeRO-1 run there.
    const int first = learner_device == "cuda:0" ? 0 : std::stoi(learner_device.substr(5));
    for (int k = 0; k < l.shards; ++k) {
      roles.push_back({l.shards == 1 ? "learner" : absl::StrCat("learner ", k), absl::StrCat("cuda:", first + k), 1,
                       parts({.params = p, .layers = m.num_layers, .rank0 = k == 0})});
    }
  } else if (l.pp > 1) {
    // Each stage's ranks (shards / pp: its replicas, and with TP its
    // slices) hold its chunks' parameters and layers (chunk c on stage
    // c % pp; with TP a slice of each) and the micro-batches its schedule
    // keeps in flight there; rank 0 is stage 0.
    const int chunks = l.pp * l.virtual_stages;
    std::vector<int64_t> layers(lc.pp_layers().begin(), lc.pp_layers().end());
    if (layers.empty()) {
      auto balanced = parallel::PipelineChunkLayers(m, l.pp, l.virtual_stages);
      if (!balanced.ok()) return balanced.status();
      layers = *balanced;
    }
    if (static_cast<int>(layers.size()) != chunks) {
      return absl::InvalidArgumentError(absl::StrCat("learner.pp_layers: ", layers.size(), " entries for ", chunks,
                                                     " chunks"));
    }
    const std::vector<int64_t> chunk_params = parallel::StageParameterCounts(shard, layers);
    std::vector<int64_t> held(l.pp, 0), stage_layers(l.pp, 0);
    for (int c = 0; c < chunks; ++c) {
      held[c % l.pp] += chunk_params[c];
      stage_layers[c % l.pp] += layers[c];
    }
    auto schedule = parallel::SimulatePipeline(l.pp, l.virtual_stages, l.micro_batches, 1.0, 2.0, layers);
    if (!schedule.ok()) return schedule.status();
    const int per_stage = l.shards / l.pp;
    for (int st = 0; st < l.pp; ++st) {
      RankShape r{.params = static_cast<double>(held[st]), .layers = stage_layers[st],
                  .in_flight = static_cast<double>(schedule->max_layers_in_flight[st]) / stage_layers[st],
                  .head = st == l.pp - 1};
      const std::string name = absl::StrCat("learner stage ", st);
      if (st == 0) {
        RankShape first = r;
        first.rank0 = true;
        RoleMemory zero{"learner 0 (stage 0)", "cpu", 1, parts(first)};
        zero.parts.push_back({"runtime", runtime});
        roles.push_back(zero);
        if (per_stage == 1) continue;
      }
      RoleMemory role{name, "cpu", st == 0 ? per_stage - 1 : per_stage, parts(r)};
      role.parts.push_back({"runtime", runtime});
      roles.push_back(role);
    }
  } else {
    const RankShape r{.params = static_cast<double>(parallel::ParameterCount(shard)), .layers = m.num_layers};
    RoleMemory all{"learner", "cpu", l.shards, parts(r)};
    if (l.whole_on_rank0 && l.shards > 1) {
      RankShape first = r;
      first.rank0 = true;
      RoleMemory zero{"learner 0", "cpu", 1, parts(first)};
      zero.parts.push_back({"runtime", runtime});
      roles.push_back(zero);
      all.count = l.shards - 1;
    }
    all.parts.push_back({"runtime", runtime});
    roles.push_back(all);
  }

  return roles;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanMemory(const ExperimentConfig& e, const actor::ModelConfig& m,
                                      const PlanSequences& lengths, const PlanCapacity& capacity) {
  if (absl::Status s = capacity.Validate(); !s.ok()) return s;
  const LearnerConfig& lc = e.learner();
  if (lc.ep() > 1) return absl::UnimplementedError("learner.ep: coordinator plan does not plan expert parallelism yet");
  if (e.rollout().tp() > 1) {
    return absl::UnimplementedError("rollout.tp: coordinator plan does not plan tensor-parallel rollout yet");
  }
  MemoryPlan plan;
  const double p = static_cast<double>(parallel::ParameterCount(m));
  plan.parameters = static_cast<int64_t>(p);
  LearnerLayout l;
  l.shards = std::max(1, lc.shards());
  l.tp = std::max(1, lc.tp());
  l.pp = std::max(1, lc.pp());
  l.virtual_stages = std::max(1, lc.pp_virtual_stages());
  l.cp = std::max(1, lc.cp());
  l.zero = lc.zero();
  l.replicas = std::max(1, l.shards / (l.tp * l.pp * l.cp));
  l.gradient_checkpointing = lc.gradient_checkpointing();
  const bool pieces = weight_sync::ConfiguredWeightPieces(e, l.shards) > 1;
  // A pipeline gathers the whole policy on rank 0 (TP in its stages or
  // not); ZeRO-3 and TP alone unless the weights travel in pieces.
  l.whole_on_rank0 = l.pp > 1 || ((l.zero == 3 || l.tp > 1) && !pieces);
  l.sync_slices = l.zero == 3 && pieces;
  auto bounded = [&](int64_t n) { return n > 0 ? std::min<int64_t>(n, m.max_positions) : m.max_positions; };
  const int64_t context = bounded(lengths.train);
  const int64_t generated = bounded(lengths.generate);

  // The largest micro-batch over the stages, and what the stages keep.
  bool reference = false, critic = false;
  int64_t sequences = 1;
  for (const Stage& stage : e.stages()) {
    sequences = std::max(sequences, SequencesPerRank(stage, l.replicas));
    const RlStage* rl = RlSettings(stage);
    reference |= stage.has_dpo() || (rl != nullptr && rl->kl().coef() > 0);
    critic |= stage.has_ppo();
  }
  int64_t tokens = sequences * context;
  if (lc.micro_batch_tokens() > 0) tokens = std::min(tokens, std::max(lc.micro_batch_tokens(), context));
  if (l.pp > 1) {
    // The pipeline cuts each mini-batch into at least pp_microbatches.
    l.micro_batches = std::max<int64_t>(1, lc.pp_microbatches());
    tokens = std::min(tokens, (sequences + l.micro_batches - 1) / l.micro_batches * context);
    l.micro_batches = std::max(l.micro_batches, (sequences * context + tokens - 1) / tokens);
  }
  plan.micro_batch_tokens = tokens;
  plan.micro_batch_rows = std::max<int64_t>(1, tokens / context);
  const actor::ModelConfig shard = l.tp > 1 ? parallel::TensorParallelShardConfig(m, l.tp) : m;
  auto parts = [&](const RankShape& r) {
    return LearnerParts(l, r, shard, p, tokens, plan.micro_batch_rows, reference, critic);
  };

  auto learners = LearnerRoles(e, l, m, shard, p, capacity.runtime_bytes, parts);
  if (!learners.ok()) return learners.status();
  plan.roles = *std::move(learners);

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
