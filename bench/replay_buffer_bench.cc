// replay_buffer_bench: the replay buffer through gRPC against RocksDB used
// directly with identical options (replay_buffer::MakeRocksOptions), in the
// same process and run, side by side.
//
//   1. Put throughput (trajectories/s), synced WAL, T concurrent writers, one
//      group of 8 trajectories per call/WriteBatch, ~1 KB and ~64 KB records.
//   2. Query and Sample latency (p50/p99) over a store loaded with
//      --query_trajectories 1 KB trajectories.
// Every measurement is repeated --repeats times; the report gives the median
// and the min..max spread. Output is markdown on stdout.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "proto/replay_buffer.grpc.pb.h"
#include "replay_buffer/codec.h"
#include "replay_buffer/service.h"
#include "replay_buffer/store.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

ABSL_FLAG(int64_t, trajectories_1k, 40000, "Trajectories written per repeat, 1 KB records.");
ABSL_FLAG(int64_t, trajectories_64k, 4000, "Trajectories written per repeat, 64 KB records.");
ABSL_FLAG(int64_t, query_trajectories, 1000000, "Store size for the latency part (1 KB records).");
ABSL_FLAG(int, threads, 16, "Concurrent writers.");
ABSL_FLAG(int, repeats, 3, "Repeats of each measurement.");
ABSL_FLAG(int, latency_calls, 1000, "Calls per latency repeat.");
ABSL_FLAG(std::string, dir, "/tmp/rlmesh_rb_bench", "Scratch directory (wiped).");

namespace rlmesh {
namespace {

constexpr int kSamples = 8;
constexpr int kGroupsPerStep = 64;

TrajectoryGroup MakeGroup(const std::string& exp, int64_t index, int record_bytes) {
  TrajectoryGroup g;
  g.set_experiment_id(exp);
  g.set_step(index / kGroupsPerStep);
  g.set_group_id(absl::StrCat("g", index));
  g.set_prompt_id(absl::StrCat("p", index % 1000));
  // Token ids 0..2^20 take ~3 varint bytes, + mask 1 + logprob 4: ~8 bytes.
  const int tokens = std::max(1, record_bytes / 8);
  for (int j = 0; j < kSamples; ++j) {
    Trajectory* t = g.add_samples();
    t->set_trajectory_id(absl::StrCat(exp, "/", index, "/", j));
    t->set_sample_index(j);
    t->set_policy_version(g.step());
    t->set_reward((index + j) % 3 == 0 ? 1.0 : 0.0);
    for (int k = 0; k < 16; ++k) t->add_prompt_token_ids(k);
    for (int k = 0; k < tokens; ++k) {
      t->add_response_token_ids(50000 + (k * 7919 + j) % 70000);
      t->add_loss_mask(1);
      t->add_behaviour_logprobs(-0.25f);
    }
  }
  return g;
}

struct Summary {
  double median = 0, lo = 0, hi = 0;
};
Summary Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}
std::string Fmt(const Summary& s, const char* f = "%.0f") {
  return absl::StrCat(absl::StrFormat(f, s.median), " (", absl::StrFormat(f, s.lo), "..",
                      absl::StrFormat(f, s.hi), ")");
}
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Runs `body(i)` for i in [0, n) on `threads` threads; returns seconds.
double Parallel(int threads, int64_t n, const std::function<void(int64_t)>& body) {
  std::atomic<int64_t> next{0};
  const absl::Time t0 = absl::Now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int64_t i = next++; i < n; i = next++) body(i);
    });
  }
  for (auto& t : pool) t.join();
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

// RocksDB opened directly with ReplayStore's options; writes the same keys
// (data per sample, idempotency key per sample, group summary, prompt index,
// group key) in one synced batch per group.
class DirectDb {
 public:
  explicit DirectDb(const std::string& path) {
    ReplayStoreOptions o;
    o.db_path = path;
    rocksdb::DBOptions dbo;
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
    MakeRocksOptions(o, &dbo, &cfs);
    rocksdb::DB* db;
    rocksdb::Status s = rocksdb::DB::Open(dbo, path, cfs, &handles_, &db);
    if (!s.ok()) {
      std::fprintf(stderr, "open: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    db_.reset(db);
  }
  ~DirectDb() {
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    db_->Close();
  }
  static std::string Key(const std::string& exp, int64_t step, int64_t seq, int sample = -1) {
    std::string k = exp;
    k.push_back('\0');
    replay::PutBe64(&k, step);
    replay::PutBe64(&k, seq);
    if (sample >= 0) replay::PutBe32(&k, sample);
    return k;
  }
  void Put(const TrajectoryGroup& g, int64_t seq) {
    rocksdb::WriteBatch batch;
    std::string value;
    for (int j = 0; j < g.samples_size(); ++j) {
      g.samples(j).SerializeToString(&value);
      batch.Put(handles_[1], Key(g.experiment_id(), g.step(), seq, j), value);
      batch.Put(handles_[4], "t" + g.samples(j).trajectory_id(), "12345678");
    }
    batch.Put(handles_[2], Key(g.experiment_id(), 0, seq), std::string(120, 's'));
    batch.Put(handles_[3], g.prompt_id() + Key(g.experiment_id(), g.step(), seq), "");
    batch.Put(handles_[4], "g" + g.group_id(), "12345678");
    rocksdb::WriteOptions wo;
    wo.sync = true;
    rocksdb::Status s = db_->Write(wo, &batch);
    if (!s.ok()) std::exit(1);
  }
  // Reads `n` consecutive trajectories starting at `step`.
  int ReadRange(const std::string& exp, int64_t step, int n) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), handles_[1]));
    int got = 0;
    Trajectory t;
    for (it->Seek(Key(exp, step, 0)); it->Valid() && got < n; it->Next()) {
      t.ParseFromArray(it->value().data(), it->value().size());
      ++got;
    }
    return got;
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
};

struct InProcessServer {
  explicit InProcessServer(const std::string& path, bool sync = true) {
    ReplayStoreOptions o;
    o.db_path = path;
    o.sync_writes = sync;
    store = std::move(ReplayStore::Open(o)).value();
    server = std::make_unique<RpcServer>(ServerOptions{});
    service = std::make_unique<ReplayBufferService>(store.get(), &server->auth());
    server->AddService(service.get());
    if (!server->Start().ok()) std::exit(1);
    client = std::make_unique<RpcClient>(RpcClient::Create(server->address()).value());
    stub = ReplayBuffer::NewStub(client->channel());
  }
  ~InProcessServer() {
    server->Shutdown();
    service.reset();
  }
  std::unique_ptr<ReplayStore> store;
  std::unique_ptr<RpcServer> server;
  std::unique_ptr<ReplayBufferService> service;
  std::unique_ptr<RpcClient> client;
  std::unique_ptr<ReplayBuffer::Stub> stub;
};

void PutBench(int record_bytes, int64_t trajectories, const std::string& dir) {
  const int threads = absl::GetFlag(FLAGS_threads);
  const int64_t groups = trajectories / kSamples;
  std::vector<double> direct, grpc_rate, ratio;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    double d, g;
    {
      DirectDb db(dir + "/direct");
      d = Parallel(threads, groups, [&](int64_t i) { db.Put(MakeGroup("b", i, record_bytes), i); });
    }
    {
      InProcessServer s(dir + "/grpc");
      g = Parallel(threads, groups, [&](int64_t i) {
        PutGroupsRequest req;
        *req.add_groups() = MakeGroup("b", i, record_bytes);
        PutGroupsResponse resp;
        auto ctx = s.client->NewContext(absl::Seconds(60));
        grpc::Status st = s.stub->PutGroups(ctx.get(), req, &resp);
        if (!st.ok() || resp.written() != 1) {
          std::fprintf(stderr, "put failed: %s\n", st.error_message().c_str());
          std::exit(1);
        }
      });
    }
    direct.push_back(groups * kSamples / d);
    grpc_rate.push_back(groups * kSamples / g);
    ratio.push_back(d / g);
    std::fprintf(stderr, "put %dB repeat %d: direct %.0f/s grpc %.0f/s\n", record_bytes, r,
                 direct.back(), grpc_rate.back());
  }
  std::printf("| %d B | %lld | %d | %s | %s | %s |\n", record_bytes,
              static_cast<long long>(groups * kSamples), threads, Fmt(Summarize(direct)).c_str(),
              Fmt(Summarize(grpc_rate)).c_str(), Fmt(Summarize(ratio), "%.2f").c_str());
  std::fflush(stdout);
}

void LatencyBench(int64_t trajectories, const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const int64_t groups = trajectories / kSamples;
  const int64_t steps = std::max<int64_t>(1, groups / kGroupsPerStep);
  {
    // Load without fsync (the load is not what is measured).
    ReplayStoreOptions o;
    o.db_path = dir + "/db";
    o.sync_writes = false;
    auto store = std::move(ReplayStore::Open(o)).value();
    const absl::Time t0 = absl::Now();
    Parallel(2, (groups + 99) / 100, [&](int64_t chunk) {
      PutGroupsRequest req;
      for (int64_t i = chunk * 100; i < std::min(groups, chunk * 100 + 100); ++i) {
        *req.add_groups() = MakeGroup("q", i, 1024);
      }
      if (!store->PutGroups(req).ok()) std::exit(1);
    });
    std::fprintf(stderr, "loaded %lld trajectories in %.1f s\n",
                 static_cast<long long>(groups * kSamples),
                 absl::ToDoubleSeconds(absl::Now() - t0));
  }
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int64_t> pick_step(0, steps - 1);
  const int calls = absl::GetFlag(FLAGS_latency_calls);
  std::vector<double> q_grpc50, q_grpc99, q_dir50, q_dir99, s_grpc50, s_grpc99, s_store50, s_store99;
  double open_s = 0;
  {
  const absl::Time t_open = absl::Now();
  InProcessServer s(dir + "/db");
  open_s = absl::ToDoubleSeconds(absl::Now() - t_open);
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    std::vector<double> qg, sg, ss;
    for (int i = 0; i < calls; ++i) {
      const int64_t step = pick_step(rng);
      QueryRequest q;
      q.mutable_filter()->set_experiment_id("q");
      q.mutable_filter()->set_min_step(step);
      q.set_limit(100);
      QueryResponse resp;
      absl::Time t0 = absl::Now();
      auto ctx = s.client->NewContext(absl::Seconds(10));
      if (!s.stub->Query(ctx.get(), q, &resp).ok() || resp.trajectories_size() == 0) std::exit(1);
      qg.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      SampleGroupsRequest sr;
      sr.set_experiment_id("q");
      sr.set_mode(SAMPLE_UNIFORM);
      sr.set_num_groups(8);
      sr.set_seed(i + r * calls);
      SampleGroupsResponse sresp;
      t0 = absl::Now();
      ctx = s.client->NewContext(absl::Seconds(10));
      if (!s.stub->SampleGroups(ctx.get(), sr, &sresp).ok()) std::exit(1);
      sg.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      t0 = absl::Now();
      if (!s.store->SampleGroups(sr, absl::Now() + absl::Seconds(10)).ok()) std::exit(1);
      ss.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
    q_grpc50.push_back(Percentile(qg, 0.5));
    q_grpc99.push_back(Percentile(qg, 0.99));
    s_grpc50.push_back(Percentile(sg, 0.5));
    s_grpc99.push_back(Percentile(sg, 0.99));
    s_store50.push_back(Percentile(ss, 0.5));
    s_store99.push_back(Percentile(ss, 0.99));
  }
  }
  {
    // Direct: 100 records by one RocksDB range scan from a random step's
    // first key (what Query returns for that step), same database.
    DirectDb db(dir + "/db");
    for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
      std::vector<double> qd;
      for (int i = 0; i < calls; ++i) {
        const int64_t step = pick_step(rng);
        const absl::Time t0 = absl::Now();
        if (db.ReadRange("q", step, 100) == 0) std::exit(1);
        qd.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
      }
      q_dir50.push_back(Percentile(qd, 0.5));
      q_dir99.push_back(Percentile(qd, 0.99));
    }
  }
  std::printf("\nStore of %lld trajectories (1 KB), %lld steps; reopen (catalog rebuild) %.2f s.\n\n",
              static_cast<long long>(groups * kSamples), static_cast<long long>(steps), open_s);
  std::printf("| operation | p50 ms | p99 ms |\n|---|---|---|\n");
  std::printf("| Query 100 trajectories, gRPC | %s | %s |\n", Fmt(Summarize(q_grpc50), "%.2f").c_str(),
              Fmt(Summarize(q_grpc99), "%.2f").c_str());
  std::printf("| same 100 records, direct RocksDB range scan | %s | %s |\n",
              Fmt(Summarize(q_dir50), "%.2f").c_str(), Fmt(Summarize(q_dir99), "%.2f").c_str());
  std::printf("| Sample 8 groups uniform, gRPC | %s | %s |\n", Fmt(Summarize(s_grpc50), "%.2f").c_str(),
              Fmt(Summarize(s_grpc99), "%.2f").c_str());
  std::printf("| Sample 8 groups uniform, ReplayStore in-process | %s | %s |\n",
              Fmt(Summarize(s_store50), "%.2f").c_str(), Fmt(Summarize(s_store99), "%.2f").c_str());
}

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::printf("## Put throughput (trajectories/s, synced WAL; median (min..max) of %d)\n\n",
              absl::GetFlag(FLAGS_repeats));
  std::printf("| record | trajectories | writers | direct RocksDB | gRPC ReplayBuffer | gRPC / direct |\n");
  std::printf("|---|---|---|---|---|---|\n");
  rlmesh::PutBench(1024, absl::GetFlag(FLAGS_trajectories_1k), dir);
  rlmesh::PutBench(64 * 1024, absl::GetFlag(FLAGS_trajectories_64k), dir);
  std::printf("\n## Latency (median (min..max) over %d repeats of %d calls)\n",
              absl::GetFlag(FLAGS_repeats), absl::GetFlag(FLAGS_latency_calls));
  rlmesh::LatencyBench(absl::GetFlag(FLAGS_query_trajectories), dir);
  std::filesystem::remove_all(dir);
  return 0;
}
