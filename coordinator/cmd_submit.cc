// `coordinator submit EXPERIMENT.yaml`: validates an experiment config and
// submits it to a running coordinator; prints its id.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/grpc_status.h"
#include "coordinator/cli.h"
#include "proto/coordinator.grpc.pb.h"

namespace rlmesh {

int Submit(const std::vector<std::string>& args, const std::vector<std::string>& sets) {
  if (args.size() != 1) return Fail("submit", absl::InvalidArgumentError("expected one experiment YAML"));
  auto cfg = LoadExperiment(args[0], sets);
  if (!cfg.ok()) return Fail("submit", cfg.status());
  // The coordinator runs elsewhere: send it an absolute tokenizer path.
  if (!cfg->model().tokenizer().empty() && cfg->model().tokenizer() != "char") {
    cfg->mutable_model()->set_tokenizer(std::filesystem::absolute(UserPath(cfg->model().tokenizer())).string());
  }
  auto client = CliClient();
  if (!client.ok()) return Fail("submit", client.status());
  auto stub = Coordinator::NewStub(client->channel());
  SubmitRequest req;
  *req.mutable_experiment() = *cfg;
  SubmitResponse resp;
  auto ctx = client->NewContext();
  grpc::Status s = stub->Submit(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("submit", FromGrpcStatus(s));
  std::printf("%s\n", resp.experiment_id().c_str());
  return 0;
}

}  // namespace rlmesh
