// seed_tool ADDRESS EXPERIMENT: puts 3 steps x 2 groups x 4 samples with
// known rewards into a running replay buffer (for cli_test).
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/rpc_client.h"
#include "proto/replay_buffer.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  auto client = rlmesh::RpcClient::Create(argv[1]);
  if (!client.ok()) return 1;
  auto stub = rlmesh::ReplayBuffer::NewStub(client->channel());
  rlmesh::PutGroupsRequest req;
  for (int step = 0; step < 3; ++step) {
    for (int g = 0; g < 2; ++g) {
      auto* group = req.add_groups();
      group->set_experiment_id(argv[2]);
      group->set_step(step);
      group->set_group_id(absl::StrCat("s", step, "g", g));
      group->set_prompt_id(absl::StrCat("prompt", g));
      for (int j = 0; j < 4; ++j) {
        auto* t = group->add_samples();
        t->set_trajectory_id(absl::StrCat(argv[2], "/", step, "/", g, "/", j));
        t->set_sample_index(j);
        t->set_policy_version(step);
        t->set_reward(g == 0 ? (j == 0 ? 1.0 : 0.0) : 0.5);
        t->set_finish_reason(rlmesh::FINISH_REASON_STOP);
        for (int k = 0; k <= j; ++k) {
          t->add_response_token_ids(k);
          t->add_loss_mask(1);
          t->add_behaviour_logprobs(-1);
        }
        t->set_response_text(absl::StrCat("answer-", step, "-", g, "-", j));
      }
    }
  }
  rlmesh::PutGroupsResponse resp;
  auto ctx = client->NewContext(absl::Seconds(10));
  grpc::Status s = stub->PutGroups(ctx.get(), req, &resp);
  if (!s.ok()) {
    std::fprintf(stderr, "seed_tool: %s\n", s.error_message().c_str());
    return 1;
  }
  std::printf("written=%d\n", resp.written());
  return 0;
}
