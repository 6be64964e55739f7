#include "coordinator/k8s_manifests.h"

#include <functional>
#include <regex>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "coordinator/role_command.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace rlmesh {
namespace {

using Json = nlohmann::ordered_json;

// ---- YAML out of a JSON tree ---------------------------------------------
// The objects are built as JSON trees (keys in insertion order) and written
// by yaml-cpp's emitter in block style. Every string is double-quoted, so
// "7401", "true" or "null" never read back as a number, a bool or a null.

// A key written plain: an identifier no YAML 1.1 reader takes for a bool
// or a null. Other keys are double-quoted.
bool PlainKey(const std::string& k) {
  static const std::regex plain("[A-Za-z_][A-Za-z0-9_./-]*");
  static const std::regex reserved("y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|"
                                   "OFF|null|Null|NULL");
  return std::regex_match(k, plain) && !std::regex_match(k, reserved);
}

// Whether `s` can be a literal block and read back byte for byte. yaml-cpp
// writes "|" (clip chomping: exactly one final newline kept), so `s` must
// end in exactly one newline; no tabs, carriage returns or other control
// characters, no leading space (it would be read as indentation), no
// trailing spaces on a line.
bool LiteralBlock(const std::string& s) {
  if (s.size() < 2 || s.back() != '\n' || s[s.size() - 2] == '\n' || s.front() == ' ' || s.front() == '\n') {
    return false;
  }
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if ((ch < 0x20 && ch != '\n') || ch == 0x7f) return false;
    if (ch == '\n' && i > 0 && s[i - 1] == ' ') return false;
  }
  return true;
}

void Emit(const Json& v, YAML::Emitter* out) {
  switch (v.type()) {
    case Json::value_t::object:
      if (v.empty()) {
        *out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        return;
      }
      *out << YAML::BeginMap;
      for (const auto& [k, child] : v.items()) {
        *out << YAML::Key;
        if (!PlainKey(k)) *out << YAML::DoubleQuoted;
        *out << k << YAML::Value;
        Emit(child, out);
      }
      *out << YAML::EndMap;
      return;
    case Json::value_t::array:
      if (v.empty()) {
        *out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        return;
      }
      *out << YAML::BeginSeq;
      for (const Json& item : v) Emit(item, out);
      *out << YAML::EndSeq;
      return;
    case Json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      *out << (LiteralBlock(s) ? YAML::Literal : YAML::DoubleQuoted) << s;
      return;
    }
    case Json::value_t::boolean:
      *out << v.get<bool>();
      return;
    case Json::value_t::number_integer:
      *out << v.get<int64_t>();
      return;
    case Json::value_t::number_unsigned:
      *out << v.get<uint64_t>();
      return;
    case Json::value_t::number_float:
      *out << v.get<double>();
      return;
    default:  // null (the trees hold no binary or discarded values)
      *out << YAML::Null;
      return;
  }
}

// One YAML document (no "---"), ending in a newline.
absl::StatusOr<std::string> ToYaml(const Json& v) {
  YAML::Emitter out;
  Emit(v, &out);
  if (!out.good()) return absl::InternalError(absl::StrCat("cannot write a manifest as YAML: ", out.GetLastError()));
  return absl::StrCat(out.c_str(), "\n");
}

// ---- the cluster with its defaults ---------------------------------------

constexpr char kApp[] = "rlmesh";
constexpr char kClaim[] = "rlmesh-runs";
constexpr char kAuthSecret[] = "rlmesh-auth";
constexpr char kTlsSecret[] = "rlmesh-tls";
constexpr char kClusterMap[] = "rlmesh-cluster";
constexpr char kCoordinator[] = "coordinator";

std::string Or(const std::string& v, const std::string& fallback) { return v.empty() ? fallback : v; }
int Or(int v, int fallback) { return v > 0 ? v : fallback; }

std::string Name(const ClusterConfig& c) { return Or(c.name(), "rlmesh"); }
std::string Namespace(const ClusterConfig& c) { return Or(c.kubernetes().namespace_(), "rlmesh"); }
std::string Domain(const ClusterConfig& c) { return Or(c.kubernetes().cluster_domain(), "cluster.local"); }
std::string MountPath(const ClusterConfig& c) {
  std::string m = Or(c.kubernetes().mount_path(), "/rlmesh");
  while (m.size() > 1 && m.back() == '/') m.pop_back();
  return m;
}
std::string BinDir(const ClusterConfig& c) { return Or(c.kubernetes().bin_dir(), "/opt/rlmesh/bin"); }
int CoordinatorPort(const ClusterConfig& c) { return Or(c.coordinator_port(), 7401); }

// A path of the cluster inside the pods: relative ones under mount_path.
std::string UnderMount(const ClusterConfig& c, const std::string& path) {
  return path.empty() || path[0] == '/' ? path : absl::StrCat(MountPath(c), "/", path);
}
std::string RunDir(const ClusterConfig& c) { return UnderMount(c, Or(c.run_dir(), "runs/" + Name(c))); }
std::string BufferPath(const ClusterConfig& c) {
  return c.buffer_path().empty() ? RunDir(c) + "/replay_buffer" : UnderMount(c, c.buffer_path());
}

bool HasTls(const ClusterConfig& c) {
  return !c.tls().cert_file().empty() || !c.tls().key_file().empty() || !c.tls().root_cert_file().empty();
}

// One role as a StatefulSet.
struct RoleSet {
  Role role;
  std::string set;        // StatefulSet, headless Service and pod-name prefix
  std::string component;  // app.kubernetes.io/component
  int replicas;
  int port;
  const KubernetesResources* resources;
};

std::vector<RoleSet> RoleSets(const ClusterConfig& c) {
  const KubernetesConfig& k = c.kubernetes();
  return {
      {ROLE_REPLAY_BUFFER, "replay-buffer", "replay_buffer", 1, Or(k.replay_buffer_port(), 7402),
       &k.replay_buffer_resources()},
      {ROLE_REWARD_SERVER, "reward", "reward_server", Or(c.reward_servers(), 1), Or(k.reward_server_port(), 7403),
       &k.reward_server_resources()},
      {ROLE_ROLLOUT_WORKER, "rollout", "rollout_worker", Or(c.rollout_workers(), 1),
       Or(k.rollout_worker_port(), 7404), &k.rollout_worker_resources()},
      {ROLE_LEARNER, "learner", "learner", Or(c.learners(), 1), Or(k.learner_port(), 7405), &k.learner_resources()},
  };
}

// Stable DNS name of pod `index` of `set`.
std::string PodHost(const ClusterConfig& c, const std::string& set, int index) {
  return absl::StrCat(set, "-", index, ".", set, ".", Namespace(c), ".svc.", Domain(c));
}

// ---- validation -----------------------------------------------------------

bool DnsLabel(const std::string& s) {
  static const std::regex label("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  return s.size() <= 63 && std::regex_match(s, label);
}

bool DnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (absl::string_view part : absl::StrSplit(s, '.')) {
    if (!DnsLabel(std::string(part))) return false;
  }
  return true;
}

// "4", "500m", "1.5", "16Gi", "100M": Kubernetes' quantity grammar, less
// the exponent forms nobody writes.
bool Quantity(const std::string& s) {
  static const std::regex q("[0-9]+(\\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?");
  return std::regex_match(s, q);
}

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::Status ValidateResources(const std::string& field, const KubernetesResources& r) {
  if (!r.cpu().empty() && !Quantity(r.cpu())) return Invalid(field + ".cpu", "'" + r.cpu() + "' is not a quantity");
  if (!r.memory().empty() && !Quantity(r.memory())) {
    return Invalid(field + ".memory", "'" + r.memory() + "' is not a quantity");
  }
  if (r.gpus() < 0) return Invalid(field + ".gpus", absl::StrCat(r.gpus(), " < 0"));
  return absl::OkStatus();
}

absl::Status ValidatePath(const ClusterConfig& c, const std::string& field, const std::string& path) {
  if (path.empty() || path[0] != '/') return absl::OkStatus();
  if (!absl::StartsWith(path, MountPath(c) + "/")) {
    return Invalid(field, absl::StrCat("'", path, "' is outside kubernetes.mount_path (", MountPath(c),
                                       "), which is the only storage every pod shares"));
  }
  return absl::OkStatus();
}

// --threads for a role from an integer CPU request ("8"), else none.
std::vector<std::string> ThreadArgs(const KubernetesResources& r) {
  int cores = 0;
  if (absl::SimpleAtoi(r.cpu(), &cores) && cores > 0) return {absl::StrCat("--threads=", cores)};
  return {};
}

// ---- objects --------------------------------------------------------------

Json Labels(const ClusterConfig& c, const std::string& component) {
  return Json{{"app.kubernetes.io/name", kApp},
              {"app.kubernetes.io/instance", Name(c)},
              {"app.kubernetes.io/component", component}};
}

// The labels a selector matches on (a subset of Labels).
Json Selector(const ClusterConfig& c, const std::string& component) {
  return Json{{"app.kubernetes.io/instance", Name(c)}, {"app.kubernetes.io/component", component}};
}

Json Metadata(const ClusterConfig& c, const std::string& name, const std::string& component) {
  return Json{{"name", name}, {"namespace", Namespace(c)}, {"labels", Labels(c, component)}};
}

Json ResourcesOf(const KubernetesResources& r) {
  Json requests = Json::object(), limits = Json::object();
  if (!r.cpu().empty()) requests["cpu"] = limits["cpu"] = r.cpu();
  if (!r.memory().empty()) requests["memory"] = limits["memory"] = r.memory();
  if (r.gpus() > 0) limits["nvidia.com/gpu"] = r.gpus();
  Json out = Json::object();
  if (!requests.empty()) out["requests"] = requests;
  if (!limits.empty()) out["limits"] = limits;
  return out;
}

// The --tls_* flags of every process, at the Secret's mount.
std::vector<std::string> PodTlsArgs(const ClusterConfig& c) {
  const ClusterConfig pod = PodClusterConfig(c);
  std::vector<std::string> args;
  if (!pod.tls().cert_file().empty()) {
    args.push_back("--tls_cert=" + pod.tls().cert_file());
    args.push_back("--tls_key=" + pod.tls().key_file());
  }
  if (!pod.tls().root_cert_file().empty()) args.push_back("--tls_root_cert=" + pod.tls().root_cert_file());
  if (pod.tls().mutual()) args.push_back("--tls_mutual");
  return args;
}

Json Env(const ClusterConfig& c) {
  Json env = Json::array({
      {{"name", "POD_NAME"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
      {{"name", "POD_NAMESPACE"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.namespace"}}}}}},
      // As the local launcher sets it: spinning OpenMP threads starve the
      // other processes of a node (bench/learner.md).
      {{"name", "OMP_WAIT_POLICY"}, {"value", "PASSIVE"}},
      {{"name", "GOMP_SPINCOUNT"}, {"value", "1000"}},
  });
  const std::string& nic = c.kubernetes().network_interface();
  if (!nic.empty()) {
    env.push_back({{"name", "GLOO_SOCKET_IFNAME"}, {"value", nic}});
    env.push_back({{"name", "NCCL_SOCKET_IFNAME"}, {"value", nic}});
  }
  return env;
}

Json Mounts(const ClusterConfig& c) {
  Json mounts = Json::array({{{"name", "runs"}, {"mountPath", MountPath(c)}}});
  if (!c.auth_token_file().empty()) {
    mounts.push_back({{"name", "auth"}, {"mountPath", kK8sAuthDir}, {"readOnly", true}});
  }
  if (HasTls(c)) mounts.push_back({{"name", "tls"}, {"mountPath", kK8sTlsDir}, {"readOnly", true}});
  return mounts;
}

Json Volumes(const ClusterConfig& c) {
  Json volumes = Json::array({{{"name", "runs"},
                               {"persistentVolumeClaim", {{"claimName", Or(c.kubernetes().existing_claim(), kClaim)}}}}});
  // 0400: only the process (and root) reads a key.
  if (!c.auth_token_file().empty()) {
    volumes.push_back({{"name", "auth"}, {"secret", {{"secretName", kAuthSecret}, {"defaultMode", 0400}}}});
  }
  if (HasTls(c)) {
    volumes.push_back({{"name", "tls"}, {"secret", {{"secretName", kTlsSecret}, {"defaultMode", 0400}}}});
  }
  return volumes;
}

// The pod spec every rlmesh pod shares, around one container.
Json PodSpec(const ClusterConfig& c, Json container) {
  const KubernetesConfig& k = c.kubernetes();
  Json spec = Json::object();
  if (!k.service_account().empty()) spec["serviceAccountName"] = k.service_account();
  if (k.image_pull_secrets_size() > 0) {
    Json secrets = Json::array();
    for (const auto& s : k.image_pull_secrets()) secrets.push_back({{"name", s}});
    spec["imagePullSecrets"] = secrets;
  }
  spec["containers"] = Json::array({std::move(container)});
  spec["volumes"] = Volumes(c);
  return spec;
}

Json Container(const ClusterConfig& c, const std::string& name, const std::vector<std::string>& command, int port,
               const KubernetesResources& resources) {
  Json container = {
      {"name", name},
      {"image", c.kubernetes().image()},
      {"imagePullPolicy", Or(c.kubernetes().image_pull_policy(), "IfNotPresent")},
      {"command", command},
      {"env", Env(c)},
      {"ports", Json::array({{{"name", "grpc"}, {"containerPort", port}, {"protocol", "TCP"}}})},
      // Serving at all; the coordinator health-checks the RPCs itself (a
      // TCP probe needs neither the token nor a client certificate).
      {"readinessProbe", {{"tcpSocket", {{"port", "grpc"}}}, {"periodSeconds", 5}}},
      {"volumeMounts", Mounts(c)},
  };
  Json res = ResourcesOf(resources);
  if (!res.empty()) container["resources"] = res;
  return container;
}

// The command of a role's pods. Every pod of the StatefulSet runs the same
// one; $(POD_NAME) (expanded by the kubelet) makes it that pod's.
std::vector<std::string> RoleContainerCommand(const ClusterConfig& c, const RoleSet& s) {
  const ClusterConfig pod = PodClusterConfig(c);
  RoleCommand rc;
  rc.bin_dir = BinDir(c);
  rc.role = s.role;
  rc.port = s.port;
  rc.bind = "0.0.0.0";
  rc.coordinator = KubernetesCoordinatorAddress(c);
  rc.instance_name = s.role == ROLE_REPLAY_BUFFER ? "replay_buffer" : "$(POD_NAME)";
  rc.advertise_address = absl::StrCat("$(POD_NAME).", s.set, ".", Namespace(c), ".svc.", Domain(c), ":", s.port);
  rc.auth_token_file = pod.auth_token_file();
  rc.common_args = PodTlsArgs(c);
  const std::string tokenizer = "--tokenizer=" + Or(c.tokenizer(), "char");
  switch (s.role) {
    case ROLE_REPLAY_BUFFER: rc.role_args = {"--db_path=" + BufferPath(c)}; break;
    case ROLE_REWARD_SERVER: rc.role_args = {tokenizer}; break;
    case ROLE_ROLLOUT_WORKER:
      rc.role_args = {tokenizer};
      rc.role_args.push_back("--name=$(POD_NAME)");
      break;
    case ROLE_LEARNER: rc.role_args = {"--name=$(POD_NAME)"}; break;
    default: break;
  }
  if (s.role != ROLE_REPLAY_BUFFER) {  // the buffer has no --threads
    for (auto& a : ThreadArgs(*s.resources)) rc.role_args.push_back(std::move(a));
  }
  if (s.role != ROLE_ROLLOUT_WORKER) return RoleArgv(rc);

  // A rollout worker writes to the buffer and scores with reward server
  // (its ordinal mod their count), as the local and Slurm launchers pair
  // them.
  const int port = RoleSets(c)[1].port;
  const int rewards = RoleSets(c)[1].replicas;
  rc.wiring = {absl::StrCat("--replay_buffer=", PodHost(c, "replay-buffer", 0), ":", RoleSets(c)[0].port)};
  if (rewards == 1) {
    rc.wiring.push_back(absl::StrCat("--reward_server=", PodHost(c, "reward", 0), ":", port));
    return RoleArgv(rc);
  }
  // One StatefulSet cannot give each pod other arguments; a shell picks the
  // reward server from the ordinal at the end of the pod's name. "$$" is the
  // kubelet's escape for a literal "$".
  std::vector<std::string> cmd = {
      "/bin/sh", "-c",
      absl::StrCat("exec \"$$0\" \"$$@\" --reward_server=reward-$$(( $${POD_NAME##*-} % ", rewards, " )).reward.",
                   Namespace(c), ".svc.", Domain(c), ":", port)};
  for (auto& a : RoleArgv(rc)) cmd.push_back(std::move(a));
  return cmd;
}

std::string Base64(const std::string& s) {
  std::string out;
  absl::Base64Escape(s, &out);
  return out;
}

std::string FileName(int order, const std::string& name, const std::string& kind) {
  std::string lower = kind;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return absl::StrCat(order < 10 ? "0" : "", order, "-", name, "-", lower, ".yaml");
}

}  // namespace

ClusterConfig PodClusterConfig(const ClusterConfig& c) {
  ClusterConfig pod = c;
  pod.set_name(Name(c));
  pod.set_launcher("kubernetes");
  pod.set_bind("0.0.0.0");
  pod.set_coordinator_port(CoordinatorPort(c));
  pod.set_rollout_workers(Or(c.rollout_workers(), 1));
  pod.set_reward_servers(Or(c.reward_servers(), 1));
  pod.set_learners(Or(c.learners(), 1));
  pod.set_run_dir(RunDir(c));
  pod.set_buffer_path(BufferPath(c));
  pod.set_tokenizer(Or(c.tokenizer(), "char"));
  if (!c.auth_token_file().empty()) pod.set_auth_token_file(absl::StrCat(kK8sAuthDir, "/token"));
  TlsConfig* tls = pod.mutable_tls();
  if (!c.tls().cert_file().empty()) tls->set_cert_file(absl::StrCat(kK8sTlsDir, "/tls.crt"));
  if (!c.tls().key_file().empty()) tls->set_key_file(absl::StrCat(kK8sTlsDir, "/tls.key"));
  if (!c.tls().root_cert_file().empty()) tls->set_root_cert_file(absl::StrCat(kK8sTlsDir, "/ca.crt"));
  pod.clear_slurm();
  KubernetesConfig* k = pod.mutable_kubernetes();
  k->set_namespace_(Namespace(c));
  k->set_bin_dir(BinDir(c));
  k->set_image_pull_policy(Or(k->image_pull_policy(), "IfNotPresent"));
  k->set_storage_size(Or(k->storage_size(), "100Gi"));
  k->set_mount_path(MountPath(c));
  k->set_cluster_domain(Domain(c));
  const std::vector<RoleSet> sets = RoleSets(c);
  k->set_replay_buffer_port(sets[0].port);
  k->set_reward_server_port(sets[1].port);
  k->set_rollout_worker_port(sets[2].port);
  k->set_learner_port(sets[3].port);
  k->set_start_timeout_seconds(Or(k->start_timeout_seconds(), 600));
  return pod;
}

std::vector<std::string> KubernetesRoleNames(const ClusterConfig& c) {
  std::vector<std::string> names = {"replay_buffer"};
  for (const RoleSet& s : RoleSets(c)) {
    if (s.role == ROLE_REPLAY_BUFFER) continue;
    for (int i = 0; i < s.replicas; ++i) names.push_back(absl::StrCat(s.set, "-", i));
  }
  return names;
}

std::string KubernetesCoordinatorAddress(const ClusterConfig& c) {
  return absl::StrCat(kCoordinator, ".", Namespace(c), ".svc.", Domain(c), ":", CoordinatorPort(c));
}

absl::Status ValidateKubernetesCluster(const ClusterConfig& c) {
  const KubernetesConfig& k = c.kubernetes();
  if (c.launcher() != "kubernetes") {
    return Invalid("launcher", absl::StrCat("'", c.launcher(), "' is not \"kubernetes\""));
  }
  static const std::regex label_value("([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?");
  if (Name(c).size() > 63 || !std::regex_match(Name(c), label_value)) {
    return Invalid("name", absl::StrCat("'", Name(c), "' is not a Kubernetes label value (letters, digits, "
                                        "'-', '_', '.', at most 63)"));
  }
  if (!DnsLabel(Namespace(c))) {
    return Invalid("kubernetes.namespace", absl::StrCat("'", Namespace(c), "' is not a DNS label ([a-z0-9-], at most 63)"));
  }
  if (k.image().empty()) return Invalid("kubernetes.image", "required (the image holding the rlmesh binaries)");
  if (k.image().find_first_of(" \t\n\"'") != std::string::npos) {
    return Invalid("kubernetes.image", absl::StrCat("'", k.image(), "' has spaces or quotes"));
  }
  if (BinDir(c)[0] != '/') return Invalid("kubernetes.bin_dir", absl::StrCat("'", BinDir(c), "' is not absolute"));
  const std::string policy = Or(k.image_pull_policy(), "IfNotPresent");
  if (policy != "Always" && policy != "IfNotPresent" && policy != "Never") {
    return Invalid("kubernetes.image_pull_policy", absl::StrCat("'", policy, "' is not Always, IfNotPresent or Never"));
  }
  for (const auto& s : k.image_pull_secrets()) {
    if (!DnsSubdomain(s)) return Invalid("kubernetes.image_pull_secrets", absl::StrCat("'", s, "' is not a name"));
  }
  if (!k.storage_class().empty() && !DnsSubdomain(k.storage_class())) {
    return Invalid("kubernetes.storage_class", absl::StrCat("'", k.storage_class(), "' is not a name"));
  }
  if (!Quantity(Or(k.storage_size(), "100Gi"))) {
    return Invalid("kubernetes.storage_size", absl::StrCat("'", k.storage_size(), "' is not a quantity (e.g. 100Gi)"));
  }
  if (!k.existing_claim().empty() && !DnsSubdomain(k.existing_claim())) {
    return Invalid("kubernetes.existing_claim", absl::StrCat("'", k.existing_claim(), "' is not a name"));
  }
  const std::string mount = MountPath(c);
  if (mount[0] != '/' || mount == "/" || mount.find_first_of(" \t\n:") != std::string::npos) {
    return Invalid("kubernetes.mount_path", absl::StrCat("'", mount, "' is not an absolute folder below /"));
  }
  if (!DnsSubdomain(Domain(c))) {
    return Invalid("kubernetes.cluster_domain", absl::StrCat("'", Domain(c), "' is not a DNS name"));
  }
  if (!k.service_account().empty() && !DnsSubdomain(k.service_account())) {
    return Invalid("kubernetes.service_account", absl::StrCat("'", k.service_account(), "' is not a name"));
  }
  if (k.network_interface().find_first_of(" \t\n\"'$") != std::string::npos) {
    return Invalid("kubernetes.network_interface", absl::StrCat("'", k.network_interface(), "' has spaces or quotes"));
  }
  if (k.start_timeout_seconds() < 0) {
    return Invalid("kubernetes.start_timeout_seconds", absl::StrCat(k.start_timeout_seconds(), " < 0"));
  }
  for (const auto& [field, n] : {std::pair<const char*, int>{"rollout_workers", c.rollout_workers()},
                                 {"reward_servers", c.reward_servers()},
                                 {"learners", c.learners()}}) {
    if (n < 0 || n > 64) return Invalid(field, absl::StrCat(n, " not in [0, 64] (0 = 1)"));
  }
  // Ports: in range, and distinct (they are one pod's each, but one
  // NetworkPolicy or port-forward per port reads better, and the
  // coordinator's Service must not shadow a role's).
  std::set<int> ports = {CoordinatorPort(c)};
  if (c.coordinator_port() < 0 || c.coordinator_port() > 65535) {
    return Invalid("coordinator_port", absl::StrCat(c.coordinator_port(), " not in 1..65535"));
  }
  const std::pair<const char*, int> role_ports[] = {{"kubernetes.replay_buffer_port", k.replay_buffer_port()},
                                                    {"kubernetes.reward_server_port", k.reward_server_port()},
                                                    {"kubernetes.rollout_worker_port", k.rollout_worker_port()},
                                                    {"kubernetes.learner_port", k.learner_port()}};
  const std::vector<RoleSet> sets = RoleSets(c);
  for (size_t i = 0; i < sets.size(); ++i) {
    const auto& [field, given] = role_ports[i];
    if (given < 0 || given > 65535) return Invalid(field, absl::StrCat(given, " not in 1..65535"));
    if (!ports.insert(sets[i].port).second) {
      return Invalid(field, absl::StrCat(sets[i].port, " is already another role's or the coordinator's port"));
    }
  }
  RLMESH_RETURN_IF_ERROR(ValidateResources("kubernetes.coordinator_resources", k.coordinator_resources()));
  RLMESH_RETURN_IF_ERROR(ValidateResources("kubernetes.replay_buffer_resources", k.replay_buffer_resources()));
  RLMESH_RETURN_IF_ERROR(ValidateResources("kubernetes.reward_server_resources", k.reward_server_resources()));
  RLMESH_RETURN_IF_ERROR(ValidateResources("kubernetes.rollout_worker_resources", k.rollout_worker_resources()));
  RLMESH_RETURN_IF_ERROR(ValidateResources("kubernetes.learner_resources", k.learner_resources()));
  RLMESH_RETURN_IF_ERROR(ValidatePath(c, "run_dir", c.run_dir()));
  RLMESH_RETURN_IF_ERROR(ValidatePath(c, "buffer_path", c.buffer_path()));
  const std::string tokenizer = Or(c.tokenizer(), "char");
  if (tokenizer != "char" && tokenizer[0] != '/') {
    return Invalid("tokenizer", absl::StrCat("'", tokenizer, "' must be \"char\" or an absolute path inside the "
                                             "pods (in the image, or under kubernetes.mount_path)"));
  }
  if (c.tls().cert_file().empty() != c.tls().key_file().empty()) {
    return Invalid("tls.cert_file and tls.key_file", "set both or neither");
  }
  if (c.tls().mutual() && (c.tls().cert_file().empty() || c.tls().root_cert_file().empty())) {
    return Invalid("tls.mutual", "needs tls.cert_file, tls.key_file and tls.root_cert_file");
  }
  return absl::OkStatus();
}

namespace {

// The auth token and TLS Secrets the configuration names, through `add`.
absl::Status AddSecrets(const ClusterConfig& c, const K8sSecretFiles& secrets,
                        const std::function<void(const Json&)>& add) {
  if (!c.auth_token_file().empty()) {
    if (secrets.auth_token.empty()) return Invalid("auth_token_file", "configured but its contents were not read");
    add({{"apiVersion", "v1"},
         {"kind", "Secret"},
         {"metadata", Metadata(c, kAuthSecret, "auth")},
         {"type", "Opaque"},
         {"data", {{"token", Base64(secrets.auth_token)}}}});
  }
  if (HasTls(c)) {
    Json data = Json::object();
    if (!c.tls().cert_file().empty()) {
      if (secrets.tls_cert.empty() || secrets.tls_key.empty()) {
        return Invalid("tls.cert_file", "configured but its contents (or tls.key_file's) were not read");
      }
      data["tls.crt"] = Base64(secrets.tls_cert);
      data["tls.key"] = Base64(secrets.tls_key);
    }
    if (!c.tls().root_cert_file().empty()) {
      if (secrets.tls_root_cert.empty()) return Invalid("tls.root_cert_file", "configured but its contents were not read");
      data["ca.crt"] = Base64(secrets.tls_root_cert);
    }
    add({{"apiVersion", "v1"},
         {"kind", "Secret"},
         {"metadata", Metadata(c, kTlsSecret, "tls")},
         {"type", "Opaque"},
         {"data", data}});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<K8sManifest>> RenderKubernetes(const ClusterConfig& c, const K8sSecretFiles& secrets) {
  RLMESH_RETURN_IF_ERROR(ValidateKubernetesCluster(c));
  const KubernetesConfig& k = c.kubernetes();
  const ClusterConfig pod = PodClusterConfig(c);
  std::vector<K8sManifest> out;
  absl::Status written;  // the first object that could not be written, if any
  auto add = [&](const Json& object) {
    const std::string kind = object["kind"].get<std::string>();
    const std::string name = object["metadata"]["name"].get<std::string>();
    absl::StatusOr<std::string> yaml = ToYaml(object);
    if (!yaml.ok()) {
      written.Update(yaml.status());
      return;
    }
    out.push_back({kind, name, FileName(static_cast<int>(out.size()), name, kind), *std::move(yaml)});
  };

  if (k.create_namespace()) {
    add({{"apiVersion", "v1"},
         {"kind", "Namespace"},
         {"metadata", {{"name", Namespace(c)}, {"labels", {{"app.kubernetes.io/name", kApp}}}}}});
  }
  RLMESH_RETURN_IF_ERROR(AddSecrets(c, secrets, add));
  {
    google::protobuf::util::JsonPrintOptions json;
    json.preserve_proto_field_names = true;
    json.add_whitespace = true;
    std::string text;
    if (!google::protobuf::util::MessageToJsonString(pod, &text, json).ok()) {
      return absl::InternalError("cannot print the pods' cluster config");
    }
    while (!text.empty() && text.back() == '\n') text.pop_back();
    add({{"apiVersion", "v1"},
         {"kind", "ConfigMap"},
         {"metadata", Metadata(c, kClusterMap, kCoordinator)},
         {"data", {{"cluster.yaml", "# The cluster as the coordinator's pod reads it (JSON is YAML).\n" + text}}}});
  }
  if (k.existing_claim().empty()) {
    Json spec = {{"accessModes", Json::array({"ReadWriteMany"})},
                 {"resources", {{"requests", {{"storage", pod.kubernetes().storage_size()}}}}}};
    if (!k.storage_class().empty()) spec["storageClassName"] = k.storage_class();
    add({{"apiVersion", "v1"},
         {"kind", "PersistentVolumeClaim"},
         {"metadata", Metadata(c, kClaim, "runs")},
         {"spec", spec}});
  }

  // The coordinator: one replica, never two at once (Recreate), behind a
  // ClusterIP Service the roles register at.
  std::vector<std::string> command = {RoleBinary(BinDir(c), ROLE_COORDINATOR), "launch",
                                      absl::StrCat("--cluster=", kK8sClusterDir, "/cluster.yaml"), "--bind=0.0.0.0",
                                      absl::StrCat("--port=", CoordinatorPort(c))};
  if (!pod.auth_token_file().empty()) command.push_back("--auth_token_file=" + pod.auth_token_file());
  Json coordinator = Container(c, kCoordinator, command, CoordinatorPort(c), k.coordinator_resources());
  coordinator["volumeMounts"].push_back({{"name", "cluster"}, {"mountPath", kK8sClusterDir}, {"readOnly", true}});
  Json coordinator_pod = PodSpec(c, std::move(coordinator));
  coordinator_pod["volumes"].push_back({{"name", "cluster"}, {"configMap", {{"name", kClusterMap}}}});
  add({{"apiVersion", "v1"},
       {"kind", "Service"},
       {"metadata", Metadata(c, kCoordinator, kCoordinator)},
       {"spec",
        {{"type", "ClusterIP"},
         {"selector", Selector(c, kCoordinator)},
         {"ports", Json::array({{{"name", "grpc"}, {"port", CoordinatorPort(c)}, {"targetPort", "grpc"},
                                 {"protocol", "TCP"}}})}}}});
  add({{"apiVersion", "apps/v1"},
       {"kind", "Deployment"},
       {"metadata", Metadata(c, kCoordinator, kCoordinator)},
       {"spec",
        {{"replicas", 1},
         {"strategy", {{"type", "Recreate"}}},
         {"selector", {{"matchLabels", Selector(c, kCoordinator)}}},
         {"template", {{"metadata", {{"labels", Labels(c, kCoordinator)}}}, {"spec", coordinator_pod}}}}}});

  for (const RoleSet& s : RoleSets(c)) {
    // Headless: no virtual IP, one DNS record per pod, published before the
    // pod is ready (a role registers, and is dialled, while it starts).
    add({{"apiVersion", "v1"},
         {"kind", "Service"},
         {"metadata", Metadata(c, s.set, s.component)},
         {"spec",
          {{"clusterIP", "None"},
           {"publishNotReadyAddresses", true},
           {"selector", Selector(c, s.component)},
           {"ports", Json::array({{{"name", "grpc"}, {"port", s.port}, {"targetPort", "grpc"}, {"protocol", "TCP"}}})}}}});
    Json container = Container(c, s.set, RoleContainerCommand(c, s), s.port, *s.resources);
    add({{"apiVersion", "apps/v1"},
         {"kind", "StatefulSet"},
         {"metadata", Metadata(c, s.set, s.component)},
         {"spec",
          {{"serviceName", s.set},
           {"replicas", s.replicas},
           // Every pod at once: the roles wait for each other by retrying,
           // not by start order.
           {"podManagementPolicy", "Parallel"},
           {"selector", {{"matchLabels", Selector(c, s.component)}}},
           {"template", {{"metadata", {{"labels", Labels(c, s.component)}}}, {"spec", PodSpec(c, container)}}}}}});
  }
  RLMESH_RETURN_IF_ERROR(written);
  return out;
}

std::string JoinManifests(const std::vector<K8sManifest>& manifests) {
  std::string out;
  for (const auto& m : manifests) absl::StrAppend(&out, "---\n", m.yaml);
  return out;
}

}  // namespace rlmesh
