// Every RewardService RPC, structure-aware (fuzz/rpc_fuzz.h), against the
// real service: the built-in verifiers with the char tokenizer (ids are
// decoded when a request has no text). Requests that name a `command`
// verifier are skipped: it runs the program the request names, which is
// the point of it and not something to hand random argv. After each call
// the server still scores "12" against 12 as 1.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "actor/tokenizer.h"
#include "common/rpc_client.h"
#include "fuzz/rpc_fuzz.h"
#include "proto/reward.grpc.pb.h"
#include "reward_server/scorer.h"
#include "reward_server/service.h"

namespace {

std::string Check(const std::string& address) {
  auto client = rlmesh::RpcClient::Create(address);
  if (!client.ok()) return client.status().ToString();
  rlmesh::ScoreRequest req;
  rlmesh::ScoreItem* item = req.add_items();
  item->set_completion_text("12");
  item->set_reference_answer("12");
  rlmesh::ScoreResponse resp;
  const grpc::Status s =
      rlmesh::RewardService::NewStub(client->channel())->Score(client->NewContext(absl::Seconds(5)).get(), req, &resp);
  if (!s.ok()) return absl::StrCat("Score: ", s.error_message());
  if (resp.results_size() != 1 || resp.results(0).reward() != 1.0) {
    return absl::StrCat("Score of a right answer: ", resp.ShortDebugString());
  }
  return "";
}

rlmesh::fuzz::RpcFuzzHarness& Harness() {
  static rlmesh::fuzz::RpcFuzzHarness* harness = [] {
    static rlmesh::ServerAuth auth;
    auto tokenizer = rlmesh::actor::LoadTokenizer("char");
    if (!tokenizer.ok()) std::abort();
    rlmesh::ScorerOptions o;
    o.verifier_timeout = absl::Milliseconds(200);
    auto scorer = rlmesh::RewardScorer::Create(o, tokenizer->release());
    if (!scorer.ok()) std::abort();
    static rlmesh::RewardServiceImpl service(&auth, scorer->release());
    rlmesh::fuzz::RpcFuzzTarget t;
    t.services = {&service};
    t.service_names = {"rlmesh.RewardService"};
    t.fill.known_strings = {"exact_match", "numeric_answer", "countdown", "format", "length", "12",
                            "3+4*5",       "(1+2)*3",        "[0-9]+",    "(a*)*b", "1/0", "task"};
    t.allow = [](const google::protobuf::MethodDescriptor& m, const google::protobuf::Message& req) {
      if (m.name() != "Score") return true;
      for (const auto& v : static_cast<const rlmesh::ScoreRequest&>(req).verifiers()) {
        if (v.name() == "command") return false;
      }
      return true;
    };
    t.check = Check;
    return new rlmesh::fuzz::RpcFuzzHarness(std::move(t));
  }();
  return *harness;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return Harness().Run(data, size); }
