#pragma once

// Executable scripts for tests that start programs (command verifiers,
// stand-ins for tools).

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "common/testing/test_util.h"

namespace rlmesh::testing {

// Writes `body` as the /bin/sh script `name` in `dir`, executable; its path.
inline std::string WriteScript(const TempDir& dir, const std::string& name, const std::string& body) {
  const std::string path = dir.File(name);
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

}  // namespace rlmesh::testing
