// replay_buffer CLI: look into a running replay buffer.
//
//   cli stats  --address=127.0.0.1:7402 [--experiment=E]
//   cli query  --address=... --experiment=E [--step=N | --min_step/--max_step]
//              [--min_reward/--max_reward] [--finish_reason=stop|length|context|aborted]
//              [--prompt_id=P] [--text=S] [--limit=N] [--page_token=T] [--aggregates]
//   cli tail   --address=... --experiment=E [--interval_seconds=2] [--polls=0]
//   cli export --address=... --experiment=E --format=trajectories|sft|dpo [--out=FILE]
//
// A readable table by default; --json prints JSON (JSONL for trajectories).
// Every RPC carries a deadline (--timeout_seconds) and the token from
// --auth_token_file when given.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "google/protobuf/util/json_util.h"
#include "proto/replay_buffer.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:7402", "host:port of the replay buffer.");
ABSL_FLAG(std::string, auth_token_file, "", "File holding the shared token.");
ABSL_FLAG(double, timeout_seconds, 10, "Deadline of each RPC.");
ABSL_FLAG(bool, json, false, "Print JSON instead of a table.");
ABSL_FLAG(std::string, experiment, "", "Experiment id.");
ABSL_FLAG(int64_t, step, -1, "Only this step (sets --min_step and --max_step).");
ABSL_FLAG(int64_t, min_step, 0, "Inclusive lower step bound.");
ABSL_FLAG(int64_t, max_step, 0, "Inclusive upper step bound; 0 = open.");
ABSL_FLAG(int64_t, min_policy_version, 0, "Inclusive lower policy version bound.");
ABSL_FLAG(int64_t, max_policy_version, 0, "Inclusive upper policy version bound; 0 = open.");
ABSL_FLAG(std::string, min_reward, "", "Inclusive lower reward bound (empty = open).");
ABSL_FLAG(std::string, max_reward, "", "Inclusive upper reward bound (empty = open).");
ABSL_FLAG(std::string, finish_reason, "", "stop, length, context or aborted.");
ABSL_FLAG(std::string, prompt_id, "", "Only this prompt id.");
ABSL_FLAG(std::string, text, "", "Only responses whose text contains this.");
ABSL_FLAG(int, limit, 20, "Trajectories per page.");
ABSL_FLAG(std::string, page_token, "", "Continue from this page token.");
ABSL_FLAG(bool, aggregates, false, "query: also print per-step aggregates.");
ABSL_FLAG(std::string, format, "trajectories", "export: trajectories, sft or dpo.");
ABSL_FLAG(std::string, out, "", "export: write here instead of stdout.");
ABSL_FLAG(double, interval_seconds, 2, "tail: seconds between polls.");
ABSL_FLAG(int, polls, 0, "tail: stop after this many polls (0 = until interrupted).");

namespace rlmesh {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "cli: %s\n", what.c_str());
  return 1;
}

int FailRpc(const std::string& rpc, const grpc::Status& s) {
  return Fail(absl::StrCat(rpc, ": ", FromGrpcStatus(s).ToString()));
}

std::string Json(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

absl::StatusOr<TrajectoryFilter> FilterFromFlags() {
  TrajectoryFilter f;
  f.set_experiment_id(absl::GetFlag(FLAGS_experiment));
  if (f.experiment_id().empty()) return absl::InvalidArgumentError("--experiment is required");
  f.set_min_step(absl::GetFlag(FLAGS_min_step));
  f.set_max_step(absl::GetFlag(FLAGS_max_step));
  if (absl::GetFlag(FLAGS_step) >= 0) {
    f.set_min_step(absl::GetFlag(FLAGS_step));
    f.set_max_step(absl::GetFlag(FLAGS_step));
  }
  f.set_min_policy_version(absl::GetFlag(FLAGS_min_policy_version));
  f.set_max_policy_version(absl::GetFlag(FLAGS_max_policy_version));
  const std::string lo = absl::GetFlag(FLAGS_min_reward), hi = absl::GetFlag(FLAGS_max_reward);
  if (!lo.empty() || !hi.empty()) {
    f.set_has_reward_range(true);
    try {
      f.set_min_reward(lo.empty() ? -1e300 : std::stod(lo));
      f.set_max_reward(hi.empty() ? 1e300 : std::stod(hi));
    } catch (const std::exception&) {
      return absl::InvalidArgumentError("--min_reward/--max_reward must be numbers");
    }
  }
  const std::string fr = absl::GetFlag(FLAGS_finish_reason);
  static const std::map<std::string, FinishReason> kReasons = {
      {"", FINISH_REASON_UNSPECIFIED},  {"stop", FINISH_REASON_STOP},
      {"length", FINISH_REASON_LENGTH}, {"context", FINISH_REASON_CONTEXT},
      {"aborted", FINISH_REASON_ABORTED}};
  auto it = kReasons.find(fr);
  if (it == kReasons.end()) {
    return absl::InvalidArgumentError("--finish_reason must be stop, length, context or aborted");
  }
  f.set_finish_reason(it->second);
  f.set_prompt_id(absl::GetFlag(FLAGS_prompt_id));
  f.set_text_contains(absl::GetFlag(FLAGS_text));
  return f;
}

const char* ReasonName(FinishReason r) {
  switch (r) {
    case FINISH_REASON_STOP: return "stop";
    case FINISH_REASON_LENGTH: return "length";
    case FINISH_REASON_CONTEXT: return "context";
    case FINISH_REASON_ABORTED: return "aborted";
    default: return "-";
  }
}

void PrintTableHeader() {
  std::printf("%6s  %-16s %3s %7s %8s %-7s %5s  %s\n", "step", "group", "#", "version", "reward",
              "finish", "len", "response");
}

void PrintRow(const Trajectory& t) {
  std::string text = t.response_text();
  for (char& c : text) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  if (text.size() > 48) text = text.substr(0, 45) + "...";
  std::printf("%6lld  %-16s %3d %7lld %8.3f %-7s %5d  %s\n", static_cast<long long>(t.step()),
              t.group_id().substr(0, 16).c_str(), t.sample_index(),
              static_cast<long long>(t.policy_version()), t.reward(), ReasonName(t.finish_reason()),
              t.response_token_ids_size(), text.c_str());
}

class Cli {
 public:
  explicit Cli(RpcClient client)
      : client_(std::move(client)), stub_(ReplayBuffer::NewStub(client_.channel())) {}

  std::unique_ptr<grpc::ClientContext> Ctx() const {
    return client_.NewContext(absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)));
  }

  int Stats() {
    StatsRequest req;
    req.set_experiment_id(absl::GetFlag(FLAGS_experiment));
    StatsResponse resp;
    grpc::Status s = stub_->Stats(Ctx().get(), req, &resp);
    if (!s.ok()) return FailRpc("Stats", s);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", Json(resp).c_str());
      return 0;
    }
    std::printf("%-24s %9s %12s %12s %11s %13s  %s\n", "experiment", "groups", "trajectories",
                "MiB", "steps", "versions", "consumed");
    for (const auto& e : resp.experiments()) {
      std::string consumed;
      for (const auto& [name, n] : e.consumed()) absl::StrAppend(&consumed, name, "=", n, " ");
      std::printf("%-24s %9lld %12lld %12.1f %5lld..%-5lld %6lld..%-6lld  %s\n",
                  e.experiment_id().c_str(), static_cast<long long>(e.groups()),
                  static_cast<long long>(e.trajectories()), e.bytes() / 1048576.0,
                  static_cast<long long>(e.min_step()), static_cast<long long>(e.max_step()),
                  static_cast<long long>(e.min_policy_version()),
                  static_cast<long long>(e.max_policy_version()), consumed.c_str());
    }
    return 0;
  }

  int Query() {
    auto filter = FilterFromFlags();
    if (!filter.ok()) return Fail(std::string(filter.status().message()));
    QueryRequest req;
    *req.mutable_filter() = *filter;
    req.set_limit(absl::GetFlag(FLAGS_limit));
    req.set_page_token(absl::GetFlag(FLAGS_page_token));
    req.set_with_aggregates(absl::GetFlag(FLAGS_aggregates));
    QueryResponse resp;
    grpc::Status s = stub_->Query(Ctx().get(), req, &resp);
    if (!s.ok()) return FailRpc("Query", s);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", Json(resp).c_str());
      return 0;
    }
    PrintTableHeader();
    for (const auto& t : resp.trajectories()) PrintRow(t);
    if (!resp.aggregates().empty()) {
      std::printf("\n%6s %7s %6s %8s %8s %7s %9s %8s %5s %5s\n", "step", "count", "groups",
                  "reward", "std", "pass@k", "zero-var", "len", "min", "max");
      for (const auto& a : resp.aggregates()) {
        std::printf("%6lld %7lld %6lld %8.3f %8.3f %7.2f %9.2f %8.1f %5lld %5lld\n",
                    static_cast<long long>(a.step()), static_cast<long long>(a.count()),
                    static_cast<long long>(a.groups()), a.reward_mean(), a.reward_std(),
                    a.pass_at_k(), a.zero_variance_rate(), a.length_mean(),
                    static_cast<long long>(a.length_min()), static_cast<long long>(a.length_max()));
      }
    }
    if (!resp.next_page_token().empty()) {
      std::printf("\nmore: --page_token=%s\n", resp.next_page_token().c_str());
    }
    return 0;
  }

  // Polls Query from the newest step seen and prints trajectories not yet
  // printed.
  int Tail() {
    auto filter = FilterFromFlags();
    if (!filter.ok()) return Fail(std::string(filter.status().message()));
    int64_t from_step = filter->min_step();
    if (absl::GetFlag(FLAGS_step) < 0 && filter->min_step() == 0) {
      StatsRequest sr;
      sr.set_experiment_id(filter->experiment_id());
      StatsResponse stats;
      grpc::Status s = stub_->Stats(Ctx().get(), sr, &stats);
      if (!s.ok()) return FailRpc("Stats", s);
      if (!stats.experiments().empty()) from_step = stats.experiments(0).max_step();
    }
    std::set<std::string> printed_at_step;  // ids already printed at from_step
    if (!absl::GetFlag(FLAGS_json)) PrintTableHeader();
    for (int poll = 0; absl::GetFlag(FLAGS_polls) == 0 || poll < absl::GetFlag(FLAGS_polls);
         ++poll) {
      if (poll > 0) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(int(1000 * absl::GetFlag(FLAGS_interval_seconds))));
      }
      QueryRequest req;
      *req.mutable_filter() = *filter;
      req.mutable_filter()->set_min_step(from_step);
      req.set_limit(1000);
      while (true) {
        QueryResponse resp;
        grpc::Status s = stub_->Query(Ctx().get(), req, &resp);
        if (!s.ok()) return FailRpc("Query", s);
        for (const auto& t : resp.trajectories()) {
          if (t.step() > from_step) {
            from_step = t.step();
            printed_at_step.clear();
          }
          if (t.step() == from_step && !printed_at_step.insert(t.trajectory_id()).second) continue;
          if (absl::GetFlag(FLAGS_json)) {
            std::printf("%s\n", Json(t).c_str());
          } else {
            PrintRow(t);
          }
        }
        std::fflush(stdout);
        if (resp.next_page_token().empty()) break;
        req.set_page_token(resp.next_page_token());
      }
    }
    return 0;
  }

  int Export() {
    auto filter = FilterFromFlags();
    if (!filter.ok()) return Fail(std::string(filter.status().message()));
    static const std::map<std::string, ExportFormat> kFormats = {
        {"trajectories", EXPORT_TRAJECTORIES}, {"sft", EXPORT_SFT}, {"dpo", EXPORT_DPO}};
    auto format = kFormats.find(absl::GetFlag(FLAGS_format));
    if (format == kFormats.end()) return Fail("--format must be trajectories, sft or dpo");
    ExportRequest req;
    *req.mutable_filter() = *filter;
    req.set_format(format->second);
    std::ofstream file;
    std::ostream* out = &std::cout;
    if (!absl::GetFlag(FLAGS_out).empty()) {
      file.open(absl::GetFlag(FLAGS_out), std::ios::binary | std::ios::trunc);
      if (!file) return Fail("cannot write " + absl::GetFlag(FLAGS_out));
      out = &file;
    }
    // A long export gets a proportionally longer deadline than one call.
    auto ctx = client_.NewContext(absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds) * 30));
    auto reader = stub_->Export(ctx.get(), req);
    ExportChunk chunk;
    int64_t records = 0;
    while (reader->Read(&chunk)) {
      out->write(chunk.jsonl().data(), chunk.jsonl().size());
      records += chunk.records();
    }
    grpc::Status s = reader->Finish();
    if (!s.ok()) return FailRpc("Export", s);
    out->flush();
    std::fprintf(stderr, "cli: exported %lld records\n", static_cast<long long>(records));
    return 0;
  }

 private:
  RpcClient client_;
  std::unique_ptr<ReplayBuffer::Stub> stub_;
};

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("cli {query|stats|tail|export} --address=HOST:PORT [flags]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "usage: cli {query|stats|tail|export} --address=HOST:PORT [flags]\n");
    return 2;
  }
  const std::string command = args[1];
  rlmesh::ClientOptions options;
  auto token = rlmesh::ReadTokenFile(absl::GetFlag(FLAGS_auth_token_file));
  if (!token.ok()) return rlmesh::Fail(token.status().ToString());
  options.auth_token = *token;
  auto client = rlmesh::RpcClient::Create(absl::GetFlag(FLAGS_address), options);
  if (!client.ok()) return rlmesh::Fail(client.status().ToString());
  rlmesh::Cli cli(*std::move(client));
  if (command == "stats") return cli.Stats();
  if (command == "query") return cli.Query();
  if (command == "tail") return cli.Tail();
  if (command == "export") return cli.Export();
  std::fprintf(stderr, "cli: unknown command '%s' (query, stats, tail, export)\n", command.c_str());
  return 2;
}
