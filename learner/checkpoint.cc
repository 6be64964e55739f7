#include "learner/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actor/safetensors.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace rlmesh::learner {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kStateFile[] = "trainer_state.json";

// Step number of a "step_<digits>" name, or -1.
int64_t StepOfName(const std::string& name) {
  if (!absl::StartsWith(name, "step_")) return -1;
  int64_t step = -1;
  const std::string digits = name.substr(5);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  if (!absl::SimpleAtoi(digits, &step)) return -1;
  return step;
}

}  // namespace

std::string CheckpointName(int64_t step) { return absl::StrFormat("step_%06d", step); }

std::string TrainerStateToJson(const TrainerState& s) {
  json files = json::object();
  for (const auto& [name, d] : s.files) files[name] = {{"size", d.size}, {"sha256", d.sha256}};
  json j = {
      {"format", s.format},
      {"experiment", s.experiment},
      {"stage_index", s.stage_index},
      {"stage_kind", s.stage_kind},
      {"step", s.step},
      {"policy_version", s.policy_version},
      // As a string: JSON readers often hold numbers as doubles.
      {"seed", std::to_string(s.seed)},
      {"loader", {{"epoch", s.loader_epoch}, {"index", s.loader_index}}},
      {"optimizer_steps", s.optimizer_steps},
      {"critic_optimizer_steps", s.critic_optimizer_steps},
      {"world_size", s.world_size},
      {"zero1", s.zero1},
      {"tp", s.tp},
      {"ep", s.ep},
      {"critic_tp", s.critic_tp},
      {"rng", "every stream derives from (seed, stage_index, step)"},
      {"files", files},
  };
  return j.dump(2) + "\n";
}

absl::StatusOr<TrainerState> TrainerStateFromJson(const std::string& text) {
  TrainerState s;
  try {
    json j = json::parse(text);
    auto need = [&](const char* key) -> const json& {
      if (!j.contains(key)) throw std::runtime_error(absl::StrCat("missing field \"", key, "\""));
      return j.at(key);
    };
    s.format = need("format").get<int>();
    if (s.format != 1) {
      return absl::InvalidArgumentError(absl::StrCat("format: unsupported version ", s.format));
    }
    s.experiment = need("experiment").get<std::string>();
    s.stage_index = need("stage_index").get<int>();
    s.stage_kind = need("stage_kind").get<std::string>();
    s.step = need("step").get<int64_t>();
    s.policy_version = need("policy_version").get<int64_t>();
    if (!absl::SimpleAtoi(need("seed").get<std::string>(), &s.seed)) {
      return absl::InvalidArgumentError("seed: not an unsigned integer");
    }
    s.loader_epoch = need("loader").at("epoch").get<int64_t>();
    s.loader_index = need("loader").at("index").get<int64_t>();
    s.optimizer_steps = need("optimizer_steps").get<int64_t>();
    s.critic_optimizer_steps = need("critic_optimizer_steps").get<int64_t>();
    s.world_size = need("world_size").get<int>();
    s.zero1 = need("zero1").get<bool>();
    s.tp = j.contains("tp") ? j.at("tp").get<int>() : 1;
    s.ep = j.contains("ep") ? j.at("ep").get<int>() : 1;
    s.critic_tp = j.contains("critic_tp") ? j.at("critic_tp").get<int>() : 1;
    for (const auto& [name, d] : need("files").items()) {
      s.files[name] = FileDigest{d.at("size").get<int64_t>(), d.at("sha256").get<std::string>()};
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("trainer_state.json: ", e.what()));
  }
  if (s.step < 0 || s.world_size < 1) {
    return absl::InvalidArgumentError("trainer_state.json: step or world_size out of range");
  }
  return s;
}

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  Sha256 hash;
  FileDigest d;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    std::streamsize n = in.gcount();
    if (n <= 0) break;
    d.size += n;
    hash.Update(buf.data(), static_cast<size_t>(n));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  d.sha256 = hash.HexDigest();
  return d;
}

absl::StatusOr<TrainerState> VerifyCheckpoint(const std::string& dir) {
  const std::string state_path = absl::StrCat(dir, "/", kStateFile);
  std::ifstream in(state_path);
  if (!in) return absl::NotFoundError(absl::StrCat(state_path, ": missing (partial checkpoint?)"));
  std::stringstream text;
  text << in.rdbuf();
  auto state = TrainerStateFromJson(text.str());
  if (!state.ok()) {
    return absl::DataLossError(absl::StrCat(state_path, ": ", state.status().message()));
  }
  if (state->files.find("model.safetensors") == state->files.end() &&
      state->files.find("model.safetensors.index.json") == state->files.end()) {
    return absl::DataLossError(absl::StrCat(state_path, ": lists no model weights"));
  }
  for (const auto& [name, want] : state->files) {
    const std::string path = absl::StrCat(dir, "/", name);
    auto got = DigestFile(path);
    if (!got.ok()) return absl::DataLossError(absl::StrCat(path, ": missing"));
    if (got->size != want.size) {
      return absl::DataLossError(absl::StrFormat("%s: %d bytes, expected %d (truncated or partial)",
                                                 path, got->size, want.size));
    }
    if (got->sha256 != want.sha256) {
      return absl::DataLossError(absl::StrCat(path, ": SHA-256 mismatch (corrupted)"));
    }
    if (absl::EndsWith(name, ".safetensors")) {
      auto file = actor::SafetensorsFile::Open(path);
      if (!file.ok()) return absl::DataLossError(std::string(file.status().message()));
    }
  }
  return state;
}

std::vector<std::string> ListCheckpoints(const std::string& checkpoint_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(checkpoint_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t step = StepOfName(name);
    if (step >= 0 && it->is_directory(ec)) found.emplace_back(step, it->path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

absl::StatusOr<FoundCheckpoint> NewestValidCheckpoint(const std::string& checkpoint_dir,
                                                      int stage_index,
                                                      std::vector<std::string>* refused) {
  std::vector<std::string> all = ListCheckpoints(checkpoint_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    auto state = VerifyCheckpoint(*it);
    if (!state.ok()) {
      if (refused) refused->push_back(absl::StrCat(*it, ": ", state.status().message()));
      continue;
    }
    if (stage_index >= 0 && state->stage_index != stage_index) continue;
    return FoundCheckpoint{*it, *std::move(state)};
  }
  return absl::NotFoundError(absl::StrCat("no valid checkpoint in ", checkpoint_dir));
}

absl::Status CommitCheckpoint(const std::string& staging, const std::string& final_dir) {
  std::error_code ec;
  const std::string parent = fs::path(final_dir).parent_path().string();
  std::string aside;
  if (fs::exists(final_dir, ec)) {
    aside = absl::StrCat(parent.empty() ? "." : parent, "/.old-", fs::path(final_dir).filename().string());
    fs::remove_all(aside, ec);
    if (::rename(final_dir.c_str(), aside.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("rename ", final_dir, ": ", std::strerror(errno)));
    }
  }
  if (::rename(staging.c_str(), final_dir.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("rename ", staging, " -> ", final_dir, ": ", std::strerror(errno)));
  }
  RLMESH_RETURN_IF_ERROR(FsyncDirectory(parent.empty() ? "." : parent));
  if (!aside.empty()) fs::remove_all(aside, ec);
  return absl::OkStatus();
}

absl::Status PruneCheckpoints(const std::string& checkpoint_dir, int keep) {
  if (keep <= 0) return absl::OkStatus();
  std::vector<std::string> all = ListCheckpoints(checkpoint_dir);
  for (size_t i = 0; i + keep < all.size(); ++i) {
    std::error_code ec;
    fs::remove_all(all[i], ec);
    if (ec) return absl::InternalError(absl::StrCat("remove ", all[i], ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::learner
