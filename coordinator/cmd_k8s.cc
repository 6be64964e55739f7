// `coordinator k8s --cluster K8S.yaml`: the Kubernetes manifests of a
// cluster with launcher: kubernetes (`launch --dry-run` prints them too).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "coordinator/cli.h"
#include "coordinator/k8s_manifests.h"

namespace rlmesh {
namespace {

// The files a cluster's Secrets carry, read from where the user named them.
absl::StatusOr<K8sSecretFiles> ReadK8sSecrets(const ClusterConfig& config) {
  auto read = [](const std::string& field, const std::string& path, std::string* out) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    std::ifstream in(UserPath(path), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in || text.str().empty()) return absl::NotFoundError(absl::StrCat(field, ": cannot read ", UserPath(path)));
    *out = text.str();
    return absl::OkStatus();
  };
  K8sSecretFiles f;
  RLMESH_RETURN_IF_ERROR(read("auth_token_file", config.auth_token_file(), &f.auth_token));
  RLMESH_RETURN_IF_ERROR(read("tls.cert_file", config.tls().cert_file(), &f.tls_cert));
  RLMESH_RETURN_IF_ERROR(read("tls.key_file", config.tls().key_file(), &f.tls_key));
  RLMESH_RETURN_IF_ERROR(read("tls.root_cert_file", config.tls().root_cert_file(), &f.tls_root_cert));
  return f;
}

}  // namespace

// `k8s` and `launch --dry-run` of a kubernetes cluster: the manifests on
// stdout, or one file per object under --out.
int RenderK8s(const std::string& what, const ClusterConfig& config) {
  auto secrets = ReadK8sSecrets(config);
  if (!secrets.ok()) return Fail(what, secrets.status());
  auto manifests = RenderKubernetes(config, *secrets);
  if (!manifests.ok()) return Fail(what, manifests.status());
  const bool has_secrets = !config.auth_token_file().empty() || !config.tls().cert_file().empty() ||
                           !config.tls().root_cert_file().empty();
  const std::string out = UserPath(absl::GetFlag(FLAGS_out));
  if (out.empty()) {
    std::fputs(JoinManifests(*manifests).c_str(), stdout);
  } else {
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec) return Fail(what, absl::PermissionDeniedError(absl::StrCat("cannot create ", out, ": ", ec.message())));
    for (const auto& m : *manifests) {
      absl::Status w = WriteFileAtomically(out + "/" + m.file, m.yaml);
      if (!w.ok()) return Fail(what, w);
    }
    std::printf("rlmesh: %zu objects in %s; apply them with: kubectl apply -f %s\n", manifests->size(), out.c_str(),
                out.c_str());
  }
  if (has_secrets) {
    std::fprintf(stderr, "coordinator %s: note: the output holds the token/TLS keys (Secrets, base64); keep it "
                 "out of version control\n", what.c_str());
  }
  return 0;
}

int K8s() {
  const std::string path = absl::GetFlag(FLAGS_cluster);
  if (path.empty()) return Fail("k8s", absl::InvalidArgumentError("--cluster: required"));
  auto loaded = LoadCluster(path);
  if (!loaded.ok()) return Fail("k8s", loaded.status());
  if (loaded->launcher() != "kubernetes") {
    return Fail("k8s", absl::InvalidArgumentError(
                           absl::StrCat("launcher: '", loaded->launcher(), "' is not \"kubernetes\"")));
  }
  return RenderK8s("k8s", *loaded);
}

}  // namespace rlmesh
