#include "weight_sync/segments.h"

#include <filesystem>
#include <system_error>

namespace rlmesh::weight_sync {

void RemoveSegments(const std::string& prefix) {
  if (prefix.empty() || prefix.find('/') != std::string::npos) return;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kShmDir, ec)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(e.path(), ec);
  }
}

}  // namespace rlmesh::weight_sync
