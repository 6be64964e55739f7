// learner: one data-parallel shard of the trainer behind the Learner RPC.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "actor/threads.h"
#include "common/log.h"
#include "common/server_flags.h"
#include "dist/memory_fraction_flag.h"
#include "learner/service.h"
#include "learner/trainer.h"

ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads; 0 = all hardware threads.");
ABSL_FLAG(std::string, name, "learner", "Name of this shard in logs (e.g. learner-1).");
ABSL_FLAG(std::vector<std::string>, write_roots, {},
          "Comma-separated folders this shard may write checkpoints and models into; a Configure, Save or "
          "reward-model output outside them is refused (PERMISSION_DENIED). Empty = anywhere. The "
          "coordinator passes the run's folder.");
ABSL_FLAG(std::string, device, "cpu",
          "Where this shard trains when the experiment's model.device is empty: cpu, cuda or cuda:<index>.");
ABSL_FLAG(std::string, pack_rl, "auto",
          "RL steps' micro-batch layout: auto (packed when that removes a quarter of the padded slots), "
          "on (always packed) or off (one padded row per sequence). The same step up to summation order.");
ABSL_FLAG(bool, share_prompts, true,
          "Packed RL steps: a group's samples run their common prompt once, as a prefix their tokens attend "
          "to, where that lowers the estimated FLOPs. The same step up to summation order.");

int main(int argc, char** argv) {
  rlmesh::InitServerProcess(argc, argv, "learner", "learner --port=0 --port_file=PATH [--threads=N]");
  if (absl::GetFlag(FLAGS_name) != "learner") rlmesh::SetLogRole(absl::GetFlag(FLAGS_name));
  auto options = rlmesh::ServerOptionsFromFlags("learner");
  if (!options.ok()) {
    std::fprintf(stderr, "learner: %s\n", options.status().ToString().c_str());
    return 2;
  }
  if (absl::Status s = rlmesh::dist::ApplyCudaMemoryFractionFlag(); !s.ok()) {
    std::fprintf(stderr, "learner: %s\n", s.ToString().c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) < 0) {
    std::fprintf(stderr, "learner: --threads must be >= 0\n");
    return 2;
  }
  rlmesh::actor::ConfigureThreads(absl::GetFlag(FLAGS_threads));
  rlmesh::ClientOptions client_options;
  // The replay buffer shares the cluster's token.
  client_options.auth_token = options->auth_token;
  rlmesh::RpcServer server(*options);
  rlmesh::learner::TrainerOptions trainer_options;
  trainer_options.device = absl::GetFlag(FLAGS_device);
  trainer_options.write_roots = absl::GetFlag(FLAGS_write_roots);
  const std::string pack = absl::GetFlag(FLAGS_pack_rl);
  if (pack == "on") {
    trainer_options.pack_rl = rlmesh::learner::TrainerOptions::RlPacking::kOn;
  } else if (pack == "off") {
    trainer_options.pack_rl = rlmesh::learner::TrainerOptions::RlPacking::kOff;
  } else if (pack != "auto") {
    std::fprintf(stderr, "learner: --pack_rl: auto, on or off, not '%s'\n", pack.c_str());
    return 2;
  }
  trainer_options.share_prompts = absl::GetFlag(FLAGS_share_prompts);
  absl::Status valid = trainer_options.Validate();
  if (!valid.ok()) {
    std::fprintf(stderr, "learner: --%s\n", std::string(valid.message()).c_str());
    return 2;
  }
  RLMESH_LOG(INFO) << "write_roots="
                   << (trainer_options.write_roots.empty() ? "(anywhere)" : absl::StrJoin(trainer_options.write_roots, ","));
  rlmesh::learner::Trainer trainer(trainer_options);
  rlmesh::learner::LearnerService service(&trainer, &server.auth(), client_options);
  server.AddService(&service);
  return rlmesh::ServeUntilSignal(server);
}
