// Trainer::TrainRl: one GRPO-family or PPO step on a shard's groups (advantages,
// epochs x mini-batches of the clipped policy loss, the critic for PPO).

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
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

}  // namespace

absl::StatusOr<TrainStepResponse> Trainer::TrainRl(std::vector<TrajectoryGroup> groups,
                                                   double seconds_sample) {
  State& s = *s_;
  const RlOptions& rl = s.opt.rl;
  const auto t_start = Clock::now();
  const int64_t vocab = s.models.policy->config().vocab_size;
  const int64_t max_len = s.models.policy->config().max_positions;

  // Validate and tokenise; rewards per group (with overlong shaping).
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
        RLMESH_RETURN_IF_ERROR(CheckRoutes(t, s.models.policy->config(), tp));
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
  bool with_behaviour = false;
  for (const auto& g : groups) {
    for (const auto& t : g.samples()) with_behaviour |= t.behaviour_logprobs_size() > 0;
  }

  TrainStepResponse resp;
  auto& m = *resp.mutable_metrics()->mutable_values();
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
  double fb_seconds = 0, opt_seconds = 0;

  absl::Status st = CatchAll("rl step", [&]() -> absl::Status {
    const int64_t B = rows.size();
    // Packed micro-batches (TrainerOptions.pack_rl) run a group's common
    // prompt once where that is cheaper (TrainerOptions.share_prompts),
    // except for MoE policies, whose rows each carry their own routes.
    const bool moe = s.models.policy->config().NumMoeLayers() > 0;
    PrefixSharing sharing;
    std::vector<bool> whole_groups;
    if (options_.share_prompts && options_.pack_rl != TrainerOptions::RlPacking::kOff && !moe) {
      sharing.pair_cost = PairCost(s.models.policy->config());
      std::vector<std::vector<const Seq*>> by_group(group_rewards.size());
      for (const Row& r : rows) by_group[r.group].push_back(&r.seq);
      for (const auto& g : by_group) whole_groups.push_back(PromptToShare(g, sharing.pair_cost) > 0);
    }
    // members[g]: the rows of kept group g, in the group's sample order.
    std::vector<std::vector<int64_t>> members = SortRowsForMicroBatches(
        &rows, [](const Row& r) { return static_cast<int64_t>(r.seq.ids.size()); },
        [](const Row& r) { return r.group; }, static_cast<int64_t>(group_rewards.size()), rl.mini_batches,
        s.opt.learner.micro_tokens, whole_groups);
    m["rows_sorted"] = members.empty() ? 0.0 : 1.0;
    std::vector<Seq> seqs;
    std::vector<int64_t> lengths, row_groups;
    std::vector<std::vector<int32_t>> routes;
    for (Row& r : rows) {
      seqs.push_back(r.seq);
      lengths.push_back(r.seq.ids.size());
      row_groups.push_back(r.group);
      routes.push_back(std::move(r.routes));
    }
    int64_t replay_differs = 0, replay_positions = 0;
    Batch b = MakeBatch(seqs, with_behaviour);
    const int64_t T_all = b.input_ids.size(1);
    m["tokens"] = static_cast<double>(b.tokens);

    // Packed micro-batches, built once per [a, e) and used by every
    // policy-side forward of it; null = rows.
    std::map<std::pair<int64_t, int64_t>, std::optional<PackedRows>> packed;
    if (!whole_groups.empty()) sharing.groups = &row_groups;
    auto packing = [&](int64_t a, int64_t e, int64_t T) -> const PackedRows* {
      if (options_.pack_rl == TrainerOptions::RlPacking::kOff) return nullptr;
      auto [it, fresh] = packed.try_emplace({a, e});
      if (fresh) {
        PackedRows p = PackSeqs(seqs, a, e, T, sharing);
        const int64_t packed_slots = p.batch.input_ids.numel(), row_slots = (e - a) * T;
        if (options_.pack_rl == TrainerOptions::RlPacking::kOn || packed_slots * 4 <= row_slots * 3) {
          it->second = std::move(p);
        }
      }
      return it->second ? &*it->second : nullptr;
    };
    // MoE policies: every policy forward records the router logits (the
    // load-balancing loss and its metric) and, under rl.routing_replay,
    // replays the rollout's experts, placed as the micro-batch is (padded
    // rows or packed). The reference and the critic route freely
    // (docs/design/model.md).
    auto start_routing = [&](std::optional<MoeForward>* f, int64_t a, int64_t e, int64_t T) {
      if (moe) f->emplace(s.models.PolicyModule(), rl.routing_replay ? &routes : nullptr, a, e, T, packing(a, e, T));
    };
    // 1 at the real (unpadded) positions of rows [a, e): [e - a, T], or
    // [R * W] when the micro-batch is packed.
    auto real_positions = [&](int64_t a, int64_t e, int64_t T) {
      at::Tensor len = at::tensor(std::vector<int64_t>(lengths.begin() + a, lengths.begin() + e), at::kLong);
      at::Tensor real = at::arange(T, at::kLong).unsqueeze(0).lt(len.unsqueeze(1)).to(at::kFloat);
      const PackedRows* p = packing(a, e, T);
      return p != nullptr ? p->Pack(real.reshape({-1}), 0) : real;
    };
    // Per-token log-probs (and entropies) of micro-batch [a, e) under
    // `model`, as [e - a, T] rows whatever the layout.
    auto micro_logprobs = [&](actor::Transformer& model, int64_t a, int64_t e,
                              int64_t T) -> absl::StatusOr<actor::TokenLogProbsOutput> {
      const PackedRows* p = packing(a, e, T);
      if (p == nullptr) {
        return s.models.LogProbs(model, Rows(b.input_ids, a, e, T), Rows(b.positions, a, e, T),
                                 Rows(b.targets, a, e, T), options_.logprob_chunk, s.opt.learner.temperature);
      }
      RLMESH_ASSIGN_OR_RETURN(auto lp, s.models.LogProbs(model, p->batch.input_ids, p->batch.positions,
                                                         p->batch.targets, options_.logprob_chunk,
                                                         s.opt.learner.temperature, p->batch.segments));
      lp.logprobs = p->Unpack(lp.logprobs);
      if (lp.entropy.defined()) lp.entropy = p->Unpack(lp.entropy);
      return lp;
    };

    // The critic's values of micro-batch [a, e), [e - a, T], packed as the
    // policy's log-probs are.
    auto micro_values = [&](int64_t a, int64_t e, int64_t T) -> absl::StatusOr<at::Tensor> {
      const PackedRows* p = packing(a, e, T);
      if (p == nullptr) return s.models.Values(s.models.critic, Rows(b.input_ids, a, e, T), Rows(b.positions, a, e, T));
      RLMESH_ASSIGN_OR_RETURN(at::Tensor v, s.models.Values(s.models.critic, p->batch.input_ids, p->batch.positions,
                                                            p->batch.segments));
      return p->Unpack(v);
    };

    // Partition: mini-batches of rows, micro-batches inside them. The same
    // micro-batches serve the no-grad pass and the first training pass, so
    // on-policy ratios are exactly 1.
    // A group whose prompt runs once stays in one micro-batch where it fits.
    std::vector<bool> together(B, false);
    for (int64_t r = 1; r < B && !whole_groups.empty(); ++r) {
      together[r] = whole_groups[row_groups[r]] && row_groups[r] == row_groups[r - 1];
    }
    std::vector<std::vector<std::pair<int64_t, int64_t>>> minis;
    for (int k = 0; k < rl.mini_batches; ++k) {
      const int64_t a = k * B / rl.mini_batches, e = (k + 1) * B / rl.mini_batches;
      minis.push_back(MicroBatches(lengths, a, e, s.opt.learner.micro_tokens, &together));
    }
    auto longest = [&](int64_t a, int64_t e) {
      return *std::max_element(lengths.begin() + a, lengths.begin() + e);
    };
    // Padding: the share of the micro-batches' [rows, T] slots that are not
    // tokens of a row.
    double slots = 0, real = 0;
    int64_t packed_micro = 0, micro_count = 0, shared_rows = 0;
    for (const auto& micro : minis) {
      for (auto [a, e] : micro) {
        const PackedRows* p = packing(a, e, longest(a, e));
        slots += p != nullptr ? static_cast<double>(p->batch.input_ids.numel())
                              : static_cast<double>(e - a) * longest(a, e);
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
    const bool reuse_forward = !options_.recompute_old_logprobs && rl.epochs == 1 && rl.mini_batches == 1 &&
                               !moe && !(s.models.reference && rl.kl_in_reward) &&
                               !(with_behaviour && masking_mismatch);
    m["old_logprobs_recomputed"] = reuse_forward ? 0.0 : 1.0;
    const auto t0 = Clock::now();
    at::Tensor old_logp = at::zeros({B, T_all}, at::kFloat);
    at::Tensor ref_logp, old_values, teacher_logp;
    if (s.models.reference) ref_logp = at::zeros({B, T_all}, at::kFloat);
    if (s.models.teacher) teacher_logp = at::zeros({B, T_all}, at::kFloat);
    if (s.models.critic) old_values = at::zeros({B, T_all}, at::kFloat);
    {
      torch::NoGradGuard no_grad;
      if (s.models.AlignedPasses() && (!reuse_forward || s.models.sharded_critic)) {
        // ZeRO-3 and EP: as many policy (and sharded critic) forwards as the
        // rank with the most micro-batches (the collectives must match).
        int64_t mine = 0;
        for (const auto& micro : minis) mine += static_cast<int64_t>(micro.size());
        RLMESH_ASSIGN_OR_RETURN(const int64_t passes, s.models.MaxOverGroup(mine));
        for (int64_t k = mine; k < passes; ++k) {
          RLMESH_RETURN_IF_ERROR(s.models.EmptyPolicyPass(false, /*with_policy=*/!reuse_forward));
        }
      }
      for (const auto& micro : minis) {
        for (auto [a, e] : micro) {
          const int64_t T = longest(a, e);
          if (!reuse_forward) {
            std::optional<MoeForward> routing;
            start_routing(&routing, a, e, T);
            RLMESH_ASSIGN_OR_RETURN(auto lp, micro_logprobs(s.models.policy, a, e, T));
            if (routing) {
              auto [differs, replayed] = routing->Mismatch();
              replay_differs += differs;
              replay_positions += replayed;
            }
            routing.reset();
            Rows(old_logp, a, e, T).copy_(lp.logprobs);
          }
          if (s.models.reference) {
            RLMESH_ASSIGN_OR_RETURN(auto rlp, micro_logprobs(s.models.reference, a, e, T));
            Rows(ref_logp, a, e, T).copy_(rlp.logprobs);
          }
          if (s.models.teacher) {
            RLMESH_ASSIGN_OR_RETURN(auto tlp, micro_logprobs(s.models.teacher, a, e, T));
            Rows(teacher_logp, a, e, T).copy_(tlp.logprobs);
          }
          if (s.models.critic) {
            RLMESH_ASSIGN_OR_RETURN(at::Tensor v, micro_values(a, e, T));
            Rows(old_values, a, e, T).copy_(v);
          }
        }
      }
    }
    at::Tensor mask = b.mask;
    if (rl.routing_replay) {
      // Positions whose replayed experts are not what the learner's router
      // would pick at the step's start (0 on-policy with equal numerics).
      m["routing_replay_mismatch_frac"] =
          replay_positions ? static_cast<double>(replay_differs) / replay_positions : 0.0;
    }
    // Rollout/learner mismatch: the weights are fixed for the step (old_logp
    // and the behaviour log-probs are), so they are computed once over whole
    // rows (sequence level needs every token of a row) -- or, when the
    // training forward supplies old_logp, per micro-batch of whole rows in
    // the loop (no mode that masks, so loss_mask does not depend on them).
    at::Tensor is_weight;
    at::Tensor loss_mask = mask;
    double behaviour_diff = 0;
    MetricMeans mismatch_means;  // token-weighted over micro-batches (reuse_forward)
    auto correct_mismatch = [&](const at::Tensor& old, const at::Tensor& behaviour,
                                const at::Tensor& mk) -> absl::StatusOr<MismatchWeights> {
      if (old.size(0) > 0) behaviour_diff = std::max(behaviour_diff, ((old - behaviour).abs() * mk).max().item<double>());
      RLMESH_ASSIGN_OR_RETURN(MismatchWeights mw, MismatchCorrection(old, behaviour, mk, rl.mismatch));
      mismatch_means.Add(mw.metrics, mk.sum().item<double>());
      return mw;
    };
    if (with_behaviour && !reuse_forward) {
      RLMESH_ASSIGN_OR_RETURN(MismatchWeights mw, correct_mismatch(old_logp, b.behaviour, mask));
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

    // Per-token KL for rewards (KL in the reward).
    at::Tensor kl_tokens;
    if (s.models.reference && rl.kl_in_reward) {
      RLMESH_ASSIGN_OR_RETURN(kl_tokens, KlPenalty(old_logp, ref_logp, rl.kl_estimator));
      kl_tokens = kl_tokens * mask;
    }

    // Rewards with DAPO overlong shaping.
    at::Tensor rewards = at::zeros({B}, at::kDouble);
    for (int64_t r = 0; r < B; ++r) rewards[r] = rows[r].reward;
    if (rl.overlong_buffer > 0 && B > 0) {
      at::Tensor lens = at::zeros({B}, at::kLong);
      for (int64_t r = 0; r < B; ++r) lens[r] = rows[r].response_len;
      RLMESH_ASSIGN_OR_RETURN(at::Tensor pen, OverlongPenalty(lens, s.opt.learner.max_new_tokens, rl.overlong_buffer,
                                                              rl.overlong_penalty));
      rewards = rewards + pen.to(at::kDouble);
      m["overlong_penalty_mean"] = pen.mean().item<double>();
    }
    rewards = rewards.to(at::kFloat);

    // Advantages [B, T_all].
    const GlobalSum global_sum = [&](at::Tensor& t) { return s.models.AllReduceSum(t); };
    at::Tensor adv, returns;
    const bool distill = s.models.teacher && rl.distill.on();
    if (distill && !rl.distill.task_reward) {
      // Pure distillation: the teacher's per-token term is the whole
      // advantage (added below); the rewards are only logged.
      adv = at::zeros({B, T_all}, at::kFloat);
    } else if (B == 0) {
      adv = at::zeros({0, T_all}, at::kFloat);
      const bool whitened =
          rl.advantage == Advantage::kReinforcePp || (rl.advantage == Advantage::kPpo && rl.gae.whiten);
      if (s.world > 1 && whitened) {
        // The other ranks whiten over the global batch: take part in the
        // same two sums with nothing, and fail as they do when it is empty.
        at::Tensor first = at::zeros({2}, at::kDouble), second = at::zeros({1}, at::kDouble);
        RLMESH_RETURN_IF_ERROR(global_sum(first));
        if (first[1].item<double>() < 2) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mask: whitening needs at least 2 masked tokens, got ", first[1].item<double>()));
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
    MetricMeans distill_means;
    auto add_distillation = [&](at::Tensor* advantages, const at::Tensor& teacher, const at::Tensor& old,
                                const at::Tensor& mk) -> absl::Status {
      RLMESH_ASSIGN_OR_RETURN(DistillationTerms d, DistillationAdvantages(teacher, old, mk, rl.distill.coef));
      *advantages = *advantages + d.advantages;
      distill_means.Add(d.metrics, d.tokens);
      return absl::OkStatus();
    };
    if (distill && !reuse_forward) RLMESH_RETURN_IF_ERROR(add_distillation(&adv, teacher_logp, old_logp, mask));

    // Loss weights: what the aggregation averages over.
    auto weight_of = [&](const at::Tensor& mk) -> double {
      switch (rl.loss.agg) {
        case LossAgg::kTokenMean:
          return mk.sum().item<double>();
        case LossAgg::kSeqMeanTokenMean:
          return mk.sum(1).gt(0).sum().item<double>();
        default:
          return static_cast<double>(mk.size(0));
      }
    };

    MetricMeans means;
    double mean_weight = 0;  // the weight `means` are over
    double grad_norm_sum = 0, value_grad_norm_sum = 0, lr = 0;
    int64_t opt_steps = 0, skipped = 0;
    fb_seconds += Since(t0);
    for (int epoch = 0; epoch < rl.epochs; ++epoch) {
      for (const auto& micro : minis) {
        const auto t1 = Clock::now();
        double mini_w = 0;
        for (auto [a, e] : micro) mini_w += weight_of(Rows(loss_mask, a, e, longest(a, e)));
        RLMESH_RETURN_IF_ERROR(s.models.ZeroGradPolicy(mini_w));
        RLMESH_RETURN_IF_ERROR(s.models.ZeroGradCritic(mini_w));
        if (s.models.AlignedPasses()) {
          // ZeRO-3 and EP: as many forward/backward passes as the rank with the
          // most micro-batches in this mini-batch.
          RLMESH_ASSIGN_OR_RETURN(const int64_t passes,
                                  s.models.MaxOverGroup(static_cast<int64_t>(micro.size())));
          for (int64_t k = static_cast<int64_t>(micro.size()); k < passes; ++k) {
            RLMESH_RETURN_IF_ERROR(s.models.EmptyPolicyPass(true));
          }
        }
        for (auto [a, e] : micro) {
          const int64_t T = longest(a, e);
          at::Tensor mk = Rows(loss_mask, a, e, T);
          const double w = weight_of(mk);
          if (w == 0) {
            RLMESH_RETURN_IF_ERROR(s.models.EmptyPolicyPass(true));  // no-op unless ZeRO-3 or EP
            continue;
          }
          std::optional<MoeForward> routing;
          start_routing(&routing, a, e, T);
          RLMESH_ASSIGN_OR_RETURN(auto lp, micro_logprobs(s.models.policy, a, e, T));
          at::Tensor aux;
          if (routing) aux = routing->AuxLoss(real_positions(a, e, T));
          routing.reset();
          PolicyLossInputs in;
          in.logp = lp.logprobs;
          in.old_logp = reuse_forward ? lp.logprobs.detach() : Rows(old_logp, a, e, T);
          in.advantages = Rows(adv, a, e, T);
          if (distill && reuse_forward) {
            RLMESH_RETURN_IF_ERROR(
                add_distillation(&in.advantages, Rows(teacher_logp, a, e, T), in.old_logp, Rows(mask, a, e, T)));
          }
          in.mask = mk;
          if (with_behaviour && reuse_forward) {
            RLMESH_ASSIGN_OR_RETURN(MismatchWeights mw,
                                    correct_mismatch(in.old_logp, Rows(b.behaviour, a, e, T), Rows(mask, a, e, T)));
            in.is_weight = mw.weight;
          } else if (with_behaviour) {
            in.is_weight = Rows(is_weight, a, e, T);
          }
          if (s.models.reference) in.ref_logp = Rows(ref_logp, a, e, T);
          in.entropy = rl.loss.entropy_coef > 0 ? lp.entropy : lp.entropy.detach();
          RLMESH_ASSIGN_OR_RETURN(LossOutput out, PolicyLoss(in, rl.loss));
          at::Tensor total = out.loss * (w / mini_w);
          if (aux.defined()) {
            // Weighted like the policy loss: by the micro-batch's share.
            if (rl.router_aux_loss_coef > 0) total = total + rl.router_aux_loss_coef * aux * (w / mini_w);
            out.metrics["router_aux_loss"] = aux.item<double>();
          }
          if (s.models.critic) {
            RLMESH_ASSIGN_OR_RETURN(at::Tensor values, micro_values(a, e, T));
            RLMESH_ASSIGN_OR_RETURN(LossOutput vo, ValueLoss(values, Rows(old_values, a, e, T),
                                                             Rows(returns, a, e, T), mk, rl.value_clip,
                                                             rl.loss.agg));
            total = total + rl.vf_coef * vo.loss * (w / mini_w);
            out.metrics["value_loss"] = vo.metrics["vf_loss"];
            out.metrics["value_mean"] = vo.metrics["value_mean"];
            out.metrics["value_clip_frac"] = vo.metrics["vf_clip_frac"];
            out.metrics["return_mean"] = vo.metrics["return_mean"];
          }
          total.backward();
          means.Add(out.metrics, w);
          mean_weight += w;
        }
        fb_seconds += Since(t1);
        const auto t2 = Clock::now();
        lr = LearningRate(s.opt.optimizer().schedule, s.models.PolicySteps());
        auto stats = s.models.StepPolicy(mini_w, lr);
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
        if (s.models.critic) {
          const double clr = LearningRate(rl.critic_optimizer.schedule, s.models.CriticSteps());
          auto cst = s.models.StepCritic(mini_w, clr);
          if (!cst.ok()) return cst.status();
          value_grad_norm_sum += cst->grad_norm;
        }
        ++opt_steps;
        opt_seconds += Since(t2);
      }
    }
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
    if (s.models.critic) m["value_grad_norm"] = opt_steps ? value_grad_norm_sum / opt_steps : 0.0;
    m["lr"] = lr;
    m["mean_weight"] = mean_weight;
    m["optimizer_steps"] = static_cast<double>(opt_steps);
    m["skipped"] = static_cast<double>(skipped);
    // ZeRO-3: rank 0's full weights for weight sync and checkpoints.
    return s.models.SyncPolicy();
  });
  if (!st.ok()) return st;
  m["seconds_forward_backward"] = fb_seconds;
  m["seconds_optimizer"] = opt_seconds;
  const double total = Since(t_start);
  m["tokens_per_second"] = total > 0 ? m["tokens"] * rl.epochs / total : 0.0;
  return FinishStep(std::move(resp), /*new_policy=*/true);
}

}  // namespace rlmesh::learner
