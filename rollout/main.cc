// rollout_worker: serves the RolloutService RPC (batched generation with
// versioned weights; pipeline mode scores with a reward server and stores in
// the replay buffer).
#include <cstdio>

#include "absl/flags/flag.h"
#include "actor/tokenizer.h"
#include "actor/threads.h"
#include "common/rpc_client.h"
#include "common/server_flags.h"
#include "dist/device.h"
#include "dist/memory_fraction_flag.h"
#include "reward_server/client.h"
#include "rollout/rollout_worker.h"
#include "rollout/service.h"

ABSL_FLAG(std::string, replay_buffer, "", "HOST:PORT of the replay buffer (pipeline mode needs it).");
ABSL_FLAG(std::string, reward_server, "", "HOST:PORT of the reward server (pipeline mode needs it).");
ABSL_FLAG(std::string, tokenizer, "char", "Tokenizer: 'char' or a tokenizer.json path (or its folder).");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads; 0 = all hardware threads.");
ABSL_FLAG(std::string, name, "rollout-0", "Worker name recorded in every trajectory's provenance.");
ABSL_FLAG(int64_t, max_queue, 64, "Requests waiting before Generate answers RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_batch, 64, "Sequences decoded at once.");
ABSL_FLAG(int, tensor_parallel, 1,
          "Tensor-parallel ranks (threads in lockstep) the policy is split over; > 1 needs --device=cpu, fp32.");
ABSL_FLAG(std::string, on_update, "finish",
          "Weight update during generation: 'finish' in-flight sequences on the old weights, 'abort' them and "
          "regenerate on the new ones, or 'partial': continue them from their tokens on the new ones.");
ABSL_FLAG(std::string, dtype, "",
          "Parameter dtype the policy generates in: fp32, bf16 or fp16; every weight sync must carry it. "
          "Default: bf16 on a CUDA device, fp32 on the CPU.");
ABSL_FLAG(std::string, device, "cpu",
          "Where the policy generates: cpu, cuda or cuda:<index> (of the devices CUDA_VISIBLE_DEVICES shows).");
ABSL_FLAG(std::string, checkpoint, "", "Hugging Face folder to load at start (version 1); optional.");
ABSL_FLAG(bool, cuda_graphs, false,
          "Replay the decode step from CUDA graphs (one per batch bucket); needs --device=cuda and "
          "--tensor_parallel=1.");
ABSL_FLAG(int, environment_threads, 16,
          "Threads calling environment servers in multi-turn rollouts (one per turn awaiting its environment).");
ABSL_FLAG(double, client_timeout_seconds, 30.0, "Deadline of one reward/replay attempt.");
ABSL_FLAG(double, client_retry_seconds, 120.0, "Give up on a reward/replay call after this long.");

int main(int argc, char** argv) {
  rlmesh::InitServerProcess(argc, argv, "rollout_worker",
                            "rollout_worker --port=0 --port_file=PATH [--reward_server=H:P --replay_buffer=H:P] "
                            "[--tokenizer=char] [--checkpoint=DIR]");
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "rollout_worker: %s\n", s.ToString().c_str());
    return 2;
  };
  auto options = rlmesh::ServerOptionsFromFlags("rollout_worker");
  if (!options.ok()) return fail(options.status());
  if (absl::Status s = rlmesh::dist::ApplyCudaMemoryFractionFlag(); !s.ok()) return fail(s);
  rlmesh::actor::ConfigureThreads(absl::GetFlag(FLAGS_threads));
  auto tokenizer = rlmesh::actor::LoadTokenizer(absl::GetFlag(FLAGS_tokenizer));
  if (!tokenizer.ok()) return fail(tokenizer.status());

  rlmesh::RetryOptions retry;
  retry.attempt_timeout = absl::Seconds(absl::GetFlag(FLAGS_client_timeout_seconds));
  retry.total_timeout = absl::Seconds(absl::GetFlag(FLAGS_client_retry_seconds));
  rlmesh::ClientOptions client_options;
  client_options.auth_token = options->auth_token;  // one shared cluster token
  std::unique_ptr<rlmesh::RewardClient> reward;
  std::unique_ptr<rlmesh::ReplayBufferClient> replay;
  if (!absl::GetFlag(FLAGS_reward_server).empty()) {
    auto c = rlmesh::RpcClient::Create(absl::GetFlag(FLAGS_reward_server), client_options);
    if (!c.ok()) return fail(c.status());
    reward = rlmesh::MakeGrpcRewardClient(*c, retry);
  }
  if (!absl::GetFlag(FLAGS_replay_buffer).empty()) {
    auto c = rlmesh::RpcClient::Create(absl::GetFlag(FLAGS_replay_buffer), client_options);
    if (!c.ok()) return fail(c.status());
    replay = rlmesh::MakeGrpcReplayBufferClient(*c, retry);
  }

  rlmesh::rollout::RolloutWorkerOptions worker_options;
  worker_options.name = absl::GetFlag(FLAGS_name);
  worker_options.max_queue = absl::GetFlag(FLAGS_max_queue);
  worker_options.max_batch = absl::GetFlag(FLAGS_max_batch);
  worker_options.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  // Resolved before anything loads, so a missing GPU fails the start with
  // the worker and the device named, not the first weight load.
  auto device = rlmesh::dist::ResolveDevice(absl::GetFlag(FLAGS_device), worker_options.name + " --device");
  if (!device.ok()) return fail(device.status());
  worker_options.device = device->str();
  worker_options.dtype = absl::GetFlag(FLAGS_dtype);
  if (worker_options.dtype.empty()) worker_options.dtype = device->is_cuda() ? "bf16" : "fp32";
  worker_options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  worker_options.environment_threads = absl::GetFlag(FLAGS_environment_threads);
  worker_options.environment_auth_token = options->auth_token;  // one shared cluster token
  auto on_update = rlmesh::rollout::ParseOnUpdate(absl::GetFlag(FLAGS_on_update));
  if (!on_update.ok()) return fail(on_update.status());
  worker_options.on_update = *on_update;
  absl::Status valid = worker_options.Validate();
  if (!valid.ok()) return fail(valid);

  rlmesh::rollout::RolloutWorker worker(worker_options, std::move(*tokenizer), reward.get(), replay.get());
  if (!absl::GetFlag(FLAGS_checkpoint).empty()) {
    auto loaded = worker.LoadCheckpoint(absl::GetFlag(FLAGS_checkpoint), 1);
    if (!loaded.ok()) return fail(loaded.status());
  }
  int code;
  {
    rlmesh::RpcServer server(*options);
    rlmesh::rollout::RolloutServiceImpl service(&worker, &server.auth());
    server.AddService(&service);
    code = rlmesh::ServeUntilSignal(server);
  }
  return code;
}
