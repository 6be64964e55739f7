// Learner checkpoints on a filesystem that fills up: a real tmpfs in a mount
// namespace of this test process (common/testing/tmpfs.h; root only). A
// Save that runs out of space fails with RESOURCE_EXHAUSTED naming the file
// it was writing, leaves no half-written folder behind, keeps the earlier
// checkpoint valid for resume, and the next Save succeeds once space
// returns. Where the tmpfs cannot be made it FAILS unless
// RLMESH_DISK_FULL_TEST=skip.
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/status_macros.h"
#include "common/testing/test_util.h"
#include "common/testing/tmpfs.h"
#include "learner/checkpoint.h"
#include "learner/testing/tiny_experiment.h"
#include "learner/trainer.h"

namespace rlmesh::learner {
namespace {

namespace fs = std::filesystem;

ConfigureRequest Request(const std::string& ckpt_dir) {
  ExperimentConfig e = testing::TinyExperiment(7, 16);
  Stage* s = e.add_stages();
  s->mutable_sft()->set_steps(8);
  s->mutable_sft()->set_batch(4);
  s->mutable_sft()->mutable_optimizer()->set_lr(1e-3);
  ConfigureRequest r;
  *r.mutable_experiment() = e;
  r.set_world_size(1);
  r.set_checkpoint_dir(ckpt_dir);
  return r;
}

TrainStepRequest Step(int64_t step) {
  TrainStepRequest r;
  r.set_step(step);
  r.set_from_task(true);
  return r;
}

std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// Writes `path` until the filesystem is full, then gives `leave` bytes back.
void Fill(const std::string& path, size_t leave) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  const std::vector<char> chunk(16 << 10, 'x');
  size_t written = 0;
  for (;;) {
    const size_t n = std::fwrite(chunk.data(), 1, chunk.size(), f);
    written += n;
    if (n < chunk.size() || std::fflush(f) != 0) break;
  }
  std::fclose(f);
  fs::resize_file(path, written > leave ? written - leave : 0);
}

// An 8 MB tmpfs at `dir`/mnt, in this process's own mount namespace. Where
// it cannot be made the test fails, or with RLMESH_DISK_FULL_TEST=skip this
// returns "" and the test returns.
std::string SmallFilesystem(const rlmesh::testing::TempDir& dir) {
  const std::string mnt = dir.File("mnt");
  fs::create_directories(mnt);
  const std::string why = rlmesh::testing::MountPrivateTmpfs(mnt, "8m");
  if (why.empty()) return mnt;
  if (rlmesh::testing::SkipDiskFullTest("checkpoint_disk_full_test", why)) return "";
  FAIL("cannot make the small filesystem this test needs (" << why
                                                            << "); run as root, or set RLMESH_DISK_FULL_TEST=skip");
  return "";
}

TEST_CASE("a checkpoint on a full disk fails by name, leaves nothing half-written and succeeds once space returns") {
  rlmesh::testing::TempDir dir;
  const std::string mnt = SmallFilesystem(dir);
  if (mnt.empty()) return;  // skipped (RLMESH_DISK_FULL_TEST=skip)
  const std::string ckpt = mnt + "/ckpt";
  Trainer t;
  REQUIRE(t.Configure(Request(ckpt)).ok());
  REQUIRE(t.TrainStep(Step(0)).ok());
  auto first = t.Save();
  REQUIRE(first.ok());
  const std::string kept = ckpt + "/" + CheckpointName(1);
  CHECK(first->path() == kept);
  const uintmax_t checkpoint_bytes = [&] {
    uintmax_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(kept)) n += e.is_regular_file() ? e.file_size() : 0;
    return n;
  }();
  INFO("a checkpoint takes " << checkpoint_bytes << " bytes");
  REQUIRE(checkpoint_bytes > (64u << 10));

  // The disk fills up: less room than a checkpoint needs.
  const std::string filler = mnt + "/filler";
  Fill(filler, checkpoint_bytes / 3);
  REQUIRE(t.TrainStep(Step(1)).ok());
  auto full = t.Save();
  INFO(full.status().ToString());
  REQUIRE_FALSE(full.ok());
  CHECK(full.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string msg(full.status().message());
  CHECK(msg.find(ckpt + "/") != std::string::npos);   // the file it was writing
  CHECK(msg.find("No space left") != std::string::npos);
  CHECK(msg.find(CheckpointName(2)) != std::string::npos);
  // Nothing half-written stays (no staging folder holding the space), and
  // the earlier checkpoint is intact and is what a resume finds.
  CHECK(Names(ckpt) == std::set<std::string>{CheckpointName(1)});
  CHECK(VerifyCheckpoint(kept).ok());
  auto newest = NewestValidCheckpoint(ckpt, -1);
  REQUIRE(newest.ok());
  CHECK(newest->path == kept);
  // Training goes on meanwhile.
  REQUIRE(t.TrainStep(Step(2)).ok());

  // Space returns: the next save succeeds, and a fresh trainer resumes it.
  fs::remove(filler);
  auto after = t.Save();
  INFO(after.status().ToString());
  REQUIRE(after.ok());
  CHECK(after->path() == ckpt + "/" + CheckpointName(3));
  CHECK(VerifyCheckpoint(after->path()).ok());
  Trainer resumed;
  auto c = resumed.Configure(Request(ckpt));
  REQUIRE(c.ok());
  CHECK(c->step() == 3);
}

TEST_CASE("under ZeRO-3 over two ranks a full disk fails both at once, and the next save succeeds") {
  rlmesh::testing::TempDir dir;
  const std::string mnt = SmallFilesystem(dir);
  if (mnt.empty()) return;  // skipped (RLMESH_DISK_FULL_TEST=skip)
  const std::string ckpt = mnt + "/ckpt";
  ConfigureRequest base = Request(ckpt);
  base.mutable_experiment()->mutable_learner()->set_zero(3);
  // Rank 0 writes every file while both gather the units (streamed): with
  // the disk full it fails mid-file, and rank 1, which wrote nothing, must
  // neither succeed nor wait for a barrier rank 0 never reaches.
  const std::string filler = mnt + "/filler";
  absl::Status full[2];
  std::string kept;
  Trainer ranks[2];
  auto results = testing::TrainShards(
      ranks, 2, base, dir.File("store"), 1, Step,
      [&](int rank, Trainer& t) -> absl::Status {
        auto first = t.Save();
        if (!first.ok()) return first.status();
        if (rank == 0) {
          kept = first->path();
          uintmax_t bytes = 0;
          for (const auto& e : fs::recursive_directory_iterator(kept)) bytes += e.is_regular_file() ? e.file_size() : 0;
          Fill(filler, bytes / 3);
        }
        RLMESH_RETURN_IF_ERROR(t.TrainStep(Step(1)).status());
        // Rank 1 waits in the save's first agreement until rank 0 is there.
        full[rank] = t.Save().status();
        if (rank == 0) fs::remove(filler);
        RLMESH_RETURN_IF_ERROR(t.TrainStep(Step(2)).status());
        return t.Save().status();
      },
      /*gather=*/false);
  INFO(results[0].ToString() << " / " << results[1].ToString());
  CHECK(results[0].ok());
  CHECK(results[1].ok());
  INFO(full[0].ToString() << " / " << full[1].ToString());
  CHECK(full[0].code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(full[0].message(), "No space left"));
  CHECK(full[1].code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(full[1].message(), "another learner rank failed"));
  CHECK(Names(ckpt) == std::set<std::string>{CheckpointName(1), CheckpointName(3)});
  CHECK(VerifyCheckpoint(kept).ok());
  CHECK(VerifyCheckpoint(ckpt + "/" + CheckpointName(3)).ok());
}

}  // namespace
}  // namespace rlmesh::learner
