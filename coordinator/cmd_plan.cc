// `coordinator plan EXPERIMENT.yaml`: the memory each role needs against
// its device's (also `run --dry-run` of a local run).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "actor/model_config.h"
#include "actor/tokenizer.h"
#include "common/status_macros.h"
#include "coordinator/cli.h"
#include "coordinator/experiment_config.h"
#include "coordinator/memory_plan.h"
#include "tasks/encoding.h"
#include "tasks/task.h"

namespace rlmesh {
namespace {

// The policy's shape: the checkpoint's config.json, or the scratch sizes
// with the tokenizer's vocabulary (as the learner builds it).
absl::StatusOr<actor::ModelConfig> PolicyShape(const ExperimentConfig& cfg) {
  const ModelConfig& mc = cfg.model();
  if (mc.init() == "checkpoint") return actor::ModelConfig::FromHfConfigJson(mc.path() + "/config.json");
  RLMESH_ASSIGN_OR_RETURN(auto tokenizer, actor::LoadTokenizer(UserPath(mc.tokenizer())));
  actor::ModelConfig m;
  m.arch = mc.arch();
  m.vocab_size = tokenizer->vocab_size();
  m.hidden_size = mc.hidden();
  m.intermediate_size = mc.intermediate() != 0 ? mc.intermediate() : (8 * m.hidden_size / 3 + 7) / 8 * 8;
  m.num_layers = mc.layers();
  m.num_heads = mc.heads();
  m.num_kv_heads = mc.kv_heads();
  m.head_dim = mc.head_dim();
  m.max_positions = mc.max_positions();
  m.tie_embeddings = mc.tie_embeddings();
  return m;
}

// The longest rows the experiment trains on and generates, from its task's
// prompts and targets as the run encodes them. Preference pairs (DPO,
// reward models) and corpora are bounded by model.max_positions (0).
absl::StatusOr<PlanSequences> LongestSequences(const ExperimentConfig& cfg) {
  const std::string spec = UserPath(cfg.model().tokenizer());
  RLMESH_ASSIGN_OR_RETURN(auto tokenizer, actor::LoadTokenizer(spec));
  RLMESH_ASSIGN_OR_RETURN(auto task, MakeTask(cfg.task(), cfg.seed(), spec));
  int64_t prompt = 0, target = 0;
  for (const auto* split : {&task->train(), &task->eval()}) {
    for (const Example& e : *split) {
      prompt = std::max<int64_t>(prompt, EncodePrompt(*tokenizer, e.prompt).size());
      target = std::max<int64_t>(target, EncodeResponse(*tokenizer, e.answer).size());
    }
  }
  if (prompt == 0) return PlanSequences{};
  const int64_t generate = prompt + cfg.rollout().sampling().max_new_tokens();
  PlanSequences out{.train = 0, .generate = generate};
  for (const Stage& stage : cfg.stages()) {
    if (stage.has_sft()) {
      out.train = std::max(out.train, prompt + target);
    } else if (RlSettings(stage) != nullptr) {
      out.train = std::max(out.train, generate);
    } else {
      return PlanSequences{.train = 0, .generate = generate};  // pairs: the bound
    }
  }
  return out;
}

}  // namespace

// `coordinator plan` and `run --dry-run` of a local run: the memory plan,
// and 1 when it does not fit.
int PrintPlan(const char* command, const ExperimentConfig& cfg) {
  auto shape = PolicyShape(cfg);
  if (!shape.ok()) return Fail(command, shape.status());
  // The context the roles use is the experiment's (validated against the
  // checkpoint's at load).
  shape->max_positions = cfg.model().max_positions();
  auto sequences = LongestSequences(cfg);
  if (!sequences.ok()) return Fail(command, sequences.status());
  PlanCapacity capacity;
  capacity.host_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  capacity.gpu_bytes = absl::GetFlag(FLAGS_gpu_memory_gib) * (1 << 30);
  auto plan = PlanMemory(cfg, *shape, *sequences, capacity);
  if (!plan.ok()) return Fail(command, plan.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", MemoryPlanJson(*plan).dump(2).c_str());
  } else {
    std::printf("%s", FormatMemoryPlan(*plan).c_str());
  }
  absl::Status fits = CheckMemoryPlan(*plan);
  if (!fits.ok()) return Fail(command, fits);
  return 0;
}

int Plan(const std::vector<std::string>& args, const std::vector<std::string>& sets) {
  if (args.size() != 1) return Fail("plan", absl::InvalidArgumentError("expected one experiment YAML"));
  auto cfg = LoadExperiment(args[0], sets);
  if (!cfg.ok()) return Fail("plan", cfg.status());
  return PrintPlan("plan", *cfg);
}

}  // namespace rlmesh
