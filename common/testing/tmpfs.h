#pragma once

// A small filesystem that fills up, for disk-full tests: a real tmpfs
// mounted in a private mount namespace of the calling process (root only),
// so nothing outside the process sees it and it goes when the process ends.

#include <string>

namespace rlmesh::testing {

// Moves this process into a new mount namespace (once) and mounts a tmpfs
// of `size` ("6m") at the existing folder `dir`. "" on success, else what
// failed (not root, no namespaces). Call before starting threads.
std::string MountPrivateTmpfs(const std::string& dir, const std::string& size);

// Grows or shrinks the tmpfs at `dir` to `size`. "" on success.
std::string ResizeTmpfs(const std::string& dir, const std::string& size);

// What a disk-full test does when MountPrivateTmpfs failed with `why`:
// true (after printing why) when RLMESH_DISK_FULL_TEST=skip, so the test
// returns having checked nothing; false when the test should fail.
bool SkipDiskFullTest(const std::string& test, const std::string& why);

}  // namespace rlmesh::testing
