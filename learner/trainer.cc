// Trainer: configuration of a stage (options, data, models, resume) and the
// dispatch of TrainStep to the family's step (sft_step.cc, pairs_step.cc,
// rl_step.cc). Checkpoints are in trainer_checkpoint.cc.

#include "learner/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actor/tokenizer.h"
#include "common/device_spec.h"
#include "common/log.h"
#include "common/path_root.h"
#include "common/status_macros.h"
#include "dist/device.h"
#include "learner/batching.h"
#include "learner/checkpoint.h"
#include "learner/model_set.h"
#include "learner/stage_options.h"
#include "learner/trainer_internal.h"
#include "tasks/chat_data.h"
#include "tasks/chat_prompts.h"
#include "tasks/preferences.h"
#include "tasks/task.h"
#include "tasks/text_corpus.h"

namespace rlmesh::learner {

using parallel::TensorParallelModel;
using parallel::TensorParallelPiece;

absl::Status TrainerOptions::Validate() const {
  if (logprob_chunk < 1) return absl::InvalidArgumentError("logprob_chunk: must be >= 1");
  if (sample_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("sample_timeout: must be > 0");
  }
  if (store_timeout_ms < 1) return absl::InvalidArgumentError("store_timeout_ms: must be >= 1");
  RLMESH_RETURN_IF_ERROR(ParseDeviceSpec(device, "device").status());
  for (const std::string& root : write_roots) {
    if (root.empty()) return absl::InvalidArgumentError("write_roots: an empty folder name");
  }
  return gloo.Validate();
}

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) { PublishStatus(); }
Trainer::~Trainer() = default;

void Trainer::PublishStatus() {
  LearnerStatus st;
  if (s_) {
    st.set_stage(s_->opt.name);
    st.set_rank(s_->rank);
    st.set_world_size(s_->world);
  } else {
    st.set_world_size(1);
  }
  st.set_step(step_);
  st.set_policy_version(version_);
  absl::MutexLock lock(&status_mu_);
  status_ = std::move(st);
}

LearnerStatus Trainer::Status() const {
  absl::MutexLock lock(&status_mu_);
  return status_;
}

std::vector<std::pair<std::string, at::Tensor>> Trainer::PolicyParameters() const {
  return s_->models.policy->NamedParameters();
}

absl::Status Trainer::GatherPolicy() {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  return s_->models.GatherPolicy();
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> Trainer::WholePolicy() const {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  if (s_->rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", s_->rank, ": only rank 0 publishes the whole model"));
  }
  if (s_->models.whole_on_demand) {
    return absl::FailedPreconditionError(absl::StrCat(
        s_->models.sharded ? "learner.zero=3" : absl::StrCat("learner.tp=", s_->opt.learner.tp),
        " syncs weights in pieces (weight_sync.whole_model: false), so rank 0 "
        "keeps no whole copy of the policy to publish; ask for spec.pieces, or set weight_sync.whole_model: true"));
  }
  return s_->models.policy->NamedParameters();
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> Trainer::SyncTensors() const {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  if (!s_->models.lora) return WholePolicy();
  if (s_->rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", s_->rank, ": only rank 0 publishes the adapters"));
  }
  // B carries the adapter's scaling, so that a receiver applies the pairs
  // with scaling 1 and needs no adapter config.
  std::vector<std::pair<std::string, at::Tensor>> out;
  at::NoGradGuard no_grad;
  actor::Transformer& policy = s_->models.policy;
  for (const auto& [module, linear] : policy->AdaptableLinears()) {
    if (!linear->has_adapter()) continue;
    out.emplace_back(module + ".lora_A.weight", linear->lora_A().detach());
    out.emplace_back(module + ".lora_B.weight", linear->lora_B().detach() * linear->lora_scaling());
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> Trainer::PolicyPiece(int piece, int pieces) const {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  const ModelSet& m = s_->models;
  const TensorParallelModel* tp = m.tp_policy.get();
  // ZeRO-3 with weight sync in pieces: every rank keeps its slice.
  const bool zero3_slices = m.zero3_sync_slices;
  int slice = 0, slices = 1;
  if (tp != nullptr) {
    slice = tp->rank();
    slices = tp->size();
  } else if (zero3_slices) {
    slice = m.sharded->world_rank();
    slices = m.sharded->world_size();
  }
  // Replica 0's ranks are 0..tp-1 (TP innermost); without TP or ZeRO-3's
  // slices rank 0 keeps the whole policy.
  if (s_->rank >= slices || (pieces > 0 && pieces % slices == 0 &&
                             (piece < slice * (pieces / slices) || piece >= (slice + 1) * (pieces / slices)))) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", s_->rank, " does not hold piece ", piece, " of ", pieces, " (",
                     zero3_slices ? "learner.zero=3 over " : "learner.tp=", slices, zero3_slices ? " ranks" : "",
                     ")"));
  }
  const auto held = tp != nullptr ? tp->NamedParameters() : zero3_slices ? m.sync_slices : m.policy->NamedParameters();
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(held.size());
  for (const auto& [name, t] : held) {
    RLMESH_ASSIGN_OR_RETURN(at::Tensor p, TensorParallelPiece(name, t.detach(), slice, slices, piece, pieces));
    out.emplace_back(name, std::move(p));
  }
  return out;
}

void* Trainer::policy_model() { return s_ ? &s_->models.policy : nullptr; }

int64_t Trainer::PolicyElementsHeld() const {
  if (!s_) return 0;
  const ModelSet& m = s_->models;
  int64_t n = 0;
  if (m.sharded) return m.sharded->shard_numel();
  if (m.tp_policy) {
    for (const at::Tensor& t : m.tp_policy->Parameters()) n += t.numel();
  } else if (m.pp_policy) {
    for (const auto& [name, t] : m.pp_policy->StageParameters()) n += t.numel();
  } else if (m.ep_policy) {
    for (const auto& [name, t] : m.ep_policy->model()->NamedParameters()) n += t.numel();
  } else {
    for (const auto& [name, t] : m.policy->NamedParameters()) n += t.numel();
  }
  return n;
}

int64_t Trainer::CriticElementsHeld() const {
  if (!s_ || !s_->models.critic) return 0;
  if (s_->models.sharded_critic) return s_->models.sharded_critic->shard_numel();
  if (s_->models.tp_critic) {
    int64_t n = 0;
    for (const at::Tensor& t : s_->models.tp_critic->Parameters()) n += t.numel();
    return n;
  }
  int64_t n = 0;
  for (const auto& [name, t] : s_->models.critic->NamedParameters()) n += t.numel();
  return n;
}

absl::StatusOr<ConfigureResponse> Trainer::Configure(const ConfigureRequest& req) {
  RLMESH_RETURN_IF_ERROR(options_.Validate());
  // Drop the previous stage first (its process group, models, memory).
  s_.reset();
  step_ = 0;
  version_ = 0;
  PublishStatus();

  auto st = std::make_unique<State>();
  State& s = *st;
  s.request = req;
  if (s.request.experiment().model().device().empty()) {
    s.request.mutable_experiment()->mutable_model()->set_device(options_.device);
  }
  const ExperimentConfig& exp = s.request.experiment();
  if (req.world_size() < 1) return absl::InvalidArgumentError("world_size: must be >= 1");
  if (req.rank() < 0 || req.rank() >= req.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", req.rank(), " is outside [0, world_size=", req.world_size(), ")"));
  }
  if (req.world_size() > 1 && req.store_address().empty()) {
    return absl::InvalidArgumentError("store_address: required when world_size > 1");
  }
  if (req.stage_index() < 0 || req.stage_index() >= exp.stages_size()) {
    return absl::InvalidArgumentError(absl::StrCat("stage_index: ", req.stage_index(),
                                                   " is outside experiment.stages (size ",
                                                   exp.stages_size(), ")"));
  }
  s.rank = req.rank();
  s.world = req.world_size();
  RLMESH_RETURN_IF_ERROR(NormalizeForLearner(s.request.mutable_experiment(), s.world));
  RLMESH_ASSIGN_OR_RETURN(s.opt, MakeStageOptions(exp, req.stage_index(), s.world));
  // A replica's tensor-parallel ranks, pipeline stages and context-parallel
  // ranks share its rows.
  s.data_rank = s.rank / s.opt.learner.RanksPerReplica();
  s.data_world = s.world / s.opt.learner.RanksPerReplica();
  RLMESH_RETURN_IF_ERROR(CheckWithinRoots(options_.write_roots, req.checkpoint_dir(), "checkpoint_dir"));
  RLMESH_RETURN_IF_ERROR(CheckWithinRoots(options_.write_roots, s.opt.pairs.output,
                                          absl::StrCat("experiment.stages[", req.stage_index(), "].reward_model.output")));

  // Tokenizer and task data.
  const ModelConfig& mc = exp.model();
  {
    auto tok = actor::LoadTokenizer(mc.tokenizer().empty() ? "char" : mc.tokenizer());
    if (!tok.ok()) return PrefixStatus("experiment.model.tokenizer", tok.status());
    s.tokenizer = *std::move(tok);
  }
  RLMESH_RETURN_IF_ERROR(LoadStageData(exp, req.stage_index(), &s));

  // The policy.
  RLMESH_ASSIGN_OR_RETURN(LoadedPolicy loaded, LoadPolicy(exp, req.init_checkpoint(), s.opt, *s.tokenizer, &s.models));
  version_ = loaded.policy_version;
  const actor::ModelConfig& cfg = loaded.config;
  RLMESH_RETURN_IF_ERROR(ResolveMoeSettings(cfg, &s.opt));
  // Pairs given as token ids must fit the model.
  for (size_t i = 0; i < s.pairs.size(); ++i) {
    const PreferencePair& p = s.pairs[i];
    for (const auto* ids : {&p.prompt_ids, &p.chosen_ids, &p.rejected_ids}) {
      for (int id : *ids) {
        if (id >= cfg.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat(s.opt.field, ".", StageKindName(s.opt.kind),
                                                         ".pairs_path: pair ", i, " has token id ", id,
                                                         ", outside the model's vocabulary of ", cfg.vocab_size));
        }
      }
    }
  }
  // Reference, critic, process group and optimizers.
  s.models.logprob_chunk = options_.logprob_chunk;
  RLMESH_RETURN_IF_ERROR(BuildTrainingModels(exp, s.opt, cfg, req.store_address(), req.store_prefix(), s.rank,
                                             s.world, options_.gloo, options_.store_timeout_ms, &s.models));

  s_ = std::move(st);
  // Resume from this stage's newest valid checkpoint, if any.
  if (!req.checkpoint_dir().empty()) {
    std::vector<std::string> refused;
    auto found = NewestValidCheckpoint(req.checkpoint_dir(), req.stage_index(), &refused);
    for (const std::string& r : refused) RLMESH_LOG(WARNING) << "refused checkpoint " << r;
    if (found.ok()) {
      absl::Status loaded = LoadFrom(found->path);
      if (!loaded.ok()) {
        s_.reset();
        step_ = 0;
        version_ = 0;
        PublishStatus();
        return loaded;
      }
      RLMESH_LOG(INFO) << "resumed path=" << found->path << " step=" << step_ << " version=" << version_;
    }
  }
  PublishStatus();
  RLMESH_LOG(INFO) << "configured stage=" << s_->opt.name << " rank=" << s_->rank
                   << " world_size=" << s_->world
                   << " zero=" << (s_->opt.learner.zero3 ? 3 : s_->opt.learner.zero1 ? 1 : 0)
                   << " tp=" << s_->opt.learner.tp << " ep=" << s_->opt.learner.ep << " pp=" << s_->opt.learner.pp << " cp=" << s_->opt.learner.cp
                   << " step=" << step_
                   << " version=" << version_;
  ConfigureResponse resp;
  resp.set_policy_version(version_);
  resp.set_step(step_);
  return resp;
}

TrainStepResponse Trainer::FinishStep(TrainStepResponse resp, bool new_policy) {
  ++step_;
  if (new_policy) ++version_;
  resp.set_policy_version(version_);
  PublishStatus();
  return resp;
}

absl::StatusOr<TrainStepResponse> Trainer::TrainStep(const TrainStepRequest& req) {
  absl::StatusOr<TrainStepResponse> resp = RunStep(req);
  if (!resp.ok() || !s_->opt.learner.release_memory_after_step) return resp;
  // learner.sleep: cache. What the step allocated and freed (activations,
  // gradients' scratch, the batch) goes back for colocated workers.
  const c10::Device device = s_->models.device;
  auto& m = *resp->mutable_metrics()->mutable_values();
  m["learner_memory_before_release_bytes"] = static_cast<double>(dist::ProcessMemoryBytes(device));
  dist::ReleaseCachedMemory(device);
  m["learner_memory_after_release_bytes"] = static_cast<double>(dist::ProcessMemoryBytes(device));
  return resp;
}

absl::StatusOr<TrainStepResponse> Trainer::RunStep(const TrainStepRequest& req) {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  if (req.step() != step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("step: expected ", step_, " (the next step), got ", req.step()));
  }
  if (s_->opt.kind == StageKind::kSft) {
    if (req.data_case() != TrainStepRequest::kFromTask || !req.from_task()) {
      return absl::InvalidArgumentError("data: an SFT stage trains with from_task = true");
    }
    return TrainSft();
  }
  if (s_->opt.is_pairs()) {
    if (req.data_case() != TrainStepRequest::kFromTask || !req.from_task()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data: a ", StageKindName(s_->opt.kind),
                       " stage trains with from_task = true (pairs from the stage)"));
    }
    return TrainPairs();
  }
  if (req.data_case() == TrainStepRequest::kGroups) {
    const int64_t G = req.groups().groups_size();
    if (G < s_->data_world) {
      return absl::InvalidArgumentError(
          absl::StrCat("groups: ", G, " groups for ", s_->data_world, " data-parallel replicas"));
    }
    std::vector<TrajectoryGroup> all(req.groups().groups().begin(), req.groups().groups().end());
    return TrainRlGlobal(std::move(all), 0.0);
  }
  if (req.data_case() == TrainStepRequest::kBuffer) {
    const BufferSource& src = req.buffer();
    if (src.num_groups() <= 0 || src.num_groups() % s_->data_world != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer.num_groups: must be a positive multiple of the data-parallel replicas (", s_->data_world, ")"));
    }
    if (src.experiment_id().empty()) return absl::InvalidArgumentError("buffer.experiment_id: required");
    if (source_ == nullptr) {
      return absl::FailedPreconditionError("no replay buffer (Configure with replay_buffer_address)");
    }
    if (!src.mode().empty() && src.mode() != "fifo" && src.mode() != "uniform" && src.mode() != "prioritized") {
      return absl::InvalidArgumentError(
          absl::StrCat("buffer.mode: \"", src.mode(), "\" is not fifo, uniform or prioritized"));
    }
    // Every shard draws the whole global batch (FIFO through a cursor of its
    // own), orders it by group id and trains on its slice. The batch, its
    // order and the split over shards then depend only on what is in the
    // buffer, not on which worker's groups landed first or which shard asked
    // first: the same run gives the same gradients (docs/decisions.md).
    BufferSource mine = src;
    if (s_->world > 1) mine.set_consumer_id(absl::StrCat(src.consumer_id(), "/r", s_->rank));
    const auto t0 = Clock::now();
    auto sampled = source_->Sample(mine, src.num_groups(), options_.sample_timeout);
    if (!sampled.ok()) return sampled.status();
    if (static_cast<int>(sampled->groups.size()) != src.num_groups()) {
      return absl::DataLossError(absl::StrCat("replay buffer returned ", sampled->groups.size(), " groups for ",
                                              src.num_groups()));
    }
    std::vector<TrajectoryGroup>& all = sampled->groups;
    std::stable_sort(all.begin(), all.end(), [](const TrajectoryGroup& a, const TrajectoryGroup& b) {
      return a.group_id() < b.group_id();
    });
    auto resp = TrainRlGlobal(std::move(all), Since(t0));
    if (!resp.ok()) return resp;
    if (!sampled->ack_token.empty()) {
      absl::Status acked = source_->Ack(mine, sampled->ack_token);
      // The step is applied; a lost ack only means redelivery later.
      if (!acked.ok()) RLMESH_LOG(WARNING) << "ack failed step=" << req.step() << ": " << acked;
    }
    return resp;
  }
  return absl::InvalidArgumentError("data: an RL stage trains on buffer or groups");
}

namespace {

// Chat examples -> one sequence each: the ids of the rendered conversation
// and, per position t, loss weight 1 when token t+1 is an assistant token
// (all tokens after the first with train_on_prompt).
absl::Status TokenizeChatItems(const std::vector<Example>& examples, const actor::Tokenizer& tokenizer,
                               bool train_on_prompt, std::vector<std::vector<Seq>>* items) {
  for (const Example& e : examples) {
    if (e.sft_spans.empty() && !train_on_prompt) {
      return absl::InvalidArgumentError(
          absl::StrCat("experiment.task: ", e.source, ": no assistant turn to train on (SFT needs one)"));
    }
    std::vector<ByteSpan> spans;
    for (const auto& [a, b] : e.sft_spans) spans.push_back({a, b});
    auto tok = TokenizeWithSpans(tokenizer, e.sft_text, spans);
    if (!tok.ok()) return absl::InvalidArgumentError(absl::StrCat("experiment.task: ", e.source, ": ", tok.status().message()));
    Seq q;
    q.ids.assign(tok->ids.begin(), tok->ids.end());
    q.mask.assign(q.ids.size(), 0.0f);
    for (size_t t = 0; t + 1 < q.ids.size(); ++t) q.mask[t] = train_on_prompt || tok->loss[t + 1] ? 1.0f : 0.0f;
    items->push_back({std::move(q)});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainStepResponse> Trainer::TrainRlGlobal(std::vector<TrajectoryGroup> all,
                                                         double seconds_sample) {
  // Dynamic sampling with refill selects from the whole global batch, the
  // same on every shard, before it is split.
  Metrics refill;
  if (s_->opt.rl.refill_groups > 0) all = KeepInformativeGroups(std::move(all), s_->opt.rl.refill_groups, &refill);
  auto resp = TrainRl(RankSlice(std::move(all), s_->data_rank, s_->data_world, s_->opt.rl.mini_batches),
                      seconds_sample);
  if (!resp.ok()) return resp;
  for (const auto& [k, v] : refill) (*resp->mutable_metrics()->mutable_values())[k] = v;
  return resp;
}

absl::Status Trainer::LoadStageData(const ExperimentConfig& exp, int stage_index, State* state) {
  State& s = *state;
  if (s.opt.kind == StageKind::kSft) {
    auto task = MakeTask(exp.task(), exp.seed(), exp.model().tokenizer());
    if (!task.ok()) return PrefixStatus("experiment.task", task.status());
    s.task = *std::move(task);
    if (s.task->train().empty()) return absl::InvalidArgumentError("experiment.task: no train examples");
    s.loader_seed = Mix(exp.seed(), static_cast<uint64_t>(stage_index));
    s.loader_data = &s.task->train();
    if (exp.task().kind() == "chat") {
      RLMESH_RETURN_IF_ERROR(TokenizeChatItems(s.task->train(), *s.tokenizer, s.opt.sft.train_on_prompt, &s.sft_items));
    } else if (exp.task().kind() == "text") {
      const int64_t L = exp.task().sequence_length() > 0 ? exp.task().sequence_length() : exp.model().max_positions();
      std::vector<std::string> texts;
      for (const Example& e : s.task->train()) texts.push_back(e.sft_text);
      for (PackedRow& row : PackDocuments(*s.tokenizer, texts, L)) {
        std::vector<Seq> item;
        for (std::vector<int>& piece : row.pieces) item.push_back(PromptResponseSeq(piece, {}, L, 0));
        s.sft_items.push_back(std::move(item));
      }
      s.sft_items_are_rows = true;
      s.sft_row_keys.resize(s.sft_items.size());
      for (size_t i = 0; i < s.sft_items.size(); ++i) s.sft_row_keys[i].id = absl::StrCat("row/", i);
      s.loader_data = &s.sft_row_keys;
    }
    s.loader = std::make_unique<PromptLoader>(s.loader_data, s.loader_seed);
  } else if (s.opt.is_pairs()) {
    const std::string& pairs_path = s.opt.pairs.pairs_path;
    const std::string fp = absl::StrCat(s.opt.field, ".", StageKindName(s.opt.kind), ".pairs_path");
    if (!pairs_path.empty()) {
      // Pairs in the chat format render through the task's chat template.
      std::optional<ChatRenderer> renderer;
      if (!exp.task().chat_template().empty()) {
        auto r = ChatRenderer::FromTask(exp.task(), exp.model().tokenizer());
        if (!r.ok()) return PrefixStatus("experiment", r.status());
        renderer = *std::move(r);
      }
      auto pairs = ReadPreferencePairs(pairs_path, renderer ? &*renderer : nullptr);
      if (!pairs.ok()) return PrefixStatus(fp, pairs.status());
      s.pairs = *std::move(pairs);
    } else {
      // Pairs from the task's train split: the answer against a near miss.
      auto task = MakeTask(exp.task(), exp.seed(), exp.model().tokenizer());
      if (!task.ok()) return PrefixStatus("experiment.task", task.status());
      TaskPairOptions po;
      po.seed = Mix(exp.seed(), 0x9a125);
      auto pairs = MakeTaskPreferencePairs((*task)->train(), po);
      if (!pairs.ok()) return PrefixStatus(fp + " (empty: pairs from experiment.task)", pairs.status());
      s.pairs = *std::move(pairs);
    }
    if (s.pairs.empty()) return absl::InvalidArgumentError(fp + ": no pairs");
    s.pair_keys.resize(s.pairs.size());
    for (size_t i = 0; i < s.pairs.size(); ++i) s.pair_keys[i].id = absl::StrCat(i);
    s.loader_seed = Mix(exp.seed(), static_cast<uint64_t>(stage_index));
    s.loader_data = &s.pair_keys;
    s.loader = std::make_unique<PromptLoader>(s.loader_data, s.loader_seed);
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::learner
