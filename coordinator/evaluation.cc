// Held-out evaluation: greedy accuracy (one sample per prompt, scored by the
// first verifier) and, with eval.pass_at, the sampled pass@k.

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "coordinator/progress.h"
#include "coordinator/pass_at_k.h"
#include "coordinator/run_loop.h"

namespace rlmesh {

namespace {

const char* FinishName(FinishReason r) {
  switch (r) {
    case FINISH_REASON_STOP:
      return "stop";
    case FINISH_REASON_LENGTH:
      return "length";
    case FINISH_REASON_CONTEXT:
      return "context";
    case FINISH_REASON_ABORTED:
      return "aborted";
    default:
      return "unspecified";
  }
}

}  // namespace

// One line per sample of an evaluation: what a person needs to see why a
// prompt was scored right or wrong, and the ids a test needs to check the
// stop rule.
void RunLoop::RecordEvalSamples(const std::string& kind, const std::vector<TrajectoryGroup>& groups,
                                const ScoreResponse& scores, const std::vector<bool>& right,
                                std::vector<nlohmann::json>* out) const {
  size_t at = 0;
  for (const auto& g : groups) {
    for (const Trajectory& t : g.samples()) {
      nlohmann::json j = {{"kind", kind},
                          {"prompt_id", g.prompt_id()},
                          {"sample", t.sample_index()},
                          {"prompt", tokenizer_->Decode({t.prompt_token_ids().begin(), t.prompt_token_ids().end()})},
                          {"completion", t.response_text()},
                          {"prompt_token_ids", std::vector<int>(t.prompt_token_ids().begin(),
                                                                t.prompt_token_ids().end())},
                          {"response_token_ids", std::vector<int>(t.response_token_ids().begin(),
                                                                  t.response_token_ids().end())},
                          // Of each response token, under the policy (after
                          // temperature; greedy samples: the raw logits).
                          {"logprobs", std::vector<float>(t.behaviour_logprobs().begin(),
                                                          t.behaviour_logprobs().end())},
                          {"finish_reason", FinishName(t.finish_reason())},
                          {"reference", t.reference_answer()}};
      if (at < static_cast<size_t>(scores.results_size())) j["reward"] = scores.results(at).reward();
      if (at < right.size()) j["correct"] = static_cast<bool>(right[at]);
      ++at;
      out->push_back(std::move(j));
    }
  }
}

absl::Status RunLoop::WriteEvalSamples(const std::string& path, const std::vector<nlohmann::json>& samples) const {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::string text;
  for (const auto& j : samples) absl::StrAppend(&text, j.dump(), "\n");
  return WriteFileAtomically(path, text);
}

absl::StatusOr<double> RunLoop::Evaluate(const std::string& label, int64_t step, bool final, bool pass_at,
                                         std::vector<nlohmann::json>* samples) {
  SetPhase("eval");
  const absl::Time start = absl::Now();
  const auto& eval = task_->eval();
  const int count = cfg().eval().prompts() > 0 ? std::min<int>(cfg().eval().prompts(), eval.size()) : eval.size();
  std::vector<Prompt> prompts;
  for (int i = 0; i < count; ++i) prompts.push_back(MakePrompt(eval[i]));
  const std::string& first = cfg().reward().verifiers(0).label().empty() ? cfg().reward().verifiers(0).name()
                                                                          : cfg().reward().verifiers(0).label();
  // Whether each scored item is right by the first verifier, in order.
  auto right = [&](const ScoreResponse& scores) {
    std::vector<bool> out;
    for (const auto& r : scores.results()) {
      auto it = r.components().find(first);
      out.push_back(it != r.components().end() && it->second >= 1.0 - 1e-9);
    }
    return out;
  };
  // A corpus (task kind text) has no held-out prompts: nothing to generate
  // or score; accuracy 0 over 0 prompts.
  std::vector<TrajectoryGroup> groups;
  ScoreResponse scores;
  if (!prompts.empty()) {
    RLMESH_ASSIGN_OR_RETURN(groups, Generate(prompts, 1, Sampling(true, cfg().seed()), false, step, versions_.rollout()));
    RLMESH_ASSIGN_OR_RETURN(scores, Score(groups));
  }
  double correct = 0;
  const std::vector<bool> greedy_right = right(scores);
  for (bool r : greedy_right) correct += r ? 1 : 0;
  if (samples != nullptr) RecordEvalSamples("greedy", groups, scores, greedy_right, samples);
  const double acc = groups.empty() ? 0 : correct / groups.size();
  nlohmann::json j = {{"event", "eval"},      {"stage", label},    {"step", step},
                      {"policy_version", versions_.learner()}, {"accuracy", acc}, {"prompts", groups.size()},
                      {"time", absl::ToUnixMicros(absl::Now()) / 1e6}};
  // pass@k: n = the largest k samples per prompt at the rollout temperature.
  int n = 0;
  for (int k : cfg().eval().pass_at()) n = std::max(n, k);
  std::string pass_line;
  if (pass_at && n > 0 && !prompts.empty()) {
    // The same seeds at every evaluation: pass@k of two checkpoints differs
    // by their weights, not by the draws (and `coordinator eval` of a
    // checkpoint repeats the run's own evaluation of it).
    RLMESH_ASSIGN_OR_RETURN(auto sampled, Generate(prompts, n, Sampling(false, cfg().seed() * 7919ULL), false, step,
                                                   versions_.rollout()));
    RLMESH_ASSIGN_OR_RETURN(auto sampled_scores, Score(sampled));
    const std::vector<bool> ok = right(sampled_scores);
    if (samples != nullptr) RecordEvalSamples("sampled", sampled, sampled_scores, ok, samples);
    // Right samples per prompt (scores come back in request order).
    std::vector<int> right_per_prompt;
    size_t at = 0;
    for (const auto& g : sampled) {
      int c = 0;
      for (int s = 0; s < g.samples_size() && at < ok.size(); ++s) c += ok[at++] ? 1 : 0;
      right_per_prompt.push_back(c);
    }
    for (int k : cfg().eval().pass_at()) {
      const double pk = MeanPassAtK(right_per_prompt, n, k);
      j[absl::StrCat("pass@", k)] = pk;
      absl::StrAppendFormat(&pass_line, ", pass@%d %.1f%%", k, 100 * pk);
      SetMetric(absl::StrCat("pass@", k), pk);
    }
  }
  j["seconds_eval"] = Seconds(start);
  metrics_.Record(j);
  SetMetric("accuracy", acc);
  if (final) {
    Print(absl::StrFormat("eval  %-6s held-out greedy accuracy %.1f%% (%d prompts)%s", label, 100 * acc,
                          static_cast<int>(groups.size()), pass_line));
  }
  return acc;
}

}  // namespace rlmesh

namespace rlmesh {

// `coordinator eval`: the held-out evaluation of one model folder, with
// every sample written out and a summary table. No training: the learners
// are never configured.
absl::Status RunLoop::EvaluateFolder(const std::string& folder) {
  {
    absl::MutexLock lock(&mu_);
    status_.set_stage("eval");
  }
  const int64_t prompts = cfg().eval().prompts() > 0 ? std::min<int64_t>(cfg().eval().prompts(), task_->eval().size())
                                                     : static_cast<int64_t>(task_->eval().size());
  Print(absl::StrCat("eval: ", folder, " on ", prompts, " held-out prompts"));
  RLMESH_RETURN_IF_ERROR(LoadIntoRollouts([&](LoadWeightsRequest* req) { req->set_checkpoint_path(folder); }));
  std::vector<nlohmann::json> samples;
  RLMESH_ASSIGN_OR_RETURN(double accuracy, Evaluate("eval", 0, /*final=*/false, /*pass_at=*/true, &samples));
  AddAccuracy("eval", accuracy);
  const std::string path = o_.eval_samples.empty() ? o_.run_dir + "/eval_samples.jsonl" : o_.eval_samples;
  RLMESH_RETURN_IF_ERROR(WriteEvalSamples(path, samples));
  Print(EvalSummaryTable(samples, accuracy, status().metrics(), cfg().eval().pass_at()));
  Print(absl::StrCat("eval: samples in ", path));
  return absl::OkStatus();
}

}  // namespace rlmesh
