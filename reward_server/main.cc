// reward_server: scores completions with rule verifiers behind the
// RewardService RPC.
#include <cstdio>

#include "absl/flags/flag.h"
#include "actor/tokenizer.h"
#include "common/proto_yaml.h"
#include "common/server_flags.h"
#include "reward_server/scorer.h"
#include "reward_server/service.h"

ABSL_FLAG(std::string, tokenizer, "char",
          "Tokenizer that decodes token ids: 'char' or a tokenizer.json path.");
ABSL_FLAG(std::string, experiment, "",
          "Experiment YAML whose reward section gives the default verifiers "
          "(requests may name their own).");
ABSL_FLAG(double, verifier_timeout_seconds, 1.0, "Default deadline of one verifier call.");

int main(int argc, char** argv) {
  rlmesh::InitServerProcess(argc, argv, "reward_server",
                            "reward_server --port=0 --port_file=PATH [--tokenizer=char] [--experiment=YAML]");
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "reward_server: %s\n", s.ToString().c_str());
    return 2;
  };
  auto options = rlmesh::ServerOptionsFromFlags("reward_server");
  if (!options.ok()) return fail(options.status());
  auto tokenizer = rlmesh::actor::LoadTokenizer(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) return fail(tokenizer.status());
  rlmesh::ScorerOptions scorer_options;
  scorer_options.verifier_timeout = absl::Seconds(absl::GetFlag(FLAGS_verifier_timeout_seconds));
  if (!absl::GetFlag(FLAGS_experiment).empty()) {
    rlmesh::ExperimentConfig experiment;
    rlmesh::YamlSource source;
    absl::Status loaded = rlmesh::LoadYamlFile(absl::GetFlag(FLAGS_experiment), &experiment, &source);
    if (!loaded.ok()) return fail(loaded);
    for (const auto& v : experiment.reward().verifiers()) scorer_options.default_verifiers.push_back(v);
  }
  auto scorer = rlmesh::RewardScorer::Create(scorer_options, tokenizer->get());
  if (!scorer.ok()) return fail(scorer.status());
  rlmesh::RpcServer server(*options);
  rlmesh::RewardServiceImpl service(&server.auth(), scorer->get());
  server.AddService(&service);
  return rlmesh::ServeUntilSignal(server);
}
