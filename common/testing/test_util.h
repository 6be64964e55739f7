#pragma once

// Helpers for tests: temp dirs and runfiles paths.

#include <string>

namespace rlmesh::testing {

// A fresh directory under $TEST_TMPDIR (or /tmp), removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Absolute path of a workspace-relative runfile, e.g. "rollout/rollout_worker".
std::string Runfile(const std::string& workspace_relative);

}  // namespace rlmesh::testing
