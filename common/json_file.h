#pragma once

// The one way rlmesh reads a JSON object file (a model folder's config.json,
// generation_config.json, tokenizer_config.json).

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace rlmesh {

// The JSON object in the file at `path`. Errors:
//   NOT_FOUND         nothing exists at `path` (callers whose file is
//                     optional test absl::IsNotFound and go on without it);
//   INVALID_ARGUMENT  "<path>: not a JSON object (...)": the file is not
//                     valid JSON (the parse error follows) or holds another
//                     JSON type (named); "<path>: cannot read" when it
//                     exists but cannot be opened.
absl::StatusOr<nlohmann::json> ReadJsonObjectFile(const std::string& path);

}  // namespace rlmesh
