#include "common/path_root.h"

#include <unistd.h>

#include <filesystem>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

namespace fs = std::filesystem;

TEST_CASE("a path is within its roots by whole components, after '..' and symlinks") {
  testing::TempDir dir;
  const std::string runs = dir.File("runs");
  fs::create_directories(runs + "/exp/checkpoints");
  fs::create_directories(dir.File("runs2"));
  fs::create_directories(dir.File("elsewhere"));
  const std::vector<std::string> roots = {runs};

  CHECK(CheckWithinRoots(roots, runs, "f").ok());
  CHECK(CheckWithinRoots(roots, runs + "/", "f").ok());
  CHECK(CheckWithinRoots(roots, runs + "/exp/checkpoints/step_000001", "f").ok());  // not made yet
  CHECK(CheckWithinRoots(roots, runs + "/exp/../other", "f").ok());
  CHECK(CheckWithinRoots(roots, "", "f").ok());
  CHECK(CheckWithinRoots({}, "/etc/passwd", "f").ok());  // no roots, no restriction

  const absl::Status up = CheckWithinRoots(roots, runs + "/exp/../../elsewhere/x", "checkpoint_dir");
  CHECK(up.code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(up.message()).find("checkpoint_dir: ") == 0);
  CHECK(std::string(up.message()).find(dir.File("elsewhere/x")) != std::string::npos);
  CHECK(CheckWithinRoots(roots, dir.File("runs2/x"), "f").code() == absl::StatusCode::kPermissionDenied);
  CHECK(CheckWithinRoots(roots, "/etc", "f").code() == absl::StatusCode::kPermissionDenied);
  CHECK(CheckWithinRoots(roots, "/", "f").code() == absl::StatusCode::kPermissionDenied);

  // A symlink inside the root that leads out is out.
  fs::create_directory_symlink(dir.File("elsewhere"), runs + "/link");
  CHECK(CheckWithinRoots(roots, runs + "/link/x", "f").code() == absl::StatusCode::kPermissionDenied);

  // Relative paths resolve against the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(runs);
  CHECK(CheckWithinRoots(roots, "exp/new", "f").ok());
  CHECK(CheckWithinRoots(roots, "../elsewhere", "f").code() == absl::StatusCode::kPermissionDenied);
  CHECK(CheckWithinRoots({"."}, "exp", "f").ok());
  fs::current_path(cwd);

  // Several roots: any one will do.
  CHECK(CheckWithinRoots({dir.File("elsewhere"), runs}, runs + "/exp", "f").ok());
}

}  // namespace
}  // namespace rlmesh
