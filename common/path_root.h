#pragma once

// Folders a role may write into. Paths that arrive in RPCs (a checkpoint
// folder, a Save target, a model output) are checked against them, so a
// caller cannot make a role write outside the run's folders
// ("../../etc", an absolute path elsewhere, a symlink that leads out).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rlmesh {

// `path` made absolute against the working directory, "." and ".." folded
// and the symlinks of its longest existing prefix followed; no trailing
// separator.
std::string ResolvePath(const std::string& path);

// OK when `roots` is empty (no restriction) or `path` resolves to one of
// them or to something inside one (whole path components: /runs/a is not
// inside /runs/ab). Else PERMISSION_DENIED naming `field`, the path and the
// roots. An empty path is OK (the caller's default applies).
absl::Status CheckWithinRoots(const std::vector<std::string>& roots, const std::string& path,
                              absl::string_view field);

}  // namespace rlmesh
