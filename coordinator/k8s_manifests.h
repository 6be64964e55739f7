#pragma once

// Kubernetes manifests for a cluster YAML (ClusterConfig with launcher:
// kubernetes), as `coordinator k8s` prints them. Plain functions over plain
// data: no gRPC, no I/O (the caller reads the secret files and writes the
// output).
//
// What is rendered, in apply order (all in kubernetes.namespace):
//   Namespace            only with kubernetes.create_namespace
//   Secret rlmesh-auth   the token (key "token") when auth_token_file is set
//   Secret rlmesh-tls    tls.crt / tls.key / ca.crt when the tls block is set
//   ConfigMap rlmesh-cluster  the cluster YAML as the coordinator's pod
//                        reads it (paths rewritten to the pod's mounts)
//   PersistentVolumeClaim rlmesh-runs  ReadWriteMany, unless existing_claim
//   Deployment + Service coordinator  one replica, ClusterIP on
//                        coordinator_port; it runs `coordinator launch` and
//                        waits for the roles to register
//   per role a headless Service and a StatefulSet: replay-buffer (1 pod),
//   reward, rollout, learner (the configured counts). Pod i of StatefulSet S
//   is S-i, reachable at S-i.S.<namespace>.svc.<cluster_domain>; it
//   registers under that name (the replay buffer as "replay_buffer") and
//   advertises that DNS name, so learner-0's c10d store is reached by its
//   stable name whichever node the pod lands on.
//
// Every pod mounts the claim at kubernetes.mount_path; the run dir and the
// replay buffer live under it. One rlmesh cluster per namespace (the object
// names are fixed so the pods' DNS names read like the role names).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace rlmesh {

// File contents the Secrets carry (read by the caller from the cluster's
// auth_token_file and tls files). Empty = that file is not configured.
struct K8sSecretFiles {
  std::string auth_token;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_root_cert;
};

// One Kubernetes object.
struct K8sManifest {
  std::string kind;  // "StatefulSet"
  std::string name;  // metadata.name
  // File it is written to with --out: "<order>-<name>-<kind>.yaml", so
  // `kubectl apply -f DIR` creates the namespace and secrets first.
  std::string file;
  std::string yaml;  // one YAML document, no "---"
};

// Where the pods mount the secrets and the cluster YAML.
inline constexpr char kK8sAuthDir[] = "/etc/rlmesh/auth";
inline constexpr char kK8sTlsDir[] = "/etc/rlmesh/tls";
inline constexpr char kK8sClusterDir[] = "/etc/rlmesh/cluster";

// INVALID_ARGUMENT naming the field (kubernetes.image, kubernetes.namespace,
// learners, ...) when `config` cannot be rendered: launcher is not
// "kubernetes", a required field is empty, a name is not a DNS label, a port
// is out of range or two roles share one, a path is outside mount_path, or
// a quantity is malformed.
absl::Status ValidateKubernetesCluster(const ClusterConfig& config);

// Every object for `config`, in apply order. REQUIRES nothing: an invalid
// config is refused with ValidateKubernetesCluster's error. A secret file
// that is configured must have contents in `secrets` (else
// INVALID_ARGUMENT naming the field).
absl::StatusOr<std::vector<K8sManifest>> RenderKubernetes(const ClusterConfig& config,
                                                         const K8sSecretFiles& secrets);

// The documents as one multi-document YAML stream ("---" between them).
std::string JoinManifests(const std::vector<K8sManifest>& manifests);

// The cluster as the coordinator's pod sees it (the ConfigMap's
// cluster.yaml): absolute run_dir and buffer_path under mount_path, the
// auth and TLS paths at the Secret mounts, every default filled in.
ClusterConfig PodClusterConfig(const ClusterConfig& config);

// Names the roles register under, in start order: "replay_buffer",
// "reward-<i>", "rollout-<i>", "learner-<i>". The coordinator's pod waits
// for all of them.
std::vector<std::string> KubernetesRoleNames(const ClusterConfig& config);

// host:port every role reaches the coordinator at:
// coordinator.<namespace>.svc.<cluster_domain>:<coordinator_port>.
std::string KubernetesCoordinatorAddress(const ClusterConfig& config);

}  // namespace rlmesh
