#include "fuzz/input_file.h"

#include <cstdio>
#include <cstdlib>

#include "common/testing/test_util.h"

namespace rlmesh::fuzz {

std::string WriteInputFile(const uint8_t* data, size_t size, const std::string& suffix) {
  static const testing::TempDir dir;  // removed at exit
  const std::string path = dir.File("input" + suffix);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
  return path;
}

}  // namespace rlmesh::fuzz
