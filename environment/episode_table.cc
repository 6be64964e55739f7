#include "environment/episode_table.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace rlmesh::environment {

absl::Status EpisodeTableOptions::Validate() const {
  if (max_episodes <= 0) return absl::InvalidArgumentError("max_episodes: must be > 0");
  if (idle_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("idle_timeout: must be > 0");
  return absl::OkStatus();
}

EpisodeTable::EpisodeTable(EnvironmentOptions env, EpisodeTableOptions options)
    : env_(std::move(env)), options_(options) {}

void EpisodeTable::ExpireIdle() {
  const absl::Time now = absl::Now();
  for (auto it = last_used_.begin(); it != last_used_.end();) {
    if (now - it->second > options_.idle_timeout) {
      episodes_.erase(it->first);
      it = last_used_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<ResetResponse> EpisodeTable::Reset(const ResetRequest& request) {
  auto episode = MakeEpisode(request.task(), env_);
  if (!episode.ok()) return episode.status();
  ResetResponse resp;
  resp.set_observation((*episode)->FirstObservation());
  auto entry = std::make_shared<Entry>();
  {
    absl::MutexLock l(&entry->mu);
    entry->episode = std::move(*episode);
  }
  absl::MutexLock lock(&mu_);
  ExpireIdle();
  if (static_cast<int64_t>(episodes_.size()) >= options_.max_episodes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(episodes_.size(), " episodes live (max_episodes); close finished ones"));
  }
  const std::string id = absl::StrCat("ep-", next_id_++);
  episodes_[id] = std::move(entry);
  last_used_[id] = absl::Now();
  resp.set_episode_id(id);
  return resp;
}

absl::StatusOr<StepResponse> EpisodeTable::Step(const StepRequest& request) {
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = episodes_.find(request.episode_id());
    if (it == episodes_.end()) {
      return absl::NotFoundError(absl::StrCat("episode_id: \"", request.episode_id(), "\" is unknown, closed or expired"));
    }
    entry = it->second;
    last_used_[request.episode_id()] = absl::Now();
  }
  absl::MutexLock l(&entry->mu);
  return entry->episode->Step(request);
}

void EpisodeTable::Close(const std::string& episode_id) {
  std::shared_ptr<Entry> gone;  // destroyed after mu_ is released
  absl::MutexLock lock(&mu_);
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) return;
  gone = std::move(it->second);
  episodes_.erase(it);
  last_used_.erase(episode_id);
}

int64_t EpisodeTable::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(episodes_.size());
}

}  // namespace rlmesh::environment
