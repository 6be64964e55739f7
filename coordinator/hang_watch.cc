#include "coordinator/hang_watch.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/subprocess.h"

namespace rlmesh {
namespace {

// A file-name-safe version of a progress key.
std::string Safe(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  return s;
}

// `name` itself if it holds a '/', else its path on PATH ("" if none).
std::string OnPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

HangWatch::HangWatch(HangWatchOptions options, std::function<std::optional<ExperimentStatus>()> status,
                     std::function<std::vector<RoleInfo>()> roles)
    : options_(std::move(options)), status_(std::move(status)), roles_(std::move(roles)) {
  thread_ = std::thread([this] { Loop(); });
}

HangWatch::~HangWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

std::vector<std::string> HangWatch::dumps() const {
  absl::MutexLock lock(&mu_);
  return dumps_;
}

void HangWatch::Loop() {
  std::string last_key, dumped_key;
  absl::Time since = absl::Now();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.poll)) return;
    }
    std::optional<ExperimentStatus> e = status_();
    if (!e || e->state() != "RUNNING") {
      last_key.clear();
      continue;
    }
    const std::string key =
        absl::StrCat(e->experiment_id(), "-", e->stage_index(), "-", e->stage(), "-", e->step(), "-", e->phase());
    if (key != last_key) {
      last_key = key;
      since = absl::Now();
      continue;
    }
    if (key != dumped_key && absl::Now() - since >= options_.after) {
      dumped_key = key;
      Dump(*e, key);
    }
  }
}

void HangWatch::Dump(const ExperimentStatus& e, const std::string& key) {
  const std::string dir = absl::StrCat(options_.dump_dir, "/", Safe(key));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  RLMESH_LOG(WARNING) << "experiment " << e.experiment_id() << " has been in phase '" << e.phase() << "' of step "
                      << e.step() << " for over " << absl::FormatDuration(options_.after)
                      << "; dumping every role's thread stacks to " << dir;
  std::vector<std::pair<std::string, int64_t>> targets = {{"coordinator", ::getpid()}};
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  for (const RoleInfo& r : roles_()) {
    if (r.pid() <= 0) continue;
    // A role that registered from another host (a Slurm step, a pod): its
    // pid means nothing here, and gdb would attach to whatever has it.
    if (!r.host().empty() && r.host() != host) {
      const std::string out = absl::StrCat(dir, "/", Safe(r.name()), ".txt");
      if (FILE* f = std::fopen(out.c_str(), "w")) {
        std::fprintf(f, "%s runs on host %s (pid %lld), not on %s where the coordinator runs: not dumped. On %s: "
                        "gdb -q -batch -p %lld -ex \"thread apply all bt\"\n",
                     r.name().c_str(), r.host().c_str(), static_cast<long long>(r.pid()), host, r.host().c_str(),
                     static_cast<long long>(r.pid()));
        std::fclose(f);
      }
      continue;
    }
    targets.emplace_back(r.name(), r.pid());
  }
  const std::string gdb_path = OnPath(options_.gdb);
  for (const auto& [name, pid] : targets) {
    const std::string out = absl::StrCat(dir, "/", Safe(name), ".txt");
    auto gdb = gdb_path.empty() ? absl::StatusOr<Subprocess>(absl::NotFoundError(
                                      absl::StrCat(options_.gdb, " is not on PATH (scripts/setup.sh installs gdb)")))
                                : Subprocess::Start({gdb_path, "-q", "-batch", "-nx", "-p", std::to_string(pid), "-ex",
                                  "thread apply all bt"},
                                 out);
    if (!gdb.ok()) {
      if (FILE* f = std::fopen(out.c_str(), "a")) {
        std::fprintf(f, "cannot start %s: %s\n", options_.gdb.c_str(), gdb.status().ToString().c_str());
        std::fclose(f);
      }
      continue;
    }
    if (!gdb->Wait(options_.dump_timeout).ok()) gdb->Stop(absl::Seconds(1));
  }
  absl::MutexLock lock(&mu_);
  dumps_.push_back(dir);
}

}  // namespace rlmesh
