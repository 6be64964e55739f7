#include "common/json_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rlmesh {

absl::StatusOr<nlohmann::json> ReadJsonObjectFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  // nlohmann reports a syntax error only by exception; it stays in here.
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, ...".
    absl::string_view what = e.what();
    if (const size_t end = what.find("] "); absl::StartsWith(what, "[json.") && end != what.npos) {
      what.remove_prefix(end + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object (", what, ")"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object (", j.type_name(), ")"));
  }
  return j;
}

}  // namespace rlmesh
