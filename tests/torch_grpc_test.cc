// LibTorch (PyPI wheel, which carries its own ONNX protobuf code) and
// Debian's gRPC/Protobuf in one process: real work with both, and data
// passing between them.
#include <torch/torch.h>

#include "catch2/catch.hpp"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "common/rpc_handler.h"
#include "common/rpc_server.h"
#include "proto/reward.grpc.pb.h"

namespace rlmesh {
namespace {

// Scores each completion with a tiny linear model: reward = w . onehot-sum.
class TorchReward final : public RewardService::CallbackService {
 public:
  TorchReward(const ServerAuth* auth, torch::Tensor w) : auth_(auth), w_(std::move(w)) {}
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx, const ScoreRequest* req,
                                  ScoreResponse* resp) override {
    return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
      torch::NoGradGuard no_grad;
      for (const auto& item : req->items()) {
        std::vector<int64_t> ids(item.completion_token_ids().begin(), item.completion_token_ids().end());
        auto t = torch::tensor(ids, torch::kLong);
        auto feats = torch::one_hot(t, w_.size(0)).to(torch::kFloat).sum(0);
        resp->add_results()->set_reward((feats * w_).sum().item<double>());
      }
      return absl::OkStatus();
    });
  }

 private:
  const ServerAuth* auth_;
  torch::Tensor w_;
};

TEST_CASE("torch trains and serves over gRPC in the same process") {
  torch::manual_seed(0);
  // Real torch work: fit w so that w[i] = i / 10 by gradient descent.
  auto target = torch::arange(8, torch::kFloat) / 10.0;
  auto w = torch::zeros({8}, torch::requires_grad());
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.5));
  for (int i = 0; i < 200; ++i) {
    opt.zero_grad();
    auto loss = (w - target).pow(2).sum();
    loss.backward();
    opt.step();
  }
  REQUIRE(torch::allclose(w.detach(), target, 1e-5, 1e-5));

  RpcServer server(ServerOptions{});
  TorchReward service(&server.auth(), w.detach().clone());
  server.AddService(&service);
  REQUIRE(server.Start().ok());
  auto client = RpcClient::Create(server.address());
  REQUIRE(client.ok());
  auto stub = RewardService::NewStub(client->channel());

  ScoreRequest req;
  auto* item = req.add_items();
  for (int id : {1, 3, 3, 7}) item->add_completion_token_ids(id);
  // Round-trip the request through protobuf serialization too.
  std::string wire;
  REQUIRE(req.SerializeToString(&wire));
  ScoreRequest parsed;
  REQUIRE(parsed.ParseFromString(wire));
  ScoreResponse resp;
  auto ctx = client->NewContext(absl::Seconds(10));
  grpc::Status s = stub->Score(ctx.get(), parsed, &resp);
  REQUIRE(s.ok());
  REQUIRE(resp.results_size() == 1);
  CHECK(resp.results(0).reward() == Approx((1 + 3 + 3 + 7) / 10.0).epsilon(1e-5));
}

}  // namespace
}  // namespace rlmesh
