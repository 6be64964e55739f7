// reward_server: scores completions with rule verifiers and an optional
// reward model behind the RewardService RPC.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "actor/tokenizer.h"
#include "common/proto_yaml.h"
#include "common/server_flags.h"
#include "dist/device.h"
#include "dist/memory_fraction_flag.h"
#include "reward_server/reward_model.h"
#include "reward_server/scorer.h"
#include "reward_server/service.h"

ABSL_FLAG(std::string, tokenizer, "char",
          "Tokenizer that decodes token ids: 'char' or a tokenizer.json path.");
ABSL_FLAG(std::string, experiment, "",
          "Experiment YAML whose reward section gives the default verifiers "
          "(requests may name their own).");
ABSL_FLAG(double, verifier_timeout_seconds, 1.0, "Default deadline of one verifier call.");
ABSL_FLAG(double, reward_model_timeout_seconds, 60.0,
          "Longest a Score call waits for the reward model (the caller's deadline applies when sooner).");
ABSL_FLAG(std::string, reward_model, "",
          "Reward model folder (HF config.json with a scalar head + safetensors); overrides the "
          "experiment's reward.reward_model. Empty = none.");
ABSL_FLAG(int, rm_max_batch, 32, "Reward model: most items in one forward pass.");
ABSL_FLAG(double, rm_max_wait_ms, 5.0, "Reward model: longest wait for a fuller batch, milliseconds.");
ABSL_FLAG(int64_t, rm_cache_size, 65536, "Reward model: results kept in the LRU cache; 0 disables it.");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads; 0 = all hardware threads.");
ABSL_FLAG(std::string, device, "cpu",
          "Where the reward model runs: cpu, cuda or cuda:<index> (of the devices CUDA_VISIBLE_DEVICES shows).");
ABSL_FLAG(std::vector<std::string>, allowed_commands, {},
          "Programs a Score request may run as a `command` verifier (comma-separated paths). The "
          "--experiment's own command verifiers are always allowed; any other program a request names "
          "is refused. Default none.");
ABSL_FLAG(int, score_threads, 32,
          "Threads running Score calls; a call holds one while its verifiers and the reward model run.");
ABSL_FLAG(int, score_queue, 128,
          "Score calls that may wait for a score thread; a call past --score_threads + --score_queue is "
          "answered RESOURCE_EXHAUSTED at once (clients retry it with backoff).");
ABSL_FLAG(int, verifier_threads, 64,
          "Threads running blocking verifier calls (command, format), one call per item and verifier.");
ABSL_FLAG(int, verifier_queue, 8192,
          "Blocking verifier calls that may wait for a verifier thread; a request whose calls do not fit "
          "is answered RESOURCE_EXHAUSTED.");
ABSL_FLAG(double, reward_model_weight, 0,
          "Weight of the reward model's score in the summed reward; 0 = the experiment's, else 1.");

int main(int argc, char** argv) {
  rlmesh::InitServerProcess(argc, argv, "reward_server",
                            "reward_server --port=0 --port_file=PATH [--tokenizer=char] [--experiment=YAML]");
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "reward_server: %s\n", s.ToString().c_str());
    return 2;
  };
  auto options = rlmesh::ServerOptionsFromFlags("reward_server");
  if (!options.ok()) return fail(options.status());
  if (absl::Status s = rlmesh::dist::ApplyCudaMemoryFractionFlag(); !s.ok()) return fail(s);
  auto tokenizer = rlmesh::actor::LoadTokenizer(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) return fail(tokenizer.status());
  rlmesh::ScorerOptions scorer_options;
  scorer_options.verifier_timeout = absl::Seconds(absl::GetFlag(FLAGS_verifier_timeout_seconds));
  scorer_options.reward_model_timeout = absl::Seconds(absl::GetFlag(FLAGS_reward_model_timeout_seconds));
  scorer_options.allowed_commands = absl::GetFlag(FLAGS_allowed_commands);
  scorer_options.verifier_threads = absl::GetFlag(FLAGS_verifier_threads);
  scorer_options.verifier_queue = absl::GetFlag(FLAGS_verifier_queue);
  rlmesh::RewardServiceOptions service_options;
  service_options.score_threads = absl::GetFlag(FLAGS_score_threads);
  service_options.score_queue = absl::GetFlag(FLAGS_score_queue);
  if (absl::Status s = service_options.Validate(); !s.ok()) return fail(s);
  std::string rm_dir = absl::GetFlag(FLAGS_reward_model);
  if (!absl::GetFlag(FLAGS_experiment).empty()) {
    rlmesh::ExperimentConfig experiment;
    rlmesh::YamlSource source;
    absl::Status loaded = rlmesh::LoadYamlFile(absl::GetFlag(FLAGS_experiment), &experiment, &source);
    if (!loaded.ok()) return fail(loaded);
    for (const auto& v : experiment.reward().verifiers()) scorer_options.default_verifiers.push_back(v);
    if (rm_dir.empty()) rm_dir = experiment.reward().reward_model();
    if (experiment.reward().reward_model_weight() != 0) {
      scorer_options.reward_model_weight = experiment.reward().reward_model_weight();
    }
  }
  if (absl::GetFlag(FLAGS_reward_model_weight) != 0) {
    scorer_options.reward_model_weight = absl::GetFlag(FLAGS_reward_model_weight);
  }
  std::unique_ptr<rlmesh::RewardModel> reward_model;
  if (!rm_dir.empty()) {
    rlmesh::RewardModelOptions rm_options;
    rm_options.max_batch = absl::GetFlag(FLAGS_rm_max_batch);
    rm_options.max_wait = absl::Microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_rm_max_wait_ms) * 1000));
    rm_options.cache_size = absl::GetFlag(FLAGS_rm_cache_size);
    auto device = rlmesh::dist::ResolveDevice(absl::GetFlag(FLAGS_device), "reward_server --device");
    if (!device.ok()) return fail(device.status());
    rm_options.device = device->str();
    // LibTorch defaults to one thread on these machines: always set it.
    rm_options.threads = absl::GetFlag(FLAGS_threads) > 0
                             ? absl::GetFlag(FLAGS_threads)
                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    auto loaded = rlmesh::RewardModel::Load(rm_dir, rm_options);
    if (!loaded.ok()) return fail(loaded.status());
    reward_model = std::move(*loaded);
    scorer_options.reward_model = reward_model.get();
  }
  auto scorer = rlmesh::RewardScorer::Create(scorer_options, tokenizer->get());
  if (!scorer.ok()) return fail(scorer.status());
  rlmesh::RpcServer server(*options);
  rlmesh::RewardServiceImpl service(&server.auth(), scorer->get(), service_options);
  server.AddService(&service);
  return rlmesh::ServeUntilSignal(server);
}
