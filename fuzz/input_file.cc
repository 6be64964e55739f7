#include "fuzz/input_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

namespace rlmesh::fuzz {

std::string WriteInputFile(const uint8_t* data, size_t size, const std::string& suffix) {
  static const std::string dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string d = std::string(base != nullptr ? base : "/tmp") + "/rlmesh-fuzz-input-XXXXXX";
    if (::mkdtemp(d.data()) == nullptr) std::abort();
    static std::string removed_at_exit;
    removed_at_exit = d;
    std::atexit([] { std::filesystem::remove_all(removed_at_exit); });
    return d;
  }();
  const std::string path = dir + "/input" + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
  return path;
}

}  // namespace rlmesh::fuzz
