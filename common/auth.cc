#include "common/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace rlmesh {
namespace {

// Constant-time comparison so a wrong token does not leak its prefix length
// through timing.
bool SecureEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::Status ServerAuth::Check(const grpc::ServerContextBase& context) const {
  if (!enabled()) return absl::OkStatus();
  const auto& md = context.client_metadata();
  auto it = md.find(kAuthMetadataKey);
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing authorization token");
  }
  absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (value.substr(0, kBearer.size()) != kBearer ||
      !SecureEquals(value.substr(kBearer.size()), token_)) {
    return absl::UnauthenticatedError("invalid authorization token");
  }
  return absl::OkStatus();
}

void AttachToken(absl::string_view token, grpc::ClientContext* context) {
  if (token.empty()) return;
  context->AddMetadata(kAuthMetadataKey, absl::StrCat("Bearer ", token));
}

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " is empty"));
  return ss.str();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  if (path.empty()) return std::string();
  RLMESH_ASSIGN_OR_RETURN(std::string text, ReadCredentialFile(path, "token"));
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is blank"));
  return token;
}

}  // namespace rlmesh
