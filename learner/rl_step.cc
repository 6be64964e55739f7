// Trainer::TrainRl: one GRPO-family or PPO step on a shard's groups (advantages,
// epochs x mini-batches of the clipped policy loss, the critic for PPO), as
// the phases of RlStep below.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "learner/advantages.h"
#include "learner/batching.h"
#include "learner/device_metrics.h"
#include "learner/distillation.h"
#include "learner/losses.h"
#include "learner/moe_routing.h"
#include "learner/mismatch.h"
#include "learner/schedule.h"
#include "learner/trainer.h"
#include "learner/trainer_internal.h"
#include "tasks/encoding.h"
#include "tasks/preferences.h"
#include "tasks/task.h"

namespace rlmesh::learner {
namespace {

// Long-tailed response lengths: a micro-batch pads its rows to its longest,
// so a mix of short and long rows wastes most of its slots on padding. When
// a mini-batch (the same row ranges TrainRl uses) needs more than one
// micro-batch, its rows are put in order of length (stable), so each
// micro-batch pads to about its own rows' length. Mini-batches keep their
// rows. With one micro-batch the padding is the longest row's whatever the
// order, so nothing moves (and such steps are bit-identical to unsorted
// ones). The rows of a group in `whole` (per group; empty = none), one whose
// prompt the packed micro-batch runs once, move together, placed by their
// longest row, so that they land in one micro-batch. Returns, per group,
// the positions of its rows in sample order; empty when no row moved (groups
// are then contiguous in order).
template <typename RowT, typename LengthFn, typename GroupFn>
std::vector<std::vector<int64_t>> SortRowsForMicroBatches(std::vector<RowT>* rows, LengthFn length_of,
                                                          GroupFn group_of, int64_t num_groups, int mini_batches,
                                                          int64_t micro_tokens, const std::vector<bool>& whole) {
  const int64_t B = rows->size();
  std::vector<int64_t> lengths(B), order(B), group_longest(num_groups, 0);
  for (int64_t r = 0; r < B; ++r) {
    lengths[r] = length_of((*rows)[r]);
    order[r] = r;
    int64_t& l = group_longest[group_of((*rows)[r])];
    l = std::max(l, lengths[r]);
  }
  // (length, group): a whole group's rows share one key; -1 for the others.
  auto key = [&](int64_t r) {
    const int64_t g = group_of((*rows)[r]);
    return whole.empty() || !whole[g] ? std::pair<int64_t, int64_t>(lengths[r], -1)
                                      : std::pair<int64_t, int64_t>(group_longest[g], g);
  };
  bool moved = false;
  for (int k = 0; k < mini_batches; ++k) {
    const int64_t a = k * B / mini_batches, e = (k + 1) * B / mini_batches;
    if (MicroBatches(lengths, a, e, micro_tokens).size() <= 1) continue;
    std::stable_sort(order.begin() + a, order.begin() + e, [&](int64_t x, int64_t y) { return key(x) < key(y); });
    for (int64_t r = a; r < e; ++r) moved |= order[r] != r;
  }
  if (!moved) return {};
  std::vector<RowT> sorted;
  sorted.reserve(B);
  std::vector<int64_t> position(B);
  for (int64_t p = 0; p < B; ++p) {
    position[order[p]] = p;
    sorted.push_back(std::move((*rows)[order[p]]));
  }
  std::vector<std::vector<int64_t>> members(num_groups);
  for (int64_t r = 0; r < B; ++r) members[group_of(sorted[position[r]])].push_back(position[r]);
  *rows = std::move(sorted);
  return members;
}


// One call of Trainer::TrainRl, phase by phase. Each phase reads what the
// ones before it left in the members and must run once, in this order:
//   Sample       validate and tokenise the groups; reward metrics
//   Layout       row order, the padded batch, packing, micro-batches
//   OldLogProbs  the no-grad pass: old, reference, teacher log-probs and
//                old values (skipped where the training forward gives them)
//   LossMask     rollout/learner mismatch weights and the tokens in the loss
//   Advantages   rewards (KL, over-long shaping), advantages, distillation
//   TrainLoop    epochs x mini-batches x micro-batches, one optimizer step
//                per mini-batch
//   Metrics      the step's metrics from what the loop gathered
// Layout onward run inside CatchAll (they call LibTorch). Not copyable:
// `sharing` points at `row_groups`.
struct RlStep {
  RlStep(const TrainerOptions& options, const StageOptions& opt, int world, ModelSet& models,
         google::protobuf::Map<std::string, double>& m)
      : options(options), opt(opt), rl(opt.rl), world(world), models(models), m(m) {}
  RlStep(const RlStep&) = delete;
  RlStep& operator=(const RlStep&) = delete;

  absl::Status Sample(const std::vector<TrajectoryGroup>& groups, double seconds_sample);
  void Layout();
  absl::Status OldLogProbs();
  absl::Status LossMask();
  absl::Status Advantages();
  absl::Status TrainLoop();
  void Metrics();

  // Packed micro-batch [a, e) at width T, built once and used by every
  // policy-side forward of it; null = rows.
  const PackedRows* Packing(int64_t a, int64_t e, int64_t T);
  // MoE policies: every policy forward records the router logits (the
  // load-balancing loss and its metric) and, under rl.routing_replay,
  // replays the rollout's experts, placed as the micro-batch is (padded
  // rows or packed). The reference and the critic route freely
  // (docs/design/model.md).
  void StartRouting(std::optional<MoeForward>* f, int64_t a, int64_t e, int64_t T);
  // 1 at the real (unpadded) positions of rows [a, e): [e - a, T], or
  // [R * W] when the micro-batch is packed.
  at::Tensor RealPositions(int64_t a, int64_t e, int64_t T);
  // Per-token log-probs (and entropies) of micro-batch [a, e) under
  // `model`, as [e - a, T] rows whatever the layout.
  absl::StatusOr<actor::TokenLogProbsOutput> MicroLogProbs(actor::Transformer& model, int64_t a, int64_t e,
                                                          int64_t T);
  // Micro-batch [a, e)'s model inputs (packed where Packing says), and its
  // per-token outputs back as [e - a, T] rows.
  PipelineMicroBatch MicroInputs(int64_t a, int64_t e, int64_t T);
  actor::TokenLogProbsOutput Unpacked(int64_t a, int64_t e, int64_t T, actor::TokenLogProbsOutput lp);
  // learner.cp > 1: 1 at the positions of rows [a, e) whose log-probs this
  // rank computes, [e - a, T]: its zig-zag share of the rows, or of the
  // packed rows, unpacked.
  at::Tensor ContextShare(int64_t a, int64_t e, int64_t T);
  // learner.pp > 1: OldLogProbs' passes, every micro-batch through the
  // pipeline at once.
  absl::Status PipelinedOldLogProbs();
  // The loss of micro-batch [a, e) to backpropagate, weighted by its share
  // w / mini_w of the mini-batch, from the policy's log-probs `lp` and, for
  // MoE policies, the router's auxiliary loss `aux`; its metrics go to
  // `means`.
  absl::StatusOr<at::Tensor> MicroLoss(int64_t a, int64_t e, int64_t T, double w, double mini_w,
                                       const actor::TokenLogProbsOutput& lp, const at::Tensor& aux);
  // The critic's values of micro-batch [a, e), [e - a, T], packed as the
  // policy's log-probs are.
  absl::StatusOr<at::Tensor> MicroValues(int64_t a, int64_t e, int64_t T);
  // The longest row of [a, e): the micro-batch's width.
  int64_t Longest(int64_t a, int64_t e) const {
    return *std::max_element(lengths.begin() + a, lengths.begin() + e);
  }
  // Mismatch weights of `old` against the behaviour log-probs over mask
  // `mk`; records their metrics and the largest difference.
  absl::StatusOr<MismatchWeights> CorrectMismatch(const at::Tensor& old, const at::Tensor& behaviour,
                                                  const at::Tensor& mk);
  // On-policy distillation: A_t += coef * (teacher - old) on the tokens of `mk`.
  absl::Status AddDistillation(at::Tensor* advantages, const at::Tensor& teacher, const at::Tensor& old,
                               const at::Tensor& mk);
  // Loss weight of a micro-batch with mask `mk`: what the aggregation
  // averages over (a 0-dim tensor where the mask is).
  at::Tensor WeightOf(const at::Tensor& mk) const;
  // The weights of a mini-batch's micro-batches, read in one copy.
  std::vector<double> MicroWeights(const std::vector<std::pair<int64_t, int64_t>>& micro) const;
  // Reads what the phases left in `late`; the metrics that wait for it.
  void ReadLate();

  // Constant for the step
  const TrainerOptions& options;
  const StageOptions& opt;
  const RlOptions& rl;
  const int world;
  ModelSet& models;
  google::protobuf::Map<std::string, double>& m;

  // Sample
  struct Row {
    Seq seq;
    int64_t group = 0;
    double reward = 0;
    int64_t response_len = 0;
    // Trajectory.routes, kept when rl.routing_replay is on.
    std::vector<int32_t> routes;
    // Over-long filtering: the response was cut at max_new_tokens (or the
    // context window) and stays out of the loss.
    bool filtered = false;
  };
  std::vector<Row> rows;
  std::vector<std::vector<double>> group_rewards;
  bool with_behaviour = false;

  // Layout
  int64_t B = 0;
  bool moe = false;
  PrefixSharing sharing;
  std::vector<bool> whole_groups;
  // members[g]: the rows of kept group g, in the group's sample order.
  std::vector<std::vector<int64_t>> members;
  std::vector<Seq> seqs;
  std::vector<int64_t> lengths, row_groups;
  std::vector<std::vector<int32_t>> routes;
  Batch b;
  int64_t T_all = 0;
  std::map<std::pair<int64_t, int64_t>, std::optional<PackedRows>> packed;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> minis;

  // OldLogProbs
  bool reuse_forward = false;
  Clock::time_point t_forward;
  at::Tensor old_logp, ref_logp, old_values, teacher_logp;

  // LossMask
  at::Tensor mask, is_weight, loss_mask;
  double behaviour_diff = 0;
  MetricMeans mismatch_means;  // token-weighted over micro-batches (reuse_forward)

  // Values the host needs only for the step's metrics, read together at its
  // end: on a GPU each read is a synchronisation, so no micro-batch makes
  // one of its own (the loss functions called read their metrics once per
  // call). Per CorrectMismatch call, its metrics and the names in `late` of
  // its largest |old - behaviour| ("" for no rows) and its weight.
  DeviceMetrics late;
  struct LateMismatch {
    learner::Metrics metrics;
    std::string diff, weight;
  };
  std::vector<LateMismatch> late_mismatch;
  // MoE router aux losses (on the router's device, so read apart from
  // `late`) and the weight of their micro-batch, in loop order.
  DeviceMetrics late_aux;
  std::vector<double> aux_weights;

  // Advantages
  at::Tensor adv, returns;
  bool distill = false;
  MetricMeans distill_means;

  // TrainLoop
  MetricMeans means;
  double mean_weight = 0;  // the weight `means` are over
  double grad_norm_sum = 0, value_grad_norm_sum = 0, lr = 0;
  int64_t opt_steps = 0, skipped = 0;
  double fb_seconds = 0, opt_seconds = 0;
};

// Validate and tokenise; rewards per group (with overlong shaping).
absl::Status RlStep::Sample(const std::vector<TrajectoryGroup>& groups, double seconds_sample) {
  const int64_t vocab = models.policy->config().vocab_size;
  const int64_t max_len = models.policy->config().max_positions;
  double raw_sum = 0, raw_sq = 0, len_sum = 0;
  int64_t raw_n = 0, zero_var = 0, kept_groups = 0, overlong_filtered = 0;
  // Response tokens, and those the rollout masked out of the loss (a
  // multi-turn episode's environment observations).
  int64_t response_tokens = 0, masked_out = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const TrajectoryGroup& grp = groups[g];
    const std::string gp = absl::StrCat("groups[", g, "]");
    if (grp.samples_size() == 0) return absl::InvalidArgumentError(gp + ".samples: empty");
    std::vector<double> rewards;
    std::vector<Row> grows;
    for (int i = 0; i < grp.samples_size(); ++i) {
      const Trajectory& t = grp.samples(i);
      const std::string tp = absl::StrCat(gp, ".samples[", i, "]");
      const int P = t.prompt_token_ids_size(), R = t.response_token_ids_size();
      if (P == 0) return absl::InvalidArgumentError(tp + ".prompt_token_ids: empty");
      if (R == 0) return absl::InvalidArgumentError(tp + ".response_token_ids: empty");
      if (P + R > max_len) {
        return absl::InvalidArgumentError(absl::StrCat(tp, ": ", P + R,
                                                       " tokens exceed the model's max_positions ", max_len));
      }
      if (t.loss_mask_size() != 0 && t.loss_mask_size() != R) {
        return absl::InvalidArgumentError(tp + ".loss_mask: length differs from response_token_ids");
      }
      if (t.behaviour_logprobs_size() != 0 && t.behaviour_logprobs_size() != R) {
        return absl::InvalidArgumentError(tp + ".behaviour_logprobs: length differs from response_token_ids");
      }
      if (!std::isfinite(t.reward())) return absl::InvalidArgumentError(tp + ".reward: not finite");
      Row row;
      if (rl.routing_replay) {
        if (t.routes_size() == 0) {
          return absl::InvalidArgumentError(
              tp + ".routes: empty while rl.routing_replay is on (the rollout did not record its routing)");
        }
        RLMESH_RETURN_IF_ERROR(CheckRoutes(t, models.policy->config(), tp));
        row.routes.assign(t.routes().begin(), t.routes().end());
      }
      row.seq.ids.reserve(P + R);
      for (int id : t.prompt_token_ids()) row.seq.ids.push_back(id);
      for (int id : t.response_token_ids()) row.seq.ids.push_back(id);
      for (int64_t id : row.seq.ids) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat(tp, ": token id ", id, " outside the vocabulary"));
        }
      }
      const int64_t L = P + R;
      row.seq.mask.assign(L, 0.0f);
      row.seq.behaviour.assign(L, 0.0f);
      response_tokens += R;
      for (int j = 0; j < R; ++j) {
        row.seq.mask[P + j - 1] = t.loss_mask_size() == 0 ? 1.0f : (t.loss_mask(j) != 0 ? 1.0f : 0.0f);
        masked_out += row.seq.mask[P + j - 1] == 0.0f ? 1 : 0;
        if (t.behaviour_logprobs_size() != 0) row.seq.behaviour[P + j - 1] = t.behaviour_logprobs(j);
      }
      row.reward = t.reward();
      row.response_len = R;
      row.filtered = rl.overlong_filter && (t.finish_reason() == FINISH_REASON_LENGTH ||
                                            t.finish_reason() == FINISH_REASON_CONTEXT);
      raw_sum += t.reward();
      raw_sq += t.reward() * t.reward();
      len_sum += R;
      ++raw_n;
      rewards.push_back(t.reward());
      grows.push_back(std::move(row));
    }
    const auto [mn, mx] = std::minmax_element(rewards.begin(), rewards.end());
    const bool zero_variance = *mx - *mn <= 0.0;
    if (zero_variance) ++zero_var;
    if (zero_variance && rl.drop_zero_variance) continue;
    for (Row& r : grows) {
      overlong_filtered += r.filtered ? 1 : 0;
      r.group = kept_groups;
      rows.push_back(std::move(r));
    }
    group_rewards.push_back(std::move(rewards));
    ++kept_groups;
  }
  // A group's advantages need all its samples, so behaviour log-probs must
  // be all present or all absent in the batch.
  for (const auto& g : groups) {
    for (const auto& t : g.samples()) with_behaviour |= t.behaviour_logprobs_size() > 0;
  }

  m["reward_mean"] = raw_n ? raw_sum / raw_n : 0.0;
  m["reward_std"] = raw_n ? std::sqrt(std::max(0.0, raw_sq / raw_n - std::pow(raw_sum / raw_n, 2))) : 0.0;
  m["response_length_mean"] = raw_n ? len_sum / raw_n : 0.0;
  // Over every response token of the step (kept groups or not); 0 for
  // single-turn rollouts.
  m["response_masked_frac"] = response_tokens ? static_cast<double>(masked_out) / response_tokens : 0.0;
  m["zero_variance_frac"] = groups.empty() ? 0.0 : static_cast<double>(zero_var) / groups.size();
  m["groups"] = static_cast<double>(kept_groups);
  // Over the trained groups' responses; 0 when overlong_filter is off.
  m["overlong_filtered_frac"] = rows.empty() ? 0.0 : static_cast<double>(overlong_filtered) / rows.size();
  m["seconds_sample"] = seconds_sample;
  return absl::OkStatus();
}

// Row order (by length inside mini-batches where that saves padding), the
// padded batch, the packing of each micro-batch and the partition into
// mini- and micro-batches; padding metrics.
void RlStep::Layout() {
  B = rows.size();
  // Packed micro-batches (TrainerOptions.pack_rl) run a group's common
  // prompt once where that is cheaper (TrainerOptions.share_prompts),
  // except for MoE policies, whose rows each carry their own routes.
  moe = models.policy->config().NumMoeLayers() > 0;
  if (options.share_prompts && options.pack_rl != TrainerOptions::RlPacking::kOff && !moe) {
    sharing.pair_cost = PairCost(models.policy->config());
    std::vector<std::vector<const Seq*>> by_group(group_rewards.size());
    for (const Row& r : rows) by_group[r.group].push_back(&r.seq);
    for (const auto& g : by_group) whole_groups.push_back(PromptToShare(g, sharing.pair_cost) > 0);
  }
  members = SortRowsForMicroBatches(
      &rows, [](const Row& r) { return static_cast<int64_t>(r.seq.ids.size()); },
      [](const Row& r) { return r.group; }, static_cast<int64_t>(group_rewards.size()), rl.mini_batches,
      opt.learner.micro_tokens, whole_groups);
  m["rows_sorted"] = members.empty() ? 0.0 : 1.0;
  for (Row& r : rows) {
    seqs.push_back(r.seq);
    lengths.push_back(r.seq.ids.size());
    row_groups.push_back(r.group);
    routes.push_back(std::move(r.routes));
  }
  b = MakeBatch(seqs, with_behaviour);
  T_all = b.input_ids.size(1);
  m["tokens"] = static_cast<double>(b.tokens);

  if (!whole_groups.empty()) sharing.groups = &row_groups;
  // Partition: mini-batches of rows, micro-batches inside them. The same
  // micro-batches serve the no-grad pass and the first training pass, so
  // on-policy ratios are exactly 1.
  // A group whose prompt runs once stays in one micro-batch where it fits.
  std::vector<bool> together(B, false);
  for (int64_t r = 1; r < B && !whole_groups.empty(); ++r) {
    together[r] = whole_groups[row_groups[r]] && row_groups[r] == row_groups[r - 1];
  }
  for (int k = 0; k < rl.mini_batches; ++k) {
    const int64_t a = k * B / rl.mini_batches, e = (k + 1) * B / rl.mini_batches;
    minis.push_back(MicroBatches(lengths, a, e, opt.learner.micro_tokens, &together));
    // A pipeline idles less the more micro-batches a mini-batch has.
    if (opt.learner.pp > 1) minis.back() = AtLeastMicroBatches(minis.back(), opt.learner.pp_microbatches, &together);
  }
  // Padding: the share of the micro-batches' [rows, T] slots that are not
  // tokens of a row.
  double slots = 0, real = 0;
  int64_t packed_micro = 0, micro_count = 0, shared_rows = 0;
  for (const auto& micro : minis) {
    for (auto [a, e] : micro) {
      const PackedRows* p = Packing(a, e, Longest(a, e));
      slots += p != nullptr ? static_cast<double>(p->batch.input_ids.numel())
                            : static_cast<double>(e - a) * Longest(a, e);
      if (p != nullptr) {
        real += static_cast<double>(p->batch.tokens);
        shared_rows += p->shared_seqs;
      } else {
        for (int64_t r = a; r < e; ++r) real += lengths[r];
      }
      packed_micro += p != nullptr ? 1 : 0;
      ++micro_count;
    }
  }
  m["pad_frac"] = slots > 0 ? 1.0 - real / slots : 0.0;
  // Share of the rows whose prompt ran once for their group.
  m["shared_prompt_frac"] = B > 0 ? static_cast<double>(shared_rows) / B : 0.0;
  // Share of micro-batches whose policy forward ran packed.
  m["packed_frac"] = micro_count ? static_cast<double>(packed_micro) / micro_count : 0.0;
}

const PackedRows* RlStep::Packing(int64_t a, int64_t e, int64_t T) {
  if (options.pack_rl == TrainerOptions::RlPacking::kOff) return nullptr;
  auto [it, fresh] = packed.try_emplace({a, e});
  if (fresh) {
    PackedRows p = PackSeqs(seqs, a, e, T, sharing);
    const int64_t packed_slots = p.batch.input_ids.numel(), row_slots = (e - a) * T;
    if (options.pack_rl == TrainerOptions::RlPacking::kOn || packed_slots * 4 <= row_slots * 3) {
      it->second = std::move(p);
    }
  }
  return it->second ? &*it->second : nullptr;
}

void RlStep::StartRouting(std::optional<MoeForward>* f, int64_t a, int64_t e, int64_t T) {
  if (moe) f->emplace(models.PolicyModule(), rl.routing_replay ? &routes : nullptr, a, e, T, Packing(a, e, T));
}

at::Tensor RlStep::RealPositions(int64_t a, int64_t e, int64_t T) {
  at::Tensor len = at::tensor(std::vector<int64_t>(lengths.begin() + a, lengths.begin() + e), at::kLong);
  at::Tensor real = at::arange(T, at::kLong).unsqueeze(0).lt(len.unsqueeze(1)).to(at::kFloat);
  const PackedRows* p = Packing(a, e, T);
  return p != nullptr ? p->Pack(real.reshape({-1}), 0) : real;
}

absl::StatusOr<actor::TokenLogProbsOutput> RlStep::MicroLogProbs(actor::Transformer& model, int64_t a, int64_t e,
                                                                int64_t T) {
  const PipelineMicroBatch in = MicroInputs(a, e, T);
  RLMESH_ASSIGN_OR_RETURN(auto lp, models.LogProbs(model, in.ids, in.positions, in.targets, options.logprob_chunk,
                                                   opt.learner.temperature, in.attention_mask));
  return Unpacked(a, e, T, std::move(lp));
}

PipelineMicroBatch RlStep::MicroInputs(int64_t a, int64_t e, int64_t T) {
  const PackedRows* p = Packing(a, e, T);
  if (p == nullptr) return {Rows(b.input_ids, a, e, T), Rows(b.positions, a, e, T), Rows(b.targets, a, e, T), {}};
  return {p->batch.input_ids, p->batch.positions, p->batch.targets, p->batch.segments};
}

actor::TokenLogProbsOutput RlStep::Unpacked(int64_t a, int64_t e, int64_t T, actor::TokenLogProbsOutput lp) {
  const PackedRows* p = Packing(a, e, T);
  if (p == nullptr) return lp;
  lp.logprobs = p->Unpack(lp.logprobs);
  if (lp.entropy.defined()) lp.entropy = p->Unpack(lp.entropy);
  return lp;
}

at::Tensor RlStep::ContextShare(int64_t a, int64_t e, int64_t T) {
  const PackedRows* p = Packing(a, e, T);
  if (p == nullptr) return models.ContextMask(e - a, T);
  // Each unpacked position reads one packed position, which one rank holds.
  return p->Unpack(models.ContextMask(p->batch.input_ids.size(0), p->batch.input_ids.size(1)));
}

absl::Status RlStep::PipelinedOldLogProbs() {
  std::vector<PipelineMicroBatch> in;
  std::vector<std::array<int64_t, 3>> where;  // a, e, T
  for (const auto& micro : minis) {
    for (auto [a, e] : micro) {
      in.push_back(MicroInputs(a, e, Longest(a, e)));
      where.push_back({a, e, Longest(a, e)});
    }
  }
  auto fill = [&](PipelineModel& model, at::Tensor& dst) -> absl::Status {
    RLMESH_ASSIGN_OR_RETURN(auto out, model.LogProbs(in, opt.learner.temperature));
    for (size_t k = 0; k < out.size(); ++k) {
      const auto [a, e, T] = where[k];
      Rows(dst, a, e, T).copy_(Unpacked(a, e, T, std::move(out[k])).logprobs);
    }
    return absl::OkStatus();
  };
  if (!reuse_forward) RLMESH_RETURN_IF_ERROR(fill(*models.pp_policy, old_logp));
  if (models.pp_reference) RLMESH_RETURN_IF_ERROR(fill(*models.pp_reference, ref_logp));
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> RlStep::MicroValues(int64_t a, int64_t e, int64_t T) {
  const PackedRows* p = Packing(a, e, T);
  if (p == nullptr) return models.Values(models.critic, Rows(b.input_ids, a, e, T), Rows(b.positions, a, e, T));
  RLMESH_ASSIGN_OR_RETURN(at::Tensor v,
                          models.Values(models.critic, p->batch.input_ids, p->batch.positions, p->batch.segments));
  return p->Unpack(v);
}

absl::Status RlStep::OldLogProbs() {
  // Old log-probs (and reference log-probs, old values) without grad.
  // When every micro-batch is trained exactly once before the one update
  // (one epoch, one mini-batch), the training forward computes the same
  // log-probs bit for bit, so they are taken from it instead (detached)
  // and this pass is skipped: a quarter of the step's model FLOPs (15% of
  // the main job's learner time, bench/grpo_vs_trl.md). It stays
  // when something before the loop needs them: KL in the reward, a
  // mismatch mode that masks tokens (the loss weights depend on it), MoE
  // routing metrics; or when TrainerOptions asks for it.
  const bool masking_mismatch =
      rl.mismatch.mode == MismatchMode::kMis || rl.mismatch.mode == MismatchMode::kIcePop;
  // Under context parallelism the training forward gives each rank only
  // its own positions; the pass runs, and its results are shared.
  reuse_forward = !options.recompute_old_logprobs && rl.epochs == 1 && rl.mini_batches == 1 && !moe &&
                  !(models.reference && rl.kl_in_reward) && !(with_behaviour && masking_mismatch) &&
                  !models.cp_policy;
  m["old_logprobs_recomputed"] = reuse_forward ? 0.0 : 1.0;
  t_forward = Clock::now();
  int64_t replay_differs = 0, replay_positions = 0;
  old_logp = at::zeros({B, T_all}, at::kFloat);
  if (models.reference) ref_logp = at::zeros({B, T_all}, at::kFloat);
  if (models.teacher) teacher_logp = at::zeros({B, T_all}, at::kFloat);
  if (models.critic) old_values = at::zeros({B, T_all}, at::kFloat);
  {
    at::NoGradGuard no_grad;
    if (models.pp_policy) return PipelinedOldLogProbs();
    if (models.AlignedPasses() && (!reuse_forward || models.sharded_critic)) {
      // ZeRO-3 and EP: as many policy (and sharded critic) forwards as the
      // rank with the most micro-batches (the collectives must match).
      int64_t mine = 0;
      for (const auto& micro : minis) mine += static_cast<int64_t>(micro.size());
      RLMESH_ASSIGN_OR_RETURN(const int64_t passes, models.MaxOverGroup(mine));
      for (int64_t k = mine; k < passes; ++k) {
        RLMESH_RETURN_IF_ERROR(models.EmptyPolicyPass(false, /*with_policy=*/!reuse_forward));
      }
    }
    for (const auto& micro : minis) {
      for (auto [a, e] : micro) {
        const int64_t T = Longest(a, e);
        if (!reuse_forward) {
          std::optional<MoeForward> routing;
          StartRouting(&routing, a, e, T);
          RLMESH_ASSIGN_OR_RETURN(auto lp, MicroLogProbs(models.policy, a, e, T));
          if (routing) {
            auto [differs, replayed] = routing->Mismatch();
            replay_differs += differs;
            replay_positions += replayed;
          }
          routing.reset();
          Rows(old_logp, a, e, T).copy_(lp.logprobs);
        }
        if (models.reference) {
          RLMESH_ASSIGN_OR_RETURN(auto rlp, MicroLogProbs(models.reference, a, e, T));
          Rows(ref_logp, a, e, T).copy_(rlp.logprobs);
        }
        if (models.teacher) {
          RLMESH_ASSIGN_OR_RETURN(auto tlp, MicroLogProbs(models.teacher, a, e, T));
          Rows(teacher_logp, a, e, T).copy_(tlp.logprobs);
        }
        if (models.critic) {
          RLMESH_ASSIGN_OR_RETURN(at::Tensor v, MicroValues(a, e, T));
          Rows(old_values, a, e, T).copy_(v);
        }
      }
    }
  }
  // Context parallelism: each rank filled its own positions.
  RLMESH_RETURN_IF_ERROR(models.ShareContextTokens(old_logp));
  if (models.reference) RLMESH_RETURN_IF_ERROR(models.ShareContextTokens(ref_logp));
  if (models.teacher) RLMESH_RETURN_IF_ERROR(models.ShareContextTokens(teacher_logp));
  if (rl.routing_replay) {
    // Positions whose replayed experts are not what the learner's router
    // would pick at the step's start (0 on-policy with equal numerics).
    m["routing_replay_mismatch_frac"] =
        replay_positions ? static_cast<double>(replay_differs) / replay_positions : 0.0;
  }
  return absl::OkStatus();
}

// The tokens in the loss (less over-long rows and, in a masking mismatch
// mode, the tokens it drops) and the mismatch weights over whole rows.
absl::Status RlStep::LossMask() {
  mask = b.mask;
  // Rollout/learner mismatch: the weights are fixed for the step (old_logp
  // and the behaviour log-probs are), so they are computed once over whole
  // rows (sequence level needs every token of a row) -- or, when the
  // training forward supplies old_logp, per micro-batch of whole rows in
  // the loop (no mode that masks, so loss_mask does not depend on them).
  loss_mask = mask;
  if (with_behaviour && !reuse_forward) {
    RLMESH_ASSIGN_OR_RETURN(MismatchWeights mw, CorrectMismatch(old_logp, b.behaviour, mask));
    is_weight = mw.weight;
    loss_mask = mw.keep.to(mask.scalar_type());
  }
  if (rl.overlong_filter && B > 0) {
    at::Tensor row_on = at::ones({B, 1}, mask.scalar_type());
    for (int64_t r = 0; r < B; ++r) {
      if (rows[r].filtered) row_on[r][0] = 0;
    }
    loss_mask = loss_mask * row_on;
  }
  return absl::OkStatus();
}

absl::StatusOr<MismatchWeights> RlStep::CorrectMismatch(const at::Tensor& old, const at::Tensor& behaviour,
                                                        const at::Tensor& mk) {
  const std::string id = absl::StrCat(late_mismatch.size());
  LateMismatch later;
  if (old.size(0) > 0) {
    later.diff = "behaviour_diff/" + id;
    late.Add(later.diff, ((old - behaviour).abs() * mk).max());
  }
  RLMESH_ASSIGN_OR_RETURN(MismatchWeights mw, MismatchCorrection(old, behaviour, mk, rl.mismatch));
  later.weight = "mismatch_weight/" + id;
  late.Add(later.weight, mk.sum());
  later.metrics = std::move(mw.metrics);
  late_mismatch.push_back(std::move(later));
  return mw;
}

absl::Status RlStep::AddDistillation(at::Tensor* advantages, const at::Tensor& teacher, const at::Tensor& old,
                                     const at::Tensor& mk) {
  RLMESH_ASSIGN_OR_RETURN(DistillationTerms d, DistillationAdvantages(teacher, old, mk, rl.distill.coef));
  *advantages = *advantages + d.advantages;
  distill_means.Add(d.metrics, d.tokens);
  return absl::OkStatus();
}

at::Tensor RlStep::WeightOf(const at::Tensor& mk) const {
  switch (rl.loss.agg) {
    case LossAgg::kTokenMean:
      return mk.sum();
    case LossAgg::kSeqMeanTokenMean:
      return mk.sum(1).gt(0).sum();
    default:
      return at::scalar_tensor(static_cast<double>(mk.size(0)), mk.options().dtype(at::kDouble));
  }
}

std::vector<double> RlStep::MicroWeights(const std::vector<std::pair<int64_t, int64_t>>& micro) const {
  DeviceMetrics dm;
  for (size_t k = 0; k < micro.size(); ++k) {
    const auto [a, e] = micro[k];
    dm.Add(absl::StrCat(k), WeightOf(Rows(loss_mask, a, e, Longest(a, e))));
  }
  std::map<std::string, double> read;
  dm.ReadInto(&read);
  std::vector<double> out;
  for (size_t k = 0; k < micro.size(); ++k) out.push_back(read.at(absl::StrCat(k)));
  return out;
}

void RlStep::ReadLate() {
  std::map<std::string, double> read;
  late.ReadInto(&read);
  // In call order, as the values were once folded in one by one.
  for (const LateMismatch& l : late_mismatch) {
    if (!l.diff.empty()) behaviour_diff = std::max(behaviour_diff, read.at(l.diff));
    mismatch_means.Add(l.metrics, read.at(l.weight));
  }
  if (read.count("overlong_penalty_mean")) m["overlong_penalty_mean"] = read.at("overlong_penalty_mean");
  std::map<std::string, double> aux;
  late_aux.ReadInto(&aux);
  for (size_t k = 0; k < aux_weights.size(); ++k) {
    means.Add({{"router_aux_loss", aux.at(absl::StrCat(k))}}, aux_weights[k]);
  }
}

// Per-token KL, rewards with over-long shaping, and the advantages [B, T_all]
// (plus the teacher's term when distilling).
absl::Status RlStep::Advantages() {
  // Per-token KL for rewards (KL in the reward).
  at::Tensor kl_tokens;
  if (models.reference && rl.kl_in_reward) {
    RLMESH_ASSIGN_OR_RETURN(kl_tokens, KlPenalty(old_logp, ref_logp, rl.kl_estimator));
    kl_tokens = kl_tokens * mask;
  }

  // Rewards with DAPO overlong shaping.
  at::Tensor rewards = at::zeros({B}, at::kDouble);
  for (int64_t r = 0; r < B; ++r) rewards[r] = rows[r].reward;
  if (rl.overlong_buffer > 0 && B > 0) {
    at::Tensor lens = at::zeros({B}, at::kLong);
    for (int64_t r = 0; r < B; ++r) lens[r] = rows[r].response_len;
    RLMESH_ASSIGN_OR_RETURN(at::Tensor pen, OverlongPenalty(lens, opt.learner.max_new_tokens, rl.overlong_buffer,
                                                            rl.overlong_penalty));
    rewards = rewards + pen.to(at::kDouble);
    late.Add("overlong_penalty_mean", pen.mean());
  }
  rewards = rewards.to(at::kFloat);

  // Advantages [B, T_all].
  const GlobalSum global_sum = [&](at::Tensor& t) { return models.AllReduceSum(t); };
  distill = models.teacher && rl.distill.on();
  if (distill && !rl.distill.task_reward) {
    // Pure distillation: the teacher's per-token term is the whole
    // advantage (added below); the rewards are only logged.
    adv = at::zeros({B, T_all}, at::kFloat);
  } else if (B == 0) {
    adv = at::zeros({0, T_all}, at::kFloat);
    const bool whitened =
        rl.advantage == Advantage::kReinforcePp || (rl.advantage == Advantage::kPpo && rl.gae.whiten);
    if (world > 1 && whitened) {
      // The other ranks whiten over the global batch: take part in the
      // same two sums with nothing, and fail as they do when it is empty.
      at::Tensor first = at::zeros({2}, at::kDouble), second = at::zeros({1}, at::kDouble);
      RLMESH_RETURN_IF_ERROR(global_sum(first));
      const double masked = first[1].item<double>();  // once a step, on a rank with no rows
      if (masked < 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("mask: whitening needs at least 2 masked tokens, got ", masked));
      }
      RLMESH_RETURN_IF_ERROR(global_sum(second));
    }
  } else if (rl.advantage == Advantage::kGrpo || rl.advantage == Advantage::kDrGrpo ||
             rl.advantage == Advantage::kRloo) {
    at::Tensor seq_r = rewards.clone();
    if (kl_tokens.defined()) seq_r = seq_r - rl.kl_coef * kl_tokens.sum(1);
    at::Tensor seq_adv = at::zeros({B}, at::kFloat);
    int64_t r0 = 0;
    for (size_t g = 0; g < group_rewards.size(); ++g) {
      const int64_t n = group_rewards[g].size();
      // A group's rows: contiguous from r0, or where the sort put them.
      const at::Tensor at_rows = members.empty() ? at::arange(r0, r0 + n, at::kLong)
                                                 : at::tensor(members[g], at::kLong);
      at::Tensor gr = seq_r.index_select(0, at_rows).unsqueeze(0);
      absl::StatusOr<at::Tensor> a;
      if (n == 1) {
        a = at::zeros({1, 1}, at::kFloat);  // no baseline from one sample
      } else if (rl.advantage == Advantage::kRloo) {
        a = RlooAdvantages(gr);
      } else {
        a = GrpoAdvantages(gr, rl.advantage == Advantage::kGrpo);
      }
      if (!a.ok()) return a.status();
      seq_adv.index_copy_(0, at_rows, a->reshape({n}));
      r0 += n;
    }
    RLMESH_ASSIGN_OR_RETURN(adv, ExpandToTokens(seq_adv, mask));
  } else if (rl.advantage == Advantage::kReinforcePp) {
    // Whitened over the global batch: every rank's tokens, not its slice.
    RLMESH_ASSIGN_OR_RETURN(adv, ReinforcePlusPlusAdvantages(rewards, mask, kl_tokens,
                                                             kl_tokens.defined() ? rl.kl_coef : 0.0,
                                                             /*gamma=*/1.0, global_sum));
  } else {  // ppo
    GaeOptions gae = rl.gae;
    gae.kl_coef = kl_tokens.defined() ? rl.kl_coef : 0.0;
    gae.global_sum = global_sum;
    RLMESH_ASSIGN_OR_RETURN(GaeResult res, GaeAdvantages(rewards, old_values, mask, gae, kl_tokens));
    adv = res.advantages;
    returns = res.returns;
  }

  // On-policy distillation: A_t += coef * (teacher - old) on the response
  // tokens. With old_logp from the training forward this happens per
  // micro-batch in the loop (old_logp is fixed for the step either way).
  if (distill && !reuse_forward) RLMESH_RETURN_IF_ERROR(AddDistillation(&adv, teacher_logp, old_logp, mask));
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> RlStep::MicroLoss(int64_t a, int64_t e, int64_t T, double w, double mini_w,
                                             const actor::TokenLogProbsOutput& lp, const at::Tensor& aux) {
  at::Tensor mk = Rows(loss_mask, a, e, T);
  // Context parallelism: this rank's positions only, weighed against its
  // share (1/C) of the mini-batch (learner/context_parallel.h).
  const int C = models.ContextRanks();
  if (C > 1) {
    mk = mk * ContextShare(a, e, T);
    w = mk.sum().item<double>();
    mini_w /= C;
  }
  PolicyLossInputs in;
  in.logp = lp.logprobs;
  in.old_logp = reuse_forward ? lp.logprobs.detach() : Rows(old_logp, a, e, T);
  in.advantages = Rows(adv, a, e, T);
  if (distill && reuse_forward) {
    RLMESH_RETURN_IF_ERROR(
        AddDistillation(&in.advantages, Rows(teacher_logp, a, e, T), in.old_logp, Rows(mask, a, e, T)));
  }
  in.mask = mk;
  if (with_behaviour && reuse_forward) {
    RLMESH_ASSIGN_OR_RETURN(MismatchWeights mw,
                            CorrectMismatch(in.old_logp, Rows(b.behaviour, a, e, T), Rows(mask, a, e, T)));
    in.is_weight = mw.weight;
  } else if (with_behaviour) {
    in.is_weight = Rows(is_weight, a, e, T);
  }
  if (models.reference) in.ref_logp = Rows(ref_logp, a, e, T);
  in.entropy = rl.loss.entropy_coef > 0 ? lp.entropy : lp.entropy.detach();
  RLMESH_ASSIGN_OR_RETURN(LossOutput out, PolicyLoss(in, rl.loss));
  at::Tensor total = out.loss * (w / mini_w);
  if (aux.defined()) {
    // Weighted like the policy loss: by the micro-batch's share.
    if (rl.router_aux_loss_coef > 0) total = total + rl.router_aux_loss_coef * aux * (w / mini_w);
    late_aux.Add(absl::StrCat(aux_weights.size()), aux);  // read with the step's metrics
    aux_weights.push_back(w);
  }
  if (models.critic) {
    RLMESH_ASSIGN_OR_RETURN(at::Tensor values, MicroValues(a, e, T));
    RLMESH_ASSIGN_OR_RETURN(LossOutput vo, ValueLoss(values, Rows(old_values, a, e, T),
                                                     Rows(returns, a, e, T), mk, rl.value_clip,
                                                     rl.loss.agg));
    total = total + rl.vf_coef * vo.loss * (w / mini_w);
    out.metrics["value_loss"] = vo.metrics["vf_loss"];
    out.metrics["value_mean"] = vo.metrics["value_mean"];
    out.metrics["value_clip_frac"] = vo.metrics["vf_clip_frac"];
    out.metrics["return_mean"] = vo.metrics["return_mean"];
  }
  means.Add(out.metrics, w);
  mean_weight += w;
  return total;
}

// Epochs x mini-batches: each micro-batch's forward, loss and backward (the
// loss weighted by its share of the mini-batch), then one optimizer step of
// the policy (and the critic) per mini-batch.
absl::Status RlStep::TrainLoop() {
  for (int epoch = 0; epoch < rl.epochs; ++epoch) {
    for (const auto& micro : minis) {
      const auto t1 = Clock::now();
      // One read for the mini-batch: every micro-batch's weight is needed
      // before the first backward (the loss is scaled by w / mini_w).
      const std::vector<double> weights = MicroWeights(micro);
      double mini_w = 0;
      for (double w : weights) mini_w += w;
      // A context-parallel rank weighs 1/C of its replica's tokens.
      const double local_w = mini_w / models.ContextRanks();
      RLMESH_RETURN_IF_ERROR(models.ZeroGradPolicy(local_w));
      RLMESH_RETURN_IF_ERROR(models.ZeroGradCritic(mini_w));
      if (models.AlignedPasses()) {
        // ZeRO-3 and EP: as many forward/backward passes as the rank with the
        // most micro-batches in this mini-batch.
        RLMESH_ASSIGN_OR_RETURN(const int64_t passes,
                                models.MaxOverGroup(static_cast<int64_t>(micro.size())));
        for (int64_t k = static_cast<int64_t>(micro.size()); k < passes; ++k) {
          RLMESH_RETURN_IF_ERROR(models.EmptyPolicyPass(true));
        }
      }
      if (models.pp_policy && mini_w > 0) {
        // The pipeline's 1F1B schedule; the last stage asks for the losses.
        std::vector<PipelineMicroBatch> in;
        for (auto [a, e] : micro) in.push_back(MicroInputs(a, e, Longest(a, e)));
        RLMESH_RETURN_IF_ERROR(models.pp_policy->Train(
            in, opt.learner.temperature,
            [&](size_t k, const actor::TokenLogProbsOutput& out) -> absl::StatusOr<at::Tensor> {
              const auto [a, e] = micro[k];
              const int64_t T = Longest(a, e);
              actor::TokenLogProbsOutput lp = Unpacked(a, e, T, out);
              if (weights[k] == 0) return lp.logprobs.sum() * 0;  // nothing to learn; the schedule goes on
              return MicroLoss(a, e, T, weights[k], mini_w, lp, at::Tensor());
            }));
      }
      for (size_t k = 0; k < micro.size() && !models.pp_policy; ++k) {
        const auto [a, e] = micro[k];
        const int64_t T = Longest(a, e);
        const double w = weights[k];
        if (w == 0) {
          RLMESH_RETURN_IF_ERROR(models.EmptyPolicyPass(true));  // no-op unless ZeRO-3 or EP
          continue;
        }
        std::optional<MoeForward> routing;
        StartRouting(&routing, a, e, T);
        RLMESH_ASSIGN_OR_RETURN(auto lp, MicroLogProbs(models.policy, a, e, T));
        at::Tensor aux;
        if (routing) aux = routing->AuxLoss(RealPositions(a, e, T));
        routing.reset();
        RLMESH_ASSIGN_OR_RETURN(at::Tensor total, MicroLoss(a, e, T, w, mini_w, lp, aux));
        total.backward();
      }
      fb_seconds += Since(t1);
      const auto t2 = Clock::now();
      lr = LearningRate(opt.optimizer().schedule, models.PolicySteps());
      auto stats = models.StepPolicy(local_w, lr);
      if (!stats.ok() && mini_w == 0 && stats.status().code() == absl::StatusCode::kInvalidArgument) {
        // Nothing to learn from on any rank (e.g. every group dropped as
        // zero-variance): the global weight is 0 and no update happens.
        ++skipped;
        opt_seconds += Since(t2);
        continue;
      }
      if (!stats.ok()) return stats.status();
      grad_norm_sum += stats->grad_norm;
      skipped += stats->skipped ? 1 : 0;
      if (models.critic) {
        const double clr = LearningRate(rl.critic_optimizer.schedule, models.CriticSteps());
        auto cst = models.StepCritic(mini_w, clr);
        if (!cst.ok()) return cst.status();
        value_grad_norm_sum += cst->grad_norm;
      }
      ++opt_steps;
      opt_seconds += Since(t2);
    }
  }
  return absl::OkStatus();
}

// The loop's means, the mismatch and distillation metrics, and names
// present on every step.
void RlStep::Metrics() {
  ReadLate();
  std::map<std::string, double> vals;
  means.Into(&vals);
  if (with_behaviour) {
    m["behaviour_logp_abs_diff_max"] = behaviour_diff;
    mismatch_means.Into(&vals);
    vals["is_capped_frac"] = vals["mismatch_truncated_frac"];
  }
  if (distill) distill_means.Into(&vals);
  for (auto& [k, v] : vals) m[k] = v;
  // Stable names present on every step (0 when the term is off).
  for (const char* k : {"loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio_mean", "mismatch_kl",
                        "mismatch_k1", "mismatch_abs_diff", "mismatch_masked_frac", "mismatch_truncated_frac"}) {
    if (!m.count(k)) m[k] = 0.0;
  }
  if (!m.count("mismatch_weight_mean")) m["mismatch_weight_mean"] = 1.0;
  if (distill) {
    for (const char* k : {"distill_reverse_kl", "distill_reverse_kl_k3", "distill_teacher_logp"}) {
      if (!m.count(k)) m[k] = 0.0;
    }
  }
  m["grad_norm"] = opt_steps ? grad_norm_sum / opt_steps : 0.0;
  if (models.critic) m["value_grad_norm"] = opt_steps ? value_grad_norm_sum / opt_steps : 0.0;
  m["lr"] = lr;
  m["mean_weight"] = mean_weight;
  m["optimizer_steps"] = static_cast<double>(opt_steps);
  m["skipped"] = static_cast<double>(skipped);
}

}  // namespace

absl::StatusOr<TrainStepResponse> Trainer::TrainRl(std::vector<TrajectoryGroup> groups,
                                                   double seconds_sample) {
  State& s = *s_;
  const auto t_start = Clock::now();
  TrainStepResponse resp;
  auto& m = *resp.mutable_metrics()->mutable_values();
  {
    // The step's tensors go before the status is published.
    RlStep step(options_, s.opt, s.world, s.models, m);
    RLMESH_RETURN_IF_ERROR(step.Sample(groups, seconds_sample));
    absl::Status st = CatchAll("rl step", [&]() -> absl::Status {
      step.Layout();
      RLMESH_RETURN_IF_ERROR(step.OldLogProbs());
      RLMESH_RETURN_IF_ERROR(step.LossMask());
      RLMESH_RETURN_IF_ERROR(step.Advantages());
      step.fb_seconds += Since(step.t_forward);
      RLMESH_RETURN_IF_ERROR(step.TrainLoop());
      // CP: each rank's means were over its own positions.
      RLMESH_RETURN_IF_ERROR(s.models.ShareContextMeans(&step.means, &step.mean_weight));
      step.Metrics();
      // PP: the loss and its metrics were the last stage's.
      RLMESH_RETURN_IF_ERROR(s.models.ShareLastStageMetrics(&m));
      // ZeRO-3: rank 0's full weights for weight sync and checkpoints.
      return s.models.SyncPolicy();
    });
    if (!st.ok()) return st;
    m["seconds_forward_backward"] = step.fb_seconds;
    m["seconds_optimizer"] = step.opt_seconds;
  }
  const double total = Since(t_start);
  m["tokens_per_second"] = total > 0 ? m["tokens"] * s.opt.rl.epochs / total : 0.0;
  return FinishStep(std::move(resp), /*new_policy=*/true);
}

}  // namespace rlmesh::learner
