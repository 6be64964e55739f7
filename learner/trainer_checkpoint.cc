// Trainer checkpoints: Save, Load and resume (the folder format is
// learner/checkpoint.h).

#include <ATen/ATen.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actor/checkpoint.h"
#include "actor/safetensors.h"
#include "common/atomic_file.h"
#include "common/log.h"
#include "common/path_root.h"
#include "common/status_macros.h"
#include "learner/checkpoint.h"
#include "learner/moments_layout.h"
#include "learner/trainer.h"
#include "learner/trainer_internal.h"

namespace rlmesh::learner {

using parallel::TensorParallelModel;

namespace fs = std::filesystem;

namespace {

// Whether a save under `l` writes ZeRO-1's per-rank moment files (the
// layout trainer_state.json's zero1 records). A pipeline's stages gather
// their ZeRO-1 shares and rank 0 writes the plain layout instead.
bool ZeroOneFiles(const LearnerSettings& l) { return l.zero1 && l.pp == 1; }

// The parameters DataParallel steps for `m`, as moments_layout.h names them
// (a reward model's and a critic's lm_head is left out of the optimizer).
ParameterShapes ShapesOf(actor::Transformer& m, bool skip_lm_head, bool adapters = false) {
  ParameterShapes out;
  for (auto& [name, t] : adapters ? m->AdapterParameters() : m->NamedParameters()) {
    if (skip_lm_head && name == "lm_head.weight") continue;
    out.emplace_back(name, t.sizes().vec());
  }
  return out;
}

using Visit = std::function<absl::Status(const std::string&, const at::Tensor&)>;
using MomentVisit = std::function<absl::Status(int, const std::string&, const at::Tensor&)>;

// A split model's checkpoint tensors, gathered one piece at a time (a unit
// under ZeRO-3, a parameter under TP), so that no rank holds them whole.
struct Streamed {
  actor::ModelConfig config;
  // The weights' names and whole shapes, in the order `weights` visits them.
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  // Elements of each AdamW moment in plain DP's flat layout.
  int64_t moments_numel = 0;
  std::function<absl::Status(const Visit&)> weights;
  // exp_avg's (k = 0), then exp_avg_sq's (k = 1), each in that flat order.
  std::function<absl::Status(const MomentVisit&)> moments;
};

Streamed FromSharded(FullyShardedModel& model) {
  return {model.config(), model.FullShapes(), model.full_numel(),
          [&model](const Visit& v) { return model.VisitFull(v); },
          [&model](const MomentVisit& v) { return model.VisitMoments(v); }};
}

// TP without ZeRO-1: `dp` holds the moments of this rank's trained slices;
// `trained` is plain DP's flat layout of the whole model.
Streamed FromTensorParallel(TensorParallelModel& model, const DataParallel& dp, const ParameterShapes& trained) {
  int64_t numel = 0;
  for (const auto& [name, shape] : trained) numel += c10::multiply_integers(shape);
  auto moments = [&model, &dp, &trained](const MomentVisit& visit) -> absl::Status {
    absl::Status first;
    for (int k = 0; k < 2; ++k) {
      const auto local = UnflattenLike(k == 0 ? dp.exp_avg() : dp.exp_avg_sq(), model.TrainedParameters());
      size_t i = 0;
      absl::Status s = model.VisitFullOf(local, [&](const std::string& name, const at::Tensor& full) -> absl::Status {
        if (!first.ok()) return absl::OkStatus();
        if (i >= trained.size() || trained[i].first != name) {
          return absl::InternalError(absl::StrCat("moments: ", name, " is out of the flat layout's order"));
        }
        ++i;
        return visit(k, name, full);
      });
      if (absl::IsAborted(s)) return s;
      if (first.ok()) first = s;
    }
    return first;
  };
  return {model.config(), model.FullShapes(), numel, [&model](const Visit& v) { return model.VisitFull(v); },
          moments};
}

// `open()` on the rank that writes (null elsewhere). Its error goes to
// *error, not back to the caller: the gathers still run, since the other
// ranks make them.
std::unique_ptr<actor::SafetensorsWriter> OpenOnWriter(
    bool writes, const std::function<absl::StatusOr<std::unique_ptr<actor::SafetensorsWriter>>()>& open,
    absl::Status* error) {
  if (!writes) return nullptr;
  auto o = open();
  if (o.ok()) return std::move(*o);
  *error = o.status();
  return nullptr;
}

// The weights of `model` written into the Hugging Face folder `dir` as they
// are gathered (every rank taking part gathers; `writes` on rank 0).
absl::Status StreamWeights(const Streamed& model, const std::string& dir, const actor::SaveOptions& so,
                           bool writes) {
  absl::Status open;
  std::unique_ptr<actor::SafetensorsWriter> w =
      OpenOnWriter(writes, [&] { return actor::OpenHfModelWriter(model.config, model.shapes, dir, so); }, &open);
  absl::Status st = model.weights([&](const std::string& name, const at::Tensor& t) {
    return w ? w->AppendTensor(name, t) : absl::OkStatus();
  });
  RLMESH_RETURN_IF_ERROR(open);
  RLMESH_RETURN_IF_ERROR(st);
  return w ? w->Commit() : absl::OkStatus();
}

// A split policy's checkpoint (and a split critic's) as it is gathered:
// ZeRO-3's and TP's gathers of the whole moments took two policies' worth
// on every rank taking part, and with weight sync in pieces the whole
// weights one more on rank 0 (bench/checkpoint_memory.md). The files are the
// ones the whole tensors make: the moments in plain DP's flat layout
// (policy, then critic) in `opt_path`, the weights in `staging` and
// `staging`/critic. Rank 0 already holding the whole, current policy (weight
// sync from one process) writes it from there. Every rank calls it;
// `takes_part`: this rank gathers (all under ZeRO-3; replica 0's under TP);
// `writes`: rank 0.
absl::Status StreamSplit(ModelSet& m, const Streamed& policy, const Streamed* critic, const std::string& staging,
                         const std::string& opt_path, const actor::SaveOptions& so, bool takes_part, bool writes) {
  if (!takes_part) return absl::OkStatus();
  std::vector<const Streamed*> models = {&policy};
  if (critic != nullptr) models.push_back(critic);
  std::vector<actor::SafetensorsSpec> specs;
  for (size_t i = 0; i < models.size(); ++i) {
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      specs.push_back({absl::StrCat(i == 0 ? "policy." : "critic.", moment), at::kFloat, {models[i]->moments_numel}});
    }
  }
  absl::Status open;
  std::unique_ptr<actor::SafetensorsWriter> w =
      OpenOnWriter(writes, [&] { return actor::SafetensorsWriter::Open(opt_path, std::move(specs)); }, &open);
  // Every rank makes every gather whatever failed on rank 0 (the others
  // wait in them); the first error is returned at the end.
  absl::Status first = open;
  auto keep = [&first](absl::Status s) {
    if (first.ok()) first = std::move(s);
  };
  for (const Streamed* model : models) {
    absl::Status one = model->moments([&](int, const std::string&, const at::Tensor& t) {
      return w && first.ok() ? w->AppendPart(t) : absl::OkStatus();
    });
    if (absl::IsAborted(one)) return one;
    keep(one);
  }
  if (w && first.ok()) keep(w->Commit());
  if (m.whole_on_demand && !m.whole_fresh) {
    absl::Status one = StreamWeights(policy, staging, so, writes && first.ok());
    if (absl::IsAborted(one)) return one;
    keep(one);
  } else if (writes && first.ok()) {
    keep(actor::SaveHfModel(m.policy, staging, so));
  }
  if (critic != nullptr) keep(StreamWeights(*critic, staging + "/critic", so, writes && first.ok()));
  return first;
}

}  // namespace

// Long because: the phases of a collective save (each rank's files, rank 0's state and commit,
// cleanup after a failure), each agreed over the group by one lambda over shared locals; every rank
// must run the same collectives in the same order, which reads clearest in one place.
absl::StatusOr<SaveResponse> Trainer::Save(const std::string& path) {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  RLMESH_RETURN_IF_ERROR(CheckWithinRoots(options_.write_roots, path, "path"));
  State& s = *s_;
  std::string final_dir = path;
  if (final_dir.empty()) {
    if (s.request.checkpoint_dir().empty()) {
      return absl::FailedPreconditionError("path: empty and no checkpoint_dir was configured");
    }
    final_dir = absl::StrCat(s.request.checkpoint_dir(), "/", CheckpointName(step_));
  }
  while (final_dir.size() > 1 && final_dir.back() == '/') final_dir.pop_back();
  const fs::path fp(final_dir);
  const std::string parent = fp.parent_path().empty() ? "." : fp.parent_path().string();
  const std::string staging = absl::StrCat(parent, "/.tmp-", fp.filename().string());
  // Every rank's outcome of a phase, agreed over the group: when one rank
  // failed (rank 0 on a full disk, most often) every rank returns an error
  // with its code at once, rather than waiting in a barrier the failed rank
  // never reaches. It is also the barrier between the phases.
  auto agree = [&](const absl::Status& mine) -> absl::Status {
    if (!s.models.group) return mine;
    RLMESH_ASSIGN_OR_RETURN(const int64_t code, s.models.MaxOverGroup(static_cast<int64_t>(mine.code())));
    if (!mine.ok() || code == 0) return mine;
    return absl::Status(static_cast<absl::StatusCode>(code), "another learner rank failed its part of the save");
  };
  // ZeRO-1 and EP: each rank writes its own moments; else rank 0 all of them
  // (also under PP with ZeRO-1, whose moments the stages gather).
  const bool per_rank = ZeroOneFiles(s.opt.learner) || s.opt.learner.ep > 1;
  const std::string opt_file =
      per_rank ? absl::StrFormat("optimizer-rank-%d.safetensors", s.rank) : "optimizer.safetensors";

  // Every rank's part of the files: the weights and moments it writes, and
  // the gathers it takes part in.
  auto write_parts = [&]() -> absl::Status {
    const actor::SaveOptions so{.tokenizer = s.tokenizer.get()};
    const std::string opt_path = absl::StrCat(staging, "/", opt_file);
    ModelSet& ms = s.models;
    if (ms.sharded) {
      // ZeRO-3: written as gathered, one unit at a time.
      if (ms.critic && !ms.sharded_critic) return absl::InternalError("ZeRO-3 checkpoint: the critic is not sharded");
      const Streamed policy = FromSharded(*ms.sharded);
      std::optional<Streamed> critic;
      if (ms.sharded_critic) critic = FromSharded(*ms.sharded_critic);
      RLMESH_RETURN_IF_ERROR(StreamSplit(ms, policy, critic ? &*critic : nullptr, staging, opt_path, so,
                                         /*takes_part=*/true, s.rank == 0));
    } else if (ms.tp_policy && !ms.zero1) {
      // TP: written as gathered, one parameter at a time, by replica 0.
      if (ms.critic && !ms.tp_critic) return absl::InternalError("TP checkpoint: the critic is not split");
      const Streamed policy = FromTensorParallel(*ms.tp_policy, *ms.dp, ms.policy_shapes);
      std::optional<Streamed> critic;
      if (ms.tp_critic) critic = FromTensorParallel(*ms.tp_critic, *ms.critic_dp, ms.critic_shapes);
      RLMESH_RETURN_IF_ERROR(StreamSplit(ms, policy, critic ? &*critic : nullptr, staging, opt_path, so,
                                         /*takes_part=*/ms.dp->rank() == 0, s.rank == 0));
    } else {
      // Under TP with ZeRO-1 and weight sync in pieces, rank 0 holds the
      // whole policy only from here until the next step.
      RLMESH_RETURN_IF_ERROR(s.models.GatherPolicy());
      // Under ZeRO-1 (with TP or not) each rank writes its own share of the
      // moments, under EP its own parameters'. Any of them resumes under
      // any layout (LoadFrom).
      RLMESH_ASSIGN_OR_RETURN(auto moments, s.models.PolicyMoments());
      // The critic likewise (TP with ZeRO-1: gathered into rank 0 only
      // while this save writes it).
      RLMESH_ASSIGN_OR_RETURN(auto critic_moments, s.models.CriticMoments());
      RLMESH_RETURN_IF_ERROR(s.models.GatherCritic());
      if (s.rank == 0 || per_rank) {
        std::vector<std::pair<std::string, at::Tensor>> t = {{"policy.exp_avg", moments.first},
                                                             {"policy.exp_avg_sq", moments.second}};
        if (s.models.critic) {
          t.emplace_back("critic.exp_avg", critic_moments.first);
          t.emplace_back("critic.exp_avg_sq", critic_moments.second);
        }
        RLMESH_RETURN_IF_ERROR(actor::WriteSafetensors(opt_path, t));
      }
      if (s.rank == 0) {
        RLMESH_RETURN_IF_ERROR(actor::SaveHfModel(s.models.policy, staging, so));
        if (s.models.critic) RLMESH_RETURN_IF_ERROR(actor::SaveHfModel(s.models.critic, staging + "/critic", so));
      }
    }
    return absl::OkStatus();
  };
  // Rank 0, once every part is written: trainer_state.json with the files'
  // digests, the commit and the pruning of old checkpoints.
  auto finish = [&]() -> absl::Status {
    TrainerState ts;
    ts.experiment = s.request.experiment().name();
    ts.stage_index = s.request.stage_index();
    ts.stage_kind = std::string(StageKindName(s.opt.kind));
    ts.step = step_;
    ts.policy_version = version_;
    ts.seed = s.request.experiment().seed();
    if (s.loader) {
      ts.loader_epoch = s.loader->cursor().epoch;
      ts.loader_index = s.loader->cursor().index;
    }
    ts.optimizer_steps = s.models.PolicySteps();
    ts.critic_optimizer_steps = s.models.CriticSteps();
    ts.world_size = s.world;
    ts.zero1 = ZeroOneFiles(s.opt.learner);
    // The moments' layout: a pipeline gathers plain DP's whole layout.
    ts.tp = s.models.pp_policy ? 1 : s.opt.learner.tp;
    ts.ep = s.opt.learner.ep;
    ts.critic_tp = s.models.tp_critic ? s.opt.learner.tp : 1;
    for (fs::recursive_directory_iterator it(staging), end; it != end; ++it) {
      if (!it->is_regular_file()) continue;
      const std::string rel = fs::relative(it->path(), staging).string();
      RLMESH_ASSIGN_OR_RETURN(ts.files[rel], DigestFile(it->path().string()));
    }
    RLMESH_RETURN_IF_ERROR(
        WriteFileAtomically(staging + "/trainer_state.json", TrainerStateToJson(ts)));
    RLMESH_RETURN_IF_ERROR(CommitCheckpoint(staging, final_dir));
    if (path.empty()) {
      const int keep = s.opt.learner.checkpoint_keep;
      RLMESH_RETURN_IF_ERROR(PruneCheckpoints(s.request.checkpoint_dir(), keep));
    }
    return absl::OkStatus();
  };
  absl::Status st = CatchAll("save", [&]() -> absl::Status {
    absl::Status made;
    if (s.rank == 0) {
      std::error_code ec;
      fs::remove_all(staging, ec);
      fs::create_directories(staging, ec);
      if (ec) made = absl::InternalError(absl::StrCat("create ", staging, ": ", ec.message()));
    }
    RLMESH_RETURN_IF_ERROR(agree(made));
    RLMESH_RETURN_IF_ERROR(agree(CatchAll("write", write_parts)));
    return agree(s.rank == 0 ? CatchAll("commit", finish) : absl::OkStatus());
  });
  s.models.DropGatheredCritic();
  if (!st.ok()) {
    // A save that failed part-way (a full disk, most often) leaves nothing
    // behind: a half-written staging folder would hold the space that the
    // next try needs. Committed checkpoints are untouched.
    if (s.rank == 0) {
      std::error_code ec;
      fs::remove_all(staging, ec);
    }
    return absl::Status(st.code(), absl::StrCat("checkpoint ", final_dir, " not saved (earlier ones are kept): ",
                                                st.message()));
  }
  RLMESH_LOG(INFO) << "saved path=" << final_dir << " step=" << step_ << " version=" << version_;
  if (s.opt.kind == StageKind::kRewardModel && !s.opt.pairs.output.empty() && step_ >= s.opt.pairs.steps && s.rank == 0) {
    // The trained reward model, as a plain HF folder (config says
    // ForSequenceClassification; score.weight is the head).
    absl::Status out = CatchAll("save reward model", [&]() -> absl::Status {
      std::error_code ec;
      fs::create_directories(s.opt.pairs.output, ec);
      if (ec) return absl::InternalError(absl::StrCat("create ", s.opt.pairs.output, ": ", ec.message()));
      return actor::SaveHfModel(s.models.policy, s.opt.pairs.output, {.tokenizer = s.tokenizer.get()});
    });
    if (!out.ok()) return PrefixStatus(absl::StrCat("experiment.stages[", s.request.stage_index(), "].reward_model.output"), out);
    RLMESH_LOG(INFO) << "reward model written path=" << s.opt.pairs.output;
  }
  SaveResponse resp;
  resp.set_path(final_dir);
  resp.set_step(step_);
  resp.set_policy_version(version_);
  return resp;
}

absl::StatusOr<LoadResponse> Trainer::Load(const std::string& path) {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  std::string dir = path;
  if (dir.empty()) {
    if (s_->request.checkpoint_dir().empty()) {
      return absl::FailedPreconditionError("path: empty and no checkpoint_dir was configured");
    }
    std::vector<std::string> refused;
    auto found = NewestValidCheckpoint(s_->request.checkpoint_dir(), s_->request.stage_index(), &refused);
    for (const std::string& r : refused) RLMESH_LOG(WARNING) << "refused checkpoint " << r;
    if (!found.ok()) {
      std::string why;
      for (const std::string& r : refused) absl::StrAppend(&why, "; refused ", r);
      return absl::NotFoundError(absl::StrCat(found.status().message(), why));
    }
    dir = found->path;
  }
  RLMESH_RETURN_IF_ERROR(LoadFrom(dir));
  PublishStatus();
  LoadResponse resp;
  resp.set_path(dir);
  resp.set_step(step_);
  resp.set_policy_version(version_);
  return resp;
}

absl::Status Trainer::LoadFrom(const std::string& dir) {
  State& s = *s_;
  RLMESH_ASSIGN_OR_RETURN(TrainerState ts, VerifyCheckpoint(dir));
  const absl::string_view kind = StageKindName(s.opt.kind);
  if (ts.stage_index != s.request.stage_index() || ts.stage_kind != kind) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": checkpoint of stage ", ts.stage_index, " (", ts.stage_kind, "), configured stage is ",
        s.request.stage_index(), " (", kind, ")"));
  }
  // A per-rank checkpoint (ZeRO-1, EP) of this very layout: each rank reads
  // its own file. Any other pair of layouts: every rank rebuilds the whole
  // policy's moments from the files and keeps its part
  // (learner/moments_layout.h).
  const bool per_rank = ts.zero1 || ts.ep > 1;
  const bool own_share = per_rank && ts.zero1 == ZeroOneFiles(s.opt.learner) && ts.world_size == s.world &&
                         ts.tp == s.opt.learner.tp && ts.ep == s.opt.learner.ep;
  const MomentsLayout saved{ts.world_size, ts.tp, ts.zero1, ts.ep};
  RLMESH_RETURN_IF_ERROR(CatchAll("load", [&]() -> absl::Status {
    RLMESH_RETURN_IF_ERROR(s.models.LoadPolicyWeights(dir, s.rank));
    if (s.models.critic) RLMESH_RETURN_IF_ERROR(s.models.LoadCriticWeights(dir + "/critic"));
    if (own_share) {
      const std::string opt_file = absl::StrFormat("%s/optimizer-rank-%d.safetensors", dir, s.rank);
      RLMESH_ASSIGN_OR_RETURN(auto file, actor::SafetensorsFile::Open(opt_file));
      RLMESH_ASSIGN_OR_RETURN(at::Tensor m, file->Read("policy.exp_avg"));
      RLMESH_ASSIGN_OR_RETURN(at::Tensor v, file->Read("policy.exp_avg_sq"));
      RLMESH_RETURN_IF_ERROR(PrefixStatus(opt_file, s.models.LoadPolicyMoments(m, v, ts.optimizer_steps)));
      if (s.models.critic) {
        RLMESH_ASSIGN_OR_RETURN(at::Tensor cm, file->Read("critic.exp_avg"));
        RLMESH_ASSIGN_OR_RETURN(at::Tensor cv, file->Read("critic.exp_avg_sq"));
        RLMESH_RETURN_IF_ERROR(PrefixStatus(
            opt_file, s.models.LoadCriticMoments(cm, cv, ts.critic_optimizer_steps, /*whole=*/false)));
      }
      return absl::OkStatus();
    }
    if (per_rank || s.opt.learner.zero1 || s.opt.learner.ep > 1) {
      RLMESH_LOG(INFO) << "resharding optimizer moments of " << dir << " from world_size=" << ts.world_size
                       << " tp=" << ts.tp << " zero1=" << ts.zero1 << " ep=" << ts.ep << " to world_size="
                       << s.world << " tp=" << s.opt.learner.tp << " zero1=" << s.opt.learner.zero1
                       << " ep=" << s.opt.learner.ep << " pp=" << s.opt.learner.pp;
    }
    const ParameterShapes policy_shapes =
        s.models.PolicySplit() ? s.models.policy_shapes
                               : ShapesOf(s.models.policy, s.opt.kind == StageKind::kRewardModel, s.models.lora);
    // A ZeRO-3 rank without TP reads only its share of a whole-layout file
    // (ranges of the flat moments); every other pair of layouts rebuilds
    // the whole moments and keeps its part.
    auto reads_share = [](const FullyShardedModel* m, const MomentsLayout& layout) {
      return m != nullptr && !m->tensor_parallel() && !layout.zero1 && layout.ep == 1;
    };
    if (reads_share(s.models.sharded.get(), saved)) {
      RLMESH_ASSIGN_OR_RETURN(auto read, OpenMomentsRanges(dir, saved, "policy", policy_shapes));
      RLMESH_RETURN_IF_ERROR(PrefixStatus(dir, s.models.sharded->LoadMomentsFrom(read, ts.optimizer_steps)));
    } else {
      RLMESH_ASSIGN_OR_RETURN(auto pm, ReadWholeMoments(dir, saved, "policy", policy_shapes));
      RLMESH_RETURN_IF_ERROR(PrefixStatus(
          dir, s.models.LoadPolicyMoments(pm.first, pm.second, ts.optimizer_steps, /*whole=*/true)));
    }
    if (s.models.critic) {
      // PPO's critic is split as the policy is under TP (critic_tp) and
      // ZeRO-3 (rank 0 writes its gathered moments, as plain DP's rank 0
      // does), and under EP whole on every rank, each rank's own file
      // holding its whole moments (EP has no ZeRO-1): rank 0's file is
      // read as the one share of one rank.
      const MomentsLayout critic_saved =
          ts.ep > 1 ? MomentsLayout{1, 1, true, 1} : MomentsLayout{ts.world_size, ts.critic_tp, ts.zero1, 1};
      if (reads_share(s.models.sharded_critic.get(), critic_saved)) {
        RLMESH_ASSIGN_OR_RETURN(auto read, OpenMomentsRanges(dir, critic_saved, "critic", s.models.critic_shapes));
        RLMESH_RETURN_IF_ERROR(
            PrefixStatus(dir, s.models.sharded_critic->LoadMomentsFrom(read, ts.critic_optimizer_steps)));
      } else {
        RLMESH_ASSIGN_OR_RETURN(auto cm,
                                ReadWholeMoments(dir, critic_saved, "critic", s.models.critic_shapes));
        RLMESH_RETURN_IF_ERROR(PrefixStatus(
            dir, s.models.LoadCriticMoments(cm.first, cm.second, ts.critic_optimizer_steps, /*whole=*/true)));
      }
    }
    return absl::OkStatus();
  }));
  if (s.loader_data != nullptr) {
    s.loader = std::make_unique<PromptLoader>(s.loader_data, s.loader_seed,
                                              LoaderCursor{ts.loader_epoch, ts.loader_index});
  }
  step_ = ts.step;
  version_ = ts.policy_version;
  return absl::OkStatus();
}

}  // namespace rlmesh::learner
