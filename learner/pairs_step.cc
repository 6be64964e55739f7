// Preference-pair steps: reward model (Bradley-Terry) and DPO training and
// evaluation.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "learner/batching.h"
#include "learner/losses.h"
#include "learner/pipeline_parallel.h"
#include "learner/trainer.h"
#include "learner/trainer_internal.h"
#include "tasks/encoding.h"
#include "tasks/preferences.h"
#include "tasks/task.h"

namespace rlmesh::learner {

namespace {

// Rows 2i (chosen) and 2i+1 (rejected) of `pairs`: prompt + response,
// truncated to the context window `max_len`; the mask marks the
// response's predicted tokens. `pair_lengths` receives each pair's longer
// row.
std::vector<Seq> PairRows(const std::vector<const PreferencePair*>& pairs, const actor::Tokenizer& tokenizer,
                          int64_t max_len, std::vector<int64_t>* pair_lengths) {
  std::vector<Seq> seqs;
  for (const PreferencePair* pp : pairs) {
    const std::vector<int> p = pp->has_ids() ? pp->prompt_ids : EncodePrompt(tokenizer, pp->prompt);
    int64_t longest = 0;
    for (int side = 0; side < 2; ++side) {
      const std::vector<int> r = pp->has_ids() ? (side == 0 ? pp->chosen_ids : pp->rejected_ids)
                                               : EncodeResponse(tokenizer, side == 0 ? pp->chosen : pp->rejected);
      seqs.push_back(PromptResponseSeq(p, r, max_len, static_cast<int64_t>(p.size()) - 1));
      longest = std::max<int64_t>(longest, seqs.back().ids.size());
    }
    pair_lengths->push_back(longest);
  }
  return seqs;
}

// DPO's loss and metrics from the policy's and the reference's
// per-sequence sums of pairs' rows (chosen, rejected, chosen, ...).
absl::StatusOr<LossOutput> PairDpoLoss(const at::Tensor& policy_sums, const at::Tensor& ref_sums, double beta) {
  const at::Tensor pol = policy_sums.view({-1, 2}), ref = ref_sums.view({-1, 2});
  DpoInputs in;
  in.policy_chosen_logp = pol.select(1, 0);
  in.policy_rejected_logp = pol.select(1, 1);
  in.ref_chosen_logp = ref.select(1, 0);
  in.ref_rejected_logp = ref.select(1, 1);
  RLMESH_ASSIGN_OR_RETURN(LossOutput out, DpoLoss(in, beta));
  out.metrics["loss"] = out.metrics["dpo_loss"];
  out.metrics["dpo_accuracy"] = out.metrics["reward_accuracy"];
  out.metrics["chosen_reward"] = out.metrics["reward_chosen"];
  out.metrics["rejected_reward"] = out.metrics["reward_rejected"];
  return out;
}

}  // namespace

absl::Status Trainer::PairPass(const std::vector<const PreferencePair*>& pairs, bool train,
                               std::map<std::string, double>* metrics) {
  State& s = *s_;
  const bool rm = s.opt.kind == StageKind::kRewardModel;
  std::vector<int64_t> pair_lengths;
  const std::vector<Seq> seqs =
      PairRows(pairs, *s.tokenizer, s.models.policy->config().max_positions, &pair_lengths);
  const int64_t n = pairs.size();
  const int C = s.models.ContextRanks();
  return CatchAll("pair step", [&]() -> absl::Status {
    // Each micro-batch holds whole pairs (2 rows per pair).
    auto micros = MicroBatches(pair_lengths, 0, n, std::max<int64_t>(1, s.opt.learner.micro_tokens / 2));
    // A pipeline idles less the more micro-batches a step has.
    if (s.models.pp_policy) micros = AtLeastMicroBatches(micros, s.opt.learner.pp_microbatches);
    // ZeRO-3 and EP: every rank runs as many policy passes as the rank with
    // the most micro-batches (the passes hold collectives); the frozen
    // reference is whole on every rank there, and its passes hold none.
    // Under TP the ranks of a replica train the same pairs.
    if (s.models.AlignedPasses()) {
      RLMESH_ASSIGN_OR_RETURN(const int64_t passes, s.models.MaxOverGroup(static_cast<int64_t>(micros.size())));
      for (int64_t k = static_cast<int64_t>(micros.size()); k < passes; ++k) {
        RLMESH_RETURN_IF_ERROR(s.models.EmptyPolicyPass(/*backward=*/train));
      }
    }
    if (n == 0) return absl::OkStatus();
    Batch b = MakeBatch(seqs, false);
    std::vector<int64_t> row_lengths;
    for (const Seq& q : seqs) row_lengths.push_back(q.ids.size());
    // Pairs [a, e): rows [2a, 2e) cut to their longest.
    auto longest = [&](int64_t a, int64_t e) {
      return *std::max_element(row_lengths.begin() + 2 * a, row_lengths.begin() + 2 * e);
    };
    auto rows = [&](const at::Tensor& t, int64_t a, int64_t e) { return Rows(t, 2 * a, 2 * e, longest(a, e)); };
    // Each row's sum of its response's log-probs. Context parallelism: each
    // rank scored its own positions; the pair's loss takes whole sequences,
    // and each rank's gradient flows back through its own share.
    auto sequence_sums = [&](int64_t a, int64_t e, const at::Tensor& logprobs) -> absl::StatusOr<at::Tensor> {
      RLMESH_ASSIGN_OR_RETURN(at::Tensor seq, SequenceLogProbs(logprobs, rows(b.mask, a, e)));
      return s.models.ContextSum(seq);
    };
    // DPO's loss of pairs [a, e), their reference sums given.
    auto dpo_loss = [&](int64_t a, int64_t e, const at::Tensor& policy_logprobs,
                        const at::Tensor& ref_seq) -> absl::StatusOr<LossOutput> {
      RLMESH_ASSIGN_OR_RETURN(at::Tensor pol_seq, sequence_sums(a, e, policy_logprobs));
      return PairDpoLoss(pol_seq, ref_seq, s.opt.pairs.beta);
    };
    // The loss to backpropagate for pairs [a, e): their share of the mean.
    // Under CP every rank of a replica computes the same loss, its gradient
    // through its own positions only, and weighs 1/C of the replica's pairs
    // (learner/context_parallel.h): the C ranks' terms sum to the replica's
    // gradient.
    auto scaled = [&](int64_t a, int64_t e, const at::Tensor& loss) {
      return loss * (static_cast<double>(C) * (e - a) / n);
    };
    MetricMeans means;
    if (!rm && s.models.pp_policy) {
      // The pipeline: the reference's sums on every stage, then the
      // policy's passes in its schedule (the last stage takes the losses)
      // or, without gradient, its log-probs on every stage.
      std::vector<PipelineMicroBatch> in;
      for (auto [a, e] : micros) {
        in.push_back({rows(b.input_ids, a, e), rows(b.positions, a, e), rows(b.targets, a, e)});
      }
      RLMESH_ASSIGN_OR_RETURN(auto ref_out, s.models.pp_reference->LogProbs(in, 1.0));
      std::vector<at::Tensor> ref_seqs;
      for (size_t k = 0; k < micros.size(); ++k) {
        RLMESH_ASSIGN_OR_RETURN(at::Tensor r, sequence_sums(micros[k].first, micros[k].second, ref_out[k].logprobs));
        ref_seqs.push_back(r);
      }
      auto micro_loss = [&](size_t k, const at::Tensor& logprobs) -> absl::StatusOr<at::Tensor> {
        const auto [a, e] = micros[k];
        RLMESH_ASSIGN_OR_RETURN(LossOutput out, dpo_loss(a, e, logprobs, ref_seqs[k]));
        means.Add(out.metrics, static_cast<double>(e - a));
        return scaled(a, e, out.loss);
      };
      if (train) {
        RLMESH_RETURN_IF_ERROR(s.models.pp_policy->Train(
            in, 1.0, [&](size_t k, const actor::TokenLogProbsOutput& out) { return micro_loss(k, out.logprobs); }));
      } else {
        RLMESH_ASSIGN_OR_RETURN(auto pol_out, s.models.pp_policy->LogProbs(in, 1.0));
        for (size_t k = 0; k < micros.size(); ++k) RLMESH_RETURN_IF_ERROR(micro_loss(k, pol_out[k].logprobs).status());
      }
    }
    for (size_t k = 0; k < micros.size() && (rm || !s.models.pp_policy); ++k) {
      const auto [a, e] = micros[k];
      const at::Tensor ids = rows(b.input_ids, a, e), pos = rows(b.positions, a, e);
      std::unique_ptr<at::NoGradGuard> no_grad;
      if (!train) no_grad = std::make_unique<at::NoGradGuard>();
      LossOutput out;
      if (rm) {
        // Score = the value at the last real token (eos) of prompt+response.
        at::Tensor last = at::zeros({2 * (e - a), 1}, at::kLong);
        for (int64_t r = 2 * a; r < 2 * e; ++r) last[r - 2 * a][0] = row_lengths[r] - 1;
        RLMESH_ASSIGN_OR_RETURN(at::Tensor values, s.models.Values(s.models.policy, ids, pos));
        at::Tensor scores = values.gather(1, last).squeeze(1);
        at::Tensor pair_scores = scores.view({e - a, 2});
        RLMESH_ASSIGN_OR_RETURN(out, RewardModelLoss(pair_scores.select(1, 0), pair_scores.select(1, 1)));
        out.metrics["loss"] = out.metrics["rm_loss"];
        out.metrics["margin"] = out.metrics["rm_margin"];
      } else {
        const at::Tensor tg = rows(b.targets, a, e);
        at::Tensor ref_seq;
        {
          at::NoGradGuard ref_no_grad;
          RLMESH_ASSIGN_OR_RETURN(auto rlp, s.models.LogProbs(s.models.reference, ids, pos, tg,
                                                                 options_.logprob_chunk, 1.0));
          RLMESH_ASSIGN_OR_RETURN(ref_seq, sequence_sums(a, e, rlp.logprobs));
        }
        RLMESH_ASSIGN_OR_RETURN(auto lp, s.models.LogProbs(s.models.policy, ids, pos, tg, options_.logprob_chunk, 1.0));
        RLMESH_ASSIGN_OR_RETURN(out, dpo_loss(a, e, lp.logprobs, ref_seq));
      }
      if (train) scaled(a, e, out.loss).backward();
      means.Add(out.metrics, static_cast<double>(e - a));
    }
    means.Into(metrics);
    (*metrics)["pairs"] = static_cast<double>(n);
    (*metrics)["tokens"] = static_cast<double>(b.tokens);
    return absl::OkStatus();
  });
}

absl::StatusOr<TrainStepResponse> Trainer::TrainPairs() {
  State& s = *s_;
  const auto t_start = Clock::now();
  // Every rank draws the same global batch of pairs and takes its slice.
  std::vector<const Example*> global = s.loader->Next(s.opt.pairs.batch);
  const int64_t lo = s.data_rank * s.opt.pairs.batch / s.data_world,
                hi = (s.data_rank + 1) * s.opt.pairs.batch / s.data_world;
  std::vector<const PreferencePair*> mine;
  for (int64_t i = lo; i < hi; ++i) mine.push_back(&s.pairs[global[i] - s.pair_keys.data()]);
  TrainStepResponse resp;
  auto& m = *resp.mutable_metrics()->mutable_values();
  std::map<std::string, double> vals;
  // Each rank's loss is the mean over its own pairs (DataParallel's
  // convention; ZeRO-3 and EP take the weight before the backward passes).
  // Under CP the C ranks of a replica share its pairs: 1/C each.
  const double replica_pairs = static_cast<double>(mine.size());
  const double local_pairs = replica_pairs / s.models.ContextRanks();
  RLMESH_RETURN_IF_ERROR(CatchAll("zero grad", [&]() { return s.models.ZeroGradPolicy(local_pairs); }));
  const auto t0 = Clock::now();
  RLMESH_RETURN_IF_ERROR(PairPass(mine, /*train=*/true, &vals));
  const double fb_seconds = Since(t0);
  const auto t1 = Clock::now();
  const double lr = LearningRate(s.opt.optimizer().schedule, s.models.PolicySteps());
  absl::StatusOr<DataParallelStepStats> stats =
      CatchAll("optimizer step", [&]() { return s.models.StepPolicy(local_pairs, lr); });
  if (!stats.ok()) return stats.status();
  // ZeRO-3, TP and EP: rank 0's whole copy for weight sync (or, with
  // weight sync in pieces under TP, none).
  RLMESH_RETURN_IF_ERROR(s.models.SyncPolicy());
  for (auto& [k, v] : vals) m[k] = v;
  m["grad_norm"] = stats->grad_norm;
  m["lr"] = lr;
  m["skipped"] = stats->skipped ? 1.0 : 0.0;
  m["mean_weight"] = replica_pairs;  // PairPass's means are over these pairs
  m["seconds_allreduce"] = stats->reduce_seconds + stats->gather_seconds;
  m["seconds_forward_backward"] = fb_seconds;
  m["seconds_optimizer"] = Since(t1);
  m["seconds_sample"] = 0.0;
  const double total = Since(t_start);
  m["tokens_per_second"] = total > 0 ? m["tokens"] / total : 0.0;
  // PP: the loss and its metrics were the last stage's.
  RLMESH_RETURN_IF_ERROR(s.models.ShareLastStageMetrics(&m));
  // A reward model is not a policy: the policy version stays where the
  // stage started (rollout workers never load it).
  return FinishStep(std::move(resp), /*new_policy=*/s.opt.kind != StageKind::kRewardModel);
}

absl::StatusOr<std::map<std::string, double>> Trainer::EvaluatePairs(const std::vector<PreferencePair>& pairs) {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  if (!s_->opt.is_pairs()) {
    return absl::FailedPreconditionError(
        absl::StrCat("EvaluatePairs: stage ", s_->opt.name, " is not a reward_model or dpo stage"));
  }
  if (pairs.empty()) return absl::InvalidArgumentError("pairs: empty");
  std::vector<const PreferencePair*> ptrs;
  for (const PreferencePair& p : pairs) ptrs.push_back(&p);
  std::map<std::string, double> metrics;
  RLMESH_RETURN_IF_ERROR(PairPass(ptrs, /*train=*/false, &metrics));
  return metrics;
}

}  // namespace rlmesh::learner
