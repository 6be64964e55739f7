// Trainer::TrainSft: one supervised step (padded or packed batches).

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
#include "learner/schedule.h"
#include "learner/trainer.h"
#include "learner/trainer_internal.h"
#include "tasks/encoding.h"
#include "tasks/preferences.h"
#include "tasks/task.h"

namespace rlmesh::learner {

// Long because: draws the global batch, builds its rows for each task kind (prompts, chat or text
// items) and runs the micro-batch loop over them.
absl::StatusOr<TrainStepResponse> Trainer::TrainSft() {
  State& s = *s_;
  const auto t_start = Clock::now();
  // Every rank draws the same global batch and takes its slice.
  std::vector<const Example*> global = s.loader->Next(s.opt.sft.batch);
  const int64_t lo = s.data_rank * s.opt.sft.batch / s.data_world,
                hi = (s.data_rank + 1) * s.opt.sft.batch / s.data_world;
  const int64_t max_len = s.models.policy->config().max_positions;
  std::vector<Seq> seqs;
  // Task kind text: rows of packed document pieces, one row per item.
  std::vector<std::vector<const Seq*>> fixed_rows;
  if (s.sft_items.empty()) {
    for (int64_t i = lo; i < hi; ++i) {
      std::vector<int> p = EncodePrompt(*s.tokenizer, global[i]->prompt);
      const Example& e = *global[i];
      std::vector<int> r = EncodeResponse(*s.tokenizer, e.sft_target.empty() ? e.answer : e.sft_target);
      const int64_t first = s.opt.sft.train_on_prompt ? 0 : static_cast<int64_t>(p.size()) - 1;
      seqs.push_back(PromptResponseSeq(p, r, max_len, first));
    }
  } else {
    // Pre-tokenised items (task kind chat or text), cut to the context
    // window: a row keeps its pieces while they fit.
    std::vector<std::vector<Seq>> picked;
    for (int64_t i = lo; i < hi; ++i) {
      const size_t index = static_cast<size_t>(global[i] - s.loader_data->data());
      std::vector<Seq> item;
      int64_t room = max_len;
      for (const Seq& q : s.sft_items[index]) {
        if (room <= 0) break;
        Seq cut = q;
        if (static_cast<int64_t>(cut.ids.size()) > room) {
          cut.ids.resize(room);
          cut.mask.resize(room);
          cut.mask.back() = 0.0f;  // its target is cut off
        }
        room -= static_cast<int64_t>(cut.ids.size());
        item.push_back(std::move(cut));
      }
      picked.push_back(std::move(item));
    }
    for (auto& item : picked) {
      for (Seq& q : item) seqs.push_back(std::move(q));
    }
    if (s.sft_items_are_rows) {
      size_t at = 0;
      for (const auto& item : picked) {
        fixed_rows.emplace_back();
        for (size_t k = 0; k < item.size(); ++k) fixed_rows.back().push_back(&seqs[at++]);
      }
    }
  }
  TrainStepResponse resp;
  auto& m = *resp.mutable_metrics()->mutable_values();
  double fb_seconds = 0, opt_seconds = 0;
  absl::Status st = CatchAll("sft step", [&]() -> absl::Status {
    std::vector<int64_t> lengths;
    Batch b;
    if (s.sft_items_are_rows) {
      b = MakeRowsBatch(fixed_rows, &lengths);
    } else if (s.opt.sft.packing) {
      b = MakePackedBatch(seqs, max_len, &lengths);
    } else {
      b = MakeBatch(seqs, false);
      for (const Seq& q : seqs) lengths.push_back(q.ids.size());
    }
    const double local_tokens = seqs.empty() ? 0.0 : b.mask.sum().item<double>();
    // A context-parallel rank weighs 1/C of its replica's tokens
    // (learner/context_parallel.h).
    const int C = s.models.ContextRanks();
    RLMESH_RETURN_IF_ERROR(s.models.ZeroGradPolicy(local_tokens / C));
    MetricMeans means;
    const auto t0 = Clock::now();
    auto micros = MicroBatches(lengths, 0, static_cast<int64_t>(lengths.size()), s.opt.learner.micro_tokens);
    // A pipeline idles less the more micro-batches a step has.
    if (s.opt.learner.pp > 1) micros = AtLeastMicroBatches(micros, s.opt.learner.pp_microbatches);
    auto inputs = [&](int64_t a, int64_t e, int64_t T) -> PipelineMicroBatch {
      return {Rows(b.input_ids, a, e, T), Rows(b.positions, a, e, T), Rows(b.targets, a, e, T),
              b.segments.defined() ? Rows(b.segments, a, e, T) : at::Tensor()};
    };
    auto longest = [&](int64_t a, int64_t e) { return *std::max_element(lengths.begin() + a, lengths.begin() + e); };
    // ZeRO-3 and EP: every rank runs as many passes as the rank with the most
    // micro-batches (its collectives must match theirs).
    int64_t passes = static_cast<int64_t>(micros.size());
    if (s.models.AlignedPasses()) {
      RLMESH_ASSIGN_OR_RETURN(passes, s.models.MaxOverGroup(passes));
    }
    for (int64_t k = static_cast<int64_t>(micros.size()); k < passes; ++k) {
      RLMESH_RETURN_IF_ERROR(s.models.EmptyPolicyPass(/*backward=*/true));
    }
    // The tokens in micro-batch [a, e)'s loss, and the loss to
    // backpropagate from its log-probs.
    auto weight = [&](int64_t a, int64_t e) { return Rows(b.mask, a, e, longest(a, e)).sum().item<double>(); };
    auto micro_loss = [&](int64_t a, int64_t e, double w, const at::Tensor& logprobs) -> absl::StatusOr<at::Tensor> {
      if (w == 0) return logprobs.sum() * 0;  // a pipeline's schedule still runs it
      at::Tensor mask = Rows(b.mask, a, e, longest(a, e));
      if (C > 1) {
        // This rank's positions only.
        mask = mask * s.models.ContextMask(e - a, longest(a, e));
        w = mask.sum().item<double>();
      }
      RLMESH_ASSIGN_OR_RETURN(LossOutput out, SftLoss(logprobs, mask, LossAgg::kTokenMean));
      means.Add(out.metrics, w);
      return out.loss * (w / (local_tokens / C));
    };
    if (s.models.pp_policy && local_tokens > 0) {
      // The pipeline's 1F1B schedule; the last stage asks for the losses.
      std::vector<PipelineMicroBatch> in;
      for (auto [a, e] : micros) in.push_back(inputs(a, e, longest(a, e)));
      RLMESH_RETURN_IF_ERROR(s.models.pp_policy->Train(
          in, 1.0, [&](size_t k, const actor::TokenLogProbsOutput& out) {
            const auto [a, e] = micros[k];
            return micro_loss(a, e, weight(a, e), out.logprobs);
          }));
    }
    for (size_t k = 0; k < micros.size() && !s.models.pp_policy; ++k) {
      const auto [a, e] = micros[k];
      const int64_t T = longest(a, e);
      const double w = weight(a, e);
      if (w == 0) {
        RLMESH_RETURN_IF_ERROR(s.models.EmptyPolicyPass(/*backward=*/true));
        continue;
      }
      const PipelineMicroBatch in = inputs(a, e, T);
      RLMESH_ASSIGN_OR_RETURN(auto lp, s.models.LogProbs(s.models.policy, in.ids, in.positions, in.targets,
                                                         options_.logprob_chunk, 1.0, in.attention_mask));
      RLMESH_ASSIGN_OR_RETURN(at::Tensor loss, micro_loss(a, e, w, lp.logprobs));
      loss.backward();
    }
    fb_seconds = Since(t0);
    const auto t1 = Clock::now();
    const double lr = LearningRate(s.opt.optimizer().schedule, s.models.PolicySteps());
    RLMESH_ASSIGN_OR_RETURN(DataParallelStepStats stats, s.models.StepPolicy(local_tokens / C, lr));
    RLMESH_RETURN_IF_ERROR(s.models.SyncPolicy());
    opt_seconds = Since(t1);
    // CP: each rank's means were over its own positions.
    RLMESH_RETURN_IF_ERROR(s.models.ShareContextMeans(&means, nullptr));
    std::map<std::string, double> vals;
    means.Into(&vals);
    for (auto& [k, v] : vals) m[k] = v;
    m["loss"] = vals.count("sft_loss") ? vals["sft_loss"] : 0.0;
    m["grad_norm"] = stats.grad_norm;
    m["lr"] = lr;
    m["skipped"] = stats.skipped ? 1.0 : 0.0;
    m["tokens"] = static_cast<double>(b.tokens);
    m["rows"] = static_cast<double>(lengths.size());
    m["loss_tokens"] = local_tokens;
    m["mean_weight"] = local_tokens;  // the means above are over these tokens
    m["seconds_allreduce"] = stats.reduce_seconds + stats.gather_seconds;
    // PP: the loss and its metrics were the last stage's.
    return s.models.ShareLastStageMetrics(&m);
  });
  if (!st.ok()) return st;
  m["seconds_forward_backward"] = fb_seconds;
  m["seconds_optimizer"] = opt_seconds;
  m["seconds_sample"] = 0.0;
  const double total = Since(t_start);
  m["tokens_per_second"] = total > 0 ? m["tokens"] / total : 0.0;
  return FinishStep(std::move(resp), /*new_policy=*/true);
}

}  // namespace rlmesh::learner
