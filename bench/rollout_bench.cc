// Rollout benchmarks (not a test). Report: bench/rollout.md.
//
// 1. Generation tokens/s through the rollout service (gRPC over loopback,
//    RolloutWorker engine, streamed groups) against actor::Generator called
//    directly on the same weights and request, alternated in one process.
// 2. Weight sync between two processes on this host: SHM and Gloo hand-off
//    of the same tensors, against a plain memcpy of the same bytes.
//
//   bazel run -c opt //bench:rollout_bench -- [--repeats=5] [--sync_mb=128]
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "actor/checkpoint.h"
#include "actor/generate.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "common/subprocess.h"
#include "proto/rollout.grpc.pb.h"
#include "rollout/rollout_worker.h"
#include "rollout/service.h"
#include "weight_sync/weight_sync.h"

ABSL_FLAG(int, repeats, 5, "Repeats of each measurement.");
ABSL_FLAG(int, threads, 2, "LibTorch intra-op threads.");
ABSL_FLAG(int, sync_mb, 128, "Weight bytes per sync round, MiB.");
ABSL_FLAG(int, prompts, 16, "Prompts per generation request.");
ABSL_FLAG(int, n, 4, "Samples per prompt.");
ABSL_FLAG(int, max_new_tokens, 64, "Tokens per sample.");
// Child-process role (internal).
ABSL_FLAG(std::string, role, "", "internal: 'recv' runs the receiving side.");
ABSL_FLAG(std::string, backend, "shm", "internal: shm or gloo.");
ABSL_FLAG(int, store_port, 0, "internal: Gloo store port.");
ABSL_FLAG(std::string, prefix, "", "internal: shm prefix.");
ABSL_FLAG(std::string, out, "", "internal: receiver's timing file.");
ABSL_FLAG(int, rounds, 0, "internal: rounds to receive.");

namespace rlmesh::rollout {
namespace {

using weight_sync::CreateWeightPublisher;
using weight_sync::CreateWeightReceiver;
using weight_sync::NamedTensors;
using weight_sync::WeightReceiver;
using weight_sync::WeightSyncStore;

struct Stats {
  double median, min, max;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}
std::string Fmt(const Stats& s, int prec = 1) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%.*f (%.*f–%.*f)", prec, s.median, prec, s.min, prec, s.max);
  return buf;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "rollout_bench: %s\n", s.ToString().c_str());
  return 1;
}

WeightSyncSpec Spec(const std::string& backend, int port, int rank, const std::string& prefix) {
  WeightSyncSpec spec;
  spec.set_backend(backend == "shm" ? WEIGHT_SYNC_SHM : WEIGHT_SYNC_GLOO);
  spec.set_store_host("127.0.0.1");
  spec.set_store_port(port);
  spec.set_world_size(2);
  spec.set_rank(rank);
  spec.set_group_name("bench");
  spec.set_timeout_ms(120000);
  spec.set_shm_prefix(prefix);
  spec.set_bucket_mb(32);
  return spec;
}

// Child: receives `rounds` versions, appends "version end_micros" lines.
int Receiver() {
  auto recv = CreateWeightReceiver(Spec(absl::GetFlag(FLAGS_backend), absl::GetFlag(FLAGS_store_port), 1,
                                        absl::GetFlag(FLAGS_prefix)));
  if (!recv.ok()) return Fail(recv.status());
  // As the rollout worker does: the first round allocates, later rounds
  // receive into the same buffers.
  NamedTensors buffers;
  for (int v = 1; v <= absl::GetFlag(FLAGS_rounds); ++v) {
    WeightLayout want;
    want.set_version(v);
    if (buffers.empty()) {
      auto got = (*recv)->Receive(want);
      if (!got.ok()) return Fail(got.status());
      buffers = std::move(*got);
    } else if (auto s = (*recv)->ReceiveInto(want, buffers); !s.ok()) {
      return Fail(s);
    }
    std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::app);
    out << v << " " << absl::ToUnixMicros(absl::Now()) << "\n";
  }
  return 0;
}

std::vector<int64_t> ReadEnds(const std::string& path) {
  std::ifstream in(path);
  std::vector<int64_t> ends;
  int64_t v, t;
  while (in >> v >> t) ends.push_back(t);
  return ends;
}

// ---------------------------------------------------------------------------

int GenerationBench(const std::string& dir) {
  actor::CharTokenizer tok;
  actor::ModelConfig c;
  c.vocab_size = tok.vocab_size();
  c.hidden_size = 256;
  c.intermediate_size = actor::DefaultIntermediateSize(256);
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 256;
  at::manual_seed(1);
  actor::Transformer model(c);
  if (auto s = actor::SaveHfModel(model, dir); !s.ok()) return Fail(s);

  GenerateRequest req;
  req.set_experiment_id("bench");
  req.set_n(absl::GetFlag(FLAGS_n));
  req.mutable_sampling()->set_temperature(1.0f);
  req.mutable_sampling()->set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  req.mutable_sampling()->set_seed(3);
  for (int i = 0; i < absl::GetFlag(FLAGS_prompts); ++i) {
    Prompt* p = req.add_prompts();
    p->set_prompt_id(absl::StrCat("p", i));
    for (int id : tok.Encode(absl::StrCat("What is ", i * 7, " + ", i * 3, "? Answer: "))) p->add_token_ids(id);
  }
  const int64_t tokens = static_cast<int64_t>(req.prompts_size()) * req.n() * req.sampling().max_new_tokens();

  // Direct: actor::Generator on a model loaded from the same folder.
  auto direct_model = actor::LoadHfModel(dir);
  if (!direct_model.ok()) return Fail(direct_model.status());
  auto direct = [&]() -> absl::StatusOr<double> {
    actor::Generator gen(*direct_model, {});
    std::vector<actor::GenerationRequest> reqs;
    for (int i = 0; i < req.prompts_size(); ++i) {
      actor::GenerationRequest g;
      g.id = i;
      g.prompt.assign(req.prompts(i).token_ids().begin(), req.prompts(i).token_ids().end());
      g.sampling.temperature = 1.0f;
      g.sampling.max_new_tokens = req.sampling().max_new_tokens();
      g.sampling.seed = 3;
      g.sampling.n = req.n();
      g.prompt_index = i;
      reqs.push_back(std::move(g));
    }
    const absl::Time start = absl::Now();
    auto out = gen.Generate(std::move(reqs));
    if (!out.ok()) return out.status();
    return absl::ToDoubleSeconds(absl::Now() - start);
  };

  // Service: the whole path a coordinator uses.
  RolloutWorker worker({}, std::make_unique<actor::CharTokenizer>());
  if (auto l = worker.LoadCheckpoint(dir, 1); !l.ok()) return Fail(l.status());
  RpcServer server(ServerOptions{});
  RolloutServiceImpl service(&worker, &server.auth());
  server.AddService(&service);
  if (auto s = server.Start(); !s.ok()) return Fail(s);
  auto client = RpcClient::Create(server.address());
  if (!client.ok()) return Fail(client.status());
  auto stub = RolloutService::NewStub(client->channel());
  auto via_service = [&]() -> absl::StatusOr<double> {
    const absl::Time start = absl::Now();
    auto ctx = client->NewContext(absl::Seconds(600));
    auto reader = stub->Generate(ctx.get(), req);
    GenerateResponse r;
    int groups = 0;
    while (reader->Read(&r)) ++groups;
    grpc::Status st = reader->Finish();
    if (!st.ok()) return absl::InternalError(st.error_message());
    if (groups != req.prompts_size()) return absl::InternalError("missing groups");
    return absl::ToDoubleSeconds(absl::Now() - start);
  };

  // Warm-up, then alternate.
  (void)direct();
  (void)via_service();
  std::vector<double> d_tps, s_tps, ratio;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    auto a = direct();
    auto b = via_service();
    if (!a.ok()) return Fail(a.status());
    if (!b.ok()) return Fail(b.status());
    d_tps.push_back(tokens / *a);
    s_tps.push_back(tokens / *b);
    ratio.push_back(*a / *b);
  }
  server.Shutdown();
  std::printf("## Generation (hidden 256, 4 layers, %d prompts x n=%d x %d tokens, %d threads)\n\n",
              req.prompts_size(), req.n(), req.sampling().max_new_tokens(), absl::GetFlag(FLAGS_threads));
  std::printf("| path | tokens/s median (min–max) |\n|---|---|\n");
  std::printf("| actor::Generator direct | %s |\n", Fmt(Summarize(d_tps)).c_str());
  std::printf("| rollout service (gRPC stream) | %s |\n", Fmt(Summarize(s_tps)).c_str());
  std::printf("| ratio service/direct | %s |\n\n", Fmt(Summarize(ratio), 3).c_str());
  return 0;
}

int SyncBench(const std::string& dir) {
  const int64_t total = static_cast<int64_t>(absl::GetFlag(FLAGS_sync_mb)) << 20;
  const int rounds = absl::GetFlag(FLAGS_repeats);
  NamedTensors tensors;
  const int64_t per = 16 << 20;  // 16 MiB tensors
  for (int64_t done = 0, i = 0; done < total; done += per, ++i) {
    tensors.emplace_back(absl::StrCat("w", i), at::randn({per / 4}));
  }
  const double gb = static_cast<double>(total) / 1e9;

  // Reference: a plain memcpy of the same bytes, into fresh and into
  // already-touched memory.
  std::vector<double> memcpy_fresh, memcpy_warm;
  for (int r = 0; r < rounds; ++r) {
    std::vector<char> src(total, 1);
    const absl::Time t0 = absl::Now();
    char* dst = static_cast<char*>(std::malloc(total));
    std::memcpy(dst, src.data(), total);
    const double fresh = absl::ToDoubleSeconds(absl::Now() - t0);
    const absl::Time t1 = absl::Now();
    std::memcpy(dst, src.data(), total);
    const double warm = absl::ToDoubleSeconds(absl::Now() - t1);
    std::free(dst);
    memcpy_fresh.push_back(gb / fresh);
    memcpy_warm.push_back(gb / warm);
  }

  std::map<std::string, std::vector<double>> publish_seconds;
  auto run_backend = [&](const std::string& backend, std::vector<double>* gbps) -> absl::Status {
    const std::string out = absl::StrCat(dir, "/", backend, ".times");
    const std::string prefix = absl::StrCat("/dev/shm/rlmesh-bench-", getpid(), "-");
    std::unique_ptr<WeightSyncStore> store;
    int port = 0;
    if (backend == "gloo") {
      auto s = WeightSyncStore::Host("127.0.0.1", 0, 2, 120000);
      if (!s.ok()) return s.status();
      store = std::move(*s);
      port = store->port();
    }
    auto child = Subprocess::Start({"/proc/self/exe", "--role=recv", "--backend=" + backend,
                                    absl::StrCat("--store_port=", port), "--prefix=" + prefix, "--out=" + out,
                                    absl::StrCat("--rounds=", rounds + 1),
                                    absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads))});
    if (!child.ok()) return child.status();
    auto pub = CreateWeightPublisher(Spec(backend, port, 0, prefix));
    if (!pub.ok()) return pub.status();
    for (int v = 1; v <= rounds + 1; ++v) {
      const int64_t start = absl::ToUnixMicros(absl::Now());
      auto layout = (*pub)->Publish(tensors, v);
      if (!layout.ok()) return layout.status();
      const double publish_s = (absl::ToUnixMicros(absl::Now()) - start) * 1e-6;
      // Wait for the receiver to finish this round (SHM does not block).
      const absl::Time deadline = absl::Now() + absl::Seconds(120);
      std::vector<int64_t> ends;
      while ((ends = ReadEnds(out)).size() < static_cast<size_t>(v) && absl::Now() < deadline) {
        absl::SleepFor(absl::Microseconds(200));
      }
      if (ends.size() < static_cast<size_t>(v)) return absl::DeadlineExceededError("receiver did not finish");
      if (v == 1) continue;  // warm-up: receiver start-up and first allocation
      gbps->push_back(gb / ((ends[v - 1] - start) * 1e-6));
      publish_seconds[backend].push_back(publish_s);
    }
    auto st = child->Wait(absl::Seconds(60));
    if (!st.ok()) return st.status();
    return absl::OkStatus();
  };
  std::vector<double> shm, gloo;
  if (auto s = run_backend("shm", &shm); !s.ok()) return Fail(s);
  if (auto s = run_backend("gloo", &gloo); !s.ok()) return Fail(s);
  const double ref = Summarize(memcpy_fresh).median;
  std::printf("## Weight sync, %d MiB fp32 in 32 MiB buckets, publisher and receiver in two processes\n\n",
              absl::GetFlag(FLAGS_sync_mb));
  std::printf("Hand-off time = publisher starts Publish -> the receiver's buffers (reused across versions, as the rollout worker does) hold the new weights. First round (start-up, allocation) dropped.\n\n");
  std::printf("| path | GB/s median (min–max) | vs memcpy (fresh) |\n|---|---|---|\n");
  std::printf("| memcpy, fresh destination | %s | 1.00 |\n", Fmt(Summarize(memcpy_fresh), 2).c_str());
  std::printf("| memcpy, warm destination | %s | %.2f |\n", Fmt(Summarize(memcpy_warm), 2).c_str(),
              Summarize(memcpy_warm).median / ref);
  std::printf("| SHM (/dev/shm files, 2 processes) | %s | %.2f |\n", Fmt(Summarize(shm), 2).c_str(),
              Summarize(shm).median / ref);
  std::printf("| Gloo broadcast (2 processes) | %s | %.2f |\n\n", Fmt(Summarize(gloo), 2).c_str(),
              Summarize(gloo).median / ref);
  std::printf("Publisher's share of the hand-off (Publish returned), seconds: SHM %s, Gloo %s\n\n",
              Fmt(Summarize(publish_seconds["shm"]), 3).c_str(), Fmt(Summarize(publish_seconds["gloo"]), 3).c_str());
  return 0;
}

}  // namespace
}  // namespace rlmesh::rollout

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  rlmesh::actor::ConfigureThreads(absl::GetFlag(FLAGS_threads));
  if (absl::GetFlag(FLAGS_role) == "recv") return rlmesh::rollout::Receiver();
  char tmpl[] = "/tmp/rollout_bench_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  int rc = rlmesh::rollout::GenerationBench(dir + "/model");
  if (rc == 0) rc = rlmesh::rollout::SyncBench(dir);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) std::fprintf(stderr, "rollout_bench: could not remove %s: %s\n", dir.c_str(), ec.message().c_str());
  return rc;
}
