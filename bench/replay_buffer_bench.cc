// replay_buffer_bench: the replay buffer through gRPC against RocksDB used
// directly with identical options (replay_buffer::MakeRocksOptions), in the
// same process and run, side by side.
//
//   1. Put throughput (trajectories/s), synced WAL, T concurrent writers,
//      K groups of 8 trajectories per call and per direct WriteBatch (K from
//      --groups_per_call), ~1 KB and ~64 KB records.
//   2. Query and Sample latency (p50/p99) over a store loaded with
//      --query_trajectories 1 KB trajectories, and the time to reopen that
//      store after a crash (WAL replay) and after a clean close.
//   3. The sample index alone (no RocksDB) at growing numbers of groups.
// Every measurement is repeated --repeats times; the report gives the median
// and the min..max spread. Output is markdown on stdout.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>
#include <unistd.h>

#include <sys/wait.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "proto/replay_buffer.grpc.pb.h"
#include "replay_buffer/codec.h"
#include "replay_buffer/sampler.h"
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
ABSL_FLAG(std::vector<std::string>, groups_per_call, std::vector<std::string>({"1", "8"}),
          "Groups per PutGroups call (and per direct WriteBatch); one table row each.");
ABSL_FLAG(std::string, load_only, "",
          "Internal: load --query_trajectories into this database and exit without closing it "
          "(what a crash leaves behind).");

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
// "median (lo..hi)" with `decimals` digits after the point.
std::string Fmt(const Summary& s, int decimals = 0) {
  return absl::StrFormat("%.*f (%.*f..%.*f)", decimals, s.median, decimals, s.lo, decimals, s.hi);
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
  // Groups `seq0`, `seq0 + 1`, ... in one synced WriteBatch.
  void Put(const std::vector<TrajectoryGroup>& groups, int64_t seq0) {
    rocksdb::WriteBatch batch;
    std::string value;
    for (size_t k = 0; k < groups.size(); ++k) {
      const TrajectoryGroup& g = groups[k];
      const int64_t seq = seq0 + static_cast<int64_t>(k);
      for (int j = 0; j < g.samples_size(); ++j) {
        g.samples(j).SerializeToString(&value);
        batch.Put(handles_[1], Key(g.experiment_id(), g.step(), seq, j), value);
        batch.Put(handles_[4], "t" + g.samples(j).trajectory_id(), "12345678");
      }
      batch.Put(handles_[2], Key(g.experiment_id(), 0, seq), std::string(120, 's'));
      batch.Put(handles_[3], g.prompt_id() + Key(g.experiment_id(), g.step(), seq), "");
      batch.Put(handles_[4], "g" + g.group_id(), "12345678");
    }
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

// One table row: direct WriteBatches of `per_call` groups against PutGroups
// calls of `per_call` groups, alternated (which side goes first flips every
// repeat).
void PutBench(int record_bytes, int64_t trajectories, int per_call, const std::string& dir) {
  const int threads = absl::GetFlag(FLAGS_threads);
  const int64_t calls = std::max<int64_t>(1, trajectories / kSamples / per_call);
  const int64_t groups = calls * per_call;
  auto batch = [&](int64_t call) {
    std::vector<TrajectoryGroup> out;
    for (int64_t i = call * per_call; i < (call + 1) * per_call; ++i) out.push_back(MakeGroup("b", i, record_bytes));
    return out;
  };
  std::vector<double> direct, grpc_rate, ratio;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    double d = 0, g = 0;
    auto run_direct = [&] {
      DirectDb db(dir + "/direct");
      d = Parallel(threads, calls, [&](int64_t c) { db.Put(batch(c), c * per_call); });
    };
    auto run_grpc = [&] {
      InProcessServer s(dir + "/grpc");
      g = Parallel(threads, calls, [&](int64_t c) {
        PutGroupsRequest req;
        for (auto& group : batch(c)) *req.add_groups() = std::move(group);
        PutGroupsResponse resp;
        auto ctx = s.client->NewContext(absl::Seconds(60));
        grpc::Status st = s.stub->PutGroups(ctx.get(), req, &resp);
        if (!st.ok() || resp.written() != per_call) {
          std::fprintf(stderr, "put failed: %s\n", st.error_message().c_str());
          std::exit(1);
        }
      });
    };
    if (r % 2 == 0) {
      run_direct();
      run_grpc();
    } else {
      run_grpc();
      run_direct();
    }
    direct.push_back(groups * kSamples / d);
    grpc_rate.push_back(groups * kSamples / g);
    ratio.push_back(d / g);
    std::fprintf(stderr, "put %dB x%d repeat %d: direct %.0f/s grpc %.0f/s\n", record_bytes, per_call, r,
                 direct.back(), grpc_rate.back());
  }
  std::printf("| %d B | %d | %lld | %d | %s | %s | %s |\n", record_bytes, per_call,
              static_cast<long long>(groups * kSamples), threads, Fmt(Summarize(direct)).c_str(),
              Fmt(Summarize(grpc_rate)).c_str(), Fmt(Summarize(ratio), 2).c_str());
  std::fflush(stdout);
}

// Loads `trajectories` 1 KB trajectories into `path` without fsync, in
// calls of 100 groups.
void Load(const std::string& path, int64_t trajectories) {
  const int64_t groups = trajectories / kSamples;
  ReplayStoreOptions o;
  o.db_path = path;
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
  std::fprintf(stderr, "loaded %lld trajectories in %.1f s\n", static_cast<long long>(groups * kSamples),
               absl::ToDoubleSeconds(absl::Now() - t0));
  if (!absl::GetFlag(FLAGS_load_only).empty()) {
    // What kill -9 leaves: the WAL is written (the OS has it), nothing is
    // flushed at close.
    std::fflush(stderr);
    _exit(0);
  }
}

// Runs this binary with --load_only=<path> and waits: a store that ends
// like a crashed one.
void LoadAndCrash(const std::string& path, int64_t trajectories) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe");
  const std::string load = "--load_only=" + path;
  const std::string n = absl::StrCat("--query_trajectories=", trajectories);
  const pid_t pid = fork();
  if (pid == 0) {
    execl(self.c_str(), self.c_str(), load.c_str(), n.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "loading child failed\n");
    std::exit(1);
  }
}

void LatencyBench(int64_t trajectories, const std::string& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const int64_t groups = trajectories / kSamples;
  const int64_t steps = std::max<int64_t>(1, groups / kGroupsPerStep);
  LoadAndCrash(dir + "/db", trajectories);
  double crash_open_s = 0;
  {
    const absl::Time t0 = absl::Now();
    ReplayStoreOptions o;
    o.db_path = dir + "/db";
    auto store = std::move(ReplayStore::Open(o)).value();
    crash_open_s = absl::ToDoubleSeconds(absl::Now() - t0);
  }  // a clean close
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int64_t> pick_step(0, steps - 1);
  const int calls = absl::GetFlag(FLAGS_latency_calls);
  std::vector<double> q_grpc50, q_grpc99, q_dir50, q_dir99, s_grpc50, s_grpc99, s_store50, s_store99,
      p_store50, p_store99;
  double open_s = 0;
  {
  const absl::Time t_open = absl::Now();
  InProcessServer s(dir + "/db");
  open_s = absl::ToDoubleSeconds(absl::Now() - t_open);
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    std::vector<double> qg, sg, ss, ps;
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
      // Prioritized, only the last 100 steps' policy versions, no flat groups.
      sr.set_mode(SAMPLE_PRIORITIZED);
      sr.set_min_policy_version(steps - 100);
      sr.set_skip_zero_variance(true);
      t0 = absl::Now();
      if (!s.store->SampleGroups(sr, absl::Now() + absl::Seconds(10)).ok()) std::exit(1);
      ps.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    }
    q_grpc50.push_back(Percentile(qg, 0.5));
    q_grpc99.push_back(Percentile(qg, 0.99));
    s_grpc50.push_back(Percentile(sg, 0.5));
    s_grpc99.push_back(Percentile(sg, 0.99));
    s_store50.push_back(Percentile(ss, 0.5));
    s_store99.push_back(Percentile(ss, 0.99));
    p_store50.push_back(Percentile(ps, 0.5));
    p_store99.push_back(Percentile(ps, 0.99));
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
  std::printf("\nStore of %lld trajectories (1 KB), %lld steps. Reopen after a crash (WAL replay + "
              "catalog): %.2f s; after a clean close: %.2f s.\n\n",
              static_cast<long long>(groups * kSamples), static_cast<long long>(steps), crash_open_s, open_s);
  std::printf("| operation | p50 ms | p99 ms |\n|---|---|---|\n");
  std::printf("| Query 100 trajectories, gRPC | %s | %s |\n", Fmt(Summarize(q_grpc50), 2).c_str(),
              Fmt(Summarize(q_grpc99), 2).c_str());
  std::printf("| same 100 records, direct RocksDB range scan | %s | %s |\n",
              Fmt(Summarize(q_dir50), 2).c_str(), Fmt(Summarize(q_dir99), 2).c_str());
  std::printf("| Sample 8 groups uniform, gRPC | %s | %s |\n", Fmt(Summarize(s_grpc50), 2).c_str(),
              Fmt(Summarize(s_grpc99), 2).c_str());
  std::printf("| Sample 8 groups uniform, ReplayStore in-process | %s | %s |\n",
              Fmt(Summarize(s_store50), 2).c_str(), Fmt(Summarize(s_store99), 2).c_str());
  std::printf("| Sample 8 groups prioritized, last 100 versions, skip flat, in-process | %s | %s |\n",
              Fmt(Summarize(p_store50), 2).c_str(), Fmt(Summarize(p_store99), 2).c_str());
}

// The sample index alone: microseconds per Select of 8 groups at growing
// catalog sizes (64 groups per policy version, a third of them flat).
void IndexBench() {
  std::printf("\n## Sample index alone (no RocksDB): us per Select of 8 groups, median of 2000 calls\n\n");
  std::printf("| groups | policy versions | uniform, all | prioritized, all | uniform, last 100 versions, skip flat |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int64_t n : {1'000, 10'000, 100'000, 1'000'000}) {
    replay::SampleIndex index;
    for (int64_t seq = 1; seq <= n; ++seq) {
      auto g = std::make_shared<replay::GroupSummary>();
      g->seq = seq;
      for (int j = 0; j < kSamples; ++j) {
        g->samples.push_back({seq % 3 == 0 ? 1.0 : static_cast<double>((seq + j) % 2), seq / kGroupsPerStep, 10, 0});
      }
      index.Add(g);
    }
    const int64_t versions = n / kGroupsPerStep + 1;
    auto time = [&](SampleMode mode, int64_t min_version, bool skip) {
      std::vector<double> us;
      for (int i = 0; i < 2000; ++i) {
        const absl::Time t0 = absl::Now();
        if (index.Select(mode, i, 8, {min_version, skip}).picked.size() != 8) std::exit(1);
        us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      }
      return Percentile(us, 0.5);
    };
    std::printf("| %lld | %lld | %.1f | %.1f | %.1f |\n", static_cast<long long>(n),
                static_cast<long long>(versions), time(SAMPLE_UNIFORM, 0, false),
                time(SAMPLE_PRIORITIZED, 0, false), time(SAMPLE_UNIFORM, versions - 100, true));
  }
}

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_load_only).empty()) {
    rlmesh::Load(absl::GetFlag(FLAGS_load_only), absl::GetFlag(FLAGS_query_trajectories));
    return 1;  // Load exits
  }
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::vector<int> per_call;
  for (const std::string& k : absl::GetFlag(FLAGS_groups_per_call)) {
    int v = 0;
    if (!absl::SimpleAtoi(k, &v) || v <= 0) {
      std::fprintf(stderr, "--groups_per_call: '%s' is not a positive integer\n", k.c_str());
      return 2;
    }
    per_call.push_back(v);
  }
  std::printf("## Put throughput (trajectories/s, synced WAL; median (min..max) of %d, A/B alternated)\n\n",
              absl::GetFlag(FLAGS_repeats));
  std::printf("| record | groups per call / batch | trajectories | writers | direct RocksDB | gRPC ReplayBuffer | "
              "gRPC / direct |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int k : per_call) rlmesh::PutBench(1024, absl::GetFlag(FLAGS_trajectories_1k), k, dir);
  for (int k : per_call) rlmesh::PutBench(64 * 1024, absl::GetFlag(FLAGS_trajectories_64k), k, dir);
  std::printf("\n## Latency (median (min..max) over %d repeats of %d calls)\n",
              absl::GetFlag(FLAGS_repeats), absl::GetFlag(FLAGS_latency_calls));
  rlmesh::LatencyBench(absl::GetFlag(FLAGS_query_trajectories), dir);
  rlmesh::IndexBench();
  std::filesystem::remove_all(dir);
  return 0;
}
