#include "common/path_root.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rlmesh {
namespace {

namespace fs = std::filesystem;

bool Within(const fs::path& root, const fs::path& path) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (p == path.end() || *r != *p) return false;
  }
  return true;
}

}  // namespace

std::string ResolvePath(const std::string& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  if (ec) abs = fs::path(path);
  fs::path resolved = fs::weakly_canonical(abs, ec);
  if (ec) resolved = abs.lexically_normal();
  std::string out = resolved.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

absl::Status CheckWithinRoots(const std::vector<std::string>& roots, const std::string& path,
                              absl::string_view field) {
  if (roots.empty() || path.empty()) return absl::OkStatus();
  const fs::path resolved(ResolvePath(path));
  std::vector<std::string> resolved_roots;
  for (const std::string& root : roots) {
    resolved_roots.push_back(ResolvePath(root));
    if (Within(fs::path(resolved_roots.back()), resolved)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(field, ": ", path, " (", resolved.string(),
                                                  ") is outside the folders this role may write (",
                                                  absl::StrJoin(resolved_roots, ", "), ")"));
}

}  // namespace rlmesh
