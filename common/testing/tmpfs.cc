#include "common/testing/tmpfs.h"

#include <sched.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

namespace rlmesh::testing {

std::string MountPrivateTmpfs(const std::string& dir, const std::string& size) {
  static bool unshared = false;
  if (!unshared) {
    if (::unshare(CLONE_NEWNS) != 0) return std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      return std::string("making / private: ") + std::strerror(errno);
    }
    unshared = true;
  }
  const std::string opts = "size=" + size;
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    return "mount tmpfs at " + dir + ": " + std::strerror(errno);
  }
  return "";
}

std::string ResizeTmpfs(const std::string& dir, const std::string& size) {
  const std::string opts = "size=" + size;
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT, opts.c_str()) != 0) {
    return "remount " + dir + ": " + std::strerror(errno);
  }
  return "";
}

bool SkipDiskFullTest(const std::string& test, const std::string& why) {
  const char* skip = std::getenv("RLMESH_DISK_FULL_TEST");
  if (skip == nullptr || std::string(skip) != "skip") return false;
  std::cout << test << ": not run (" << why << ")" << std::endl;
  return true;
}

}  // namespace rlmesh::testing
