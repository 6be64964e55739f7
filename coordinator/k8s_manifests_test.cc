#include "coordinator/k8s_manifests.h"

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/proto_yaml.h"
#include "common/testing/test_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "yaml-cpp/yaml.h"

namespace rlmesh {
namespace {

ClusterConfig Shipped() {
  ClusterConfig c;
  YamlSource src;
  absl::Status s = LoadYamlFile(testing::Runfile("configs/k8s_cluster.yaml"), &c, &src);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return c;
}

ClusterConfig Minimal() {
  ClusterConfig c;
  c.set_name("t");
  c.set_launcher("kubernetes");
  c.mutable_kubernetes()->set_image("img:1");
  return c;
}

// The rendered documents, parsed back, by "Kind/name".
std::map<std::string, YAML::Node> Parse(const std::vector<K8sManifest>& manifests) {
  std::map<std::string, YAML::Node> docs;
  const std::vector<YAML::Node> all = YAML::LoadAll(JoinManifests(manifests));
  REQUIRE(all.size() == manifests.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const YAML::Node& d = all[i];
    REQUIRE(d["apiVersion"].IsScalar());
    const std::string key = d["kind"].as<std::string>() + "/" + d["metadata"]["name"].as<std::string>();
    CHECK(key == manifests[i].kind + "/" + manifests[i].name);
    CHECK(docs.emplace(key, d).second);  // no object twice
  }
  return docs;
}

std::map<std::string, YAML::Node> Render(const ClusterConfig& c, const K8sSecretFiles& secrets = {}) {
  auto m = RenderKubernetes(c, secrets);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return Parse(*m);
}

std::vector<std::string> Command(const YAML::Node& workload) {
  return workload["spec"]["template"]["spec"]["containers"][0]["command"].as<std::vector<std::string>>();
}

bool HasArg(const std::vector<std::string>& argv, const std::string& arg) {
  for (const auto& a : argv) {
    if (a == arg) return true;
  }
  return false;
}

// Every label the selector asks for is on `labels` with the same value.
bool Selects(const YAML::Node& selector, const YAML::Node& labels) {
  if (!selector.IsMap() || selector.size() == 0) return false;
  for (const auto& kv : selector) {
    const std::string k = kv.first.as<std::string>();
    if (!labels[k] || labels[k].as<std::string>() != kv.second.as<std::string>()) return false;
  }
  return true;
}

std::set<std::string> Names(const YAML::Node& list) {
  std::set<std::string> out;
  for (const auto& item : list) out.insert(item["name"].as<std::string>());
  return out;
}

TEST_CASE("the shipped cluster renders a coordinator, one StatefulSet and headless Service per role, one RWX claim") {
  const ClusterConfig c = Shipped();
  const auto docs = Render(c);
  CHECK(docs.count("Namespace/rlmesh") == 1);
  CHECK(docs.count("ConfigMap/rlmesh-cluster") == 1);
  CHECK(docs.count("Secret/rlmesh-auth") == 0);  // no auth_token_file
  REQUIRE(docs.count("PersistentVolumeClaim/rlmesh-runs") == 1);
  const YAML::Node& claim = docs.at("PersistentVolumeClaim/rlmesh-runs");
  CHECK(claim["spec"]["accessModes"][0].as<std::string>() == "ReadWriteMany");
  CHECK(claim["spec"]["resources"]["requests"]["storage"].as<std::string>() == "100Gi");
  for (const auto& [key, d] : docs) {
    if (key != "Namespace/rlmesh") CHECK(d["metadata"]["namespace"].as<std::string>() == "rlmesh");
  }

  // The coordinator: a Service whose selector picks the Deployment's pods,
  // on the port the Deployment serves.
  REQUIRE(docs.count("Deployment/coordinator") == 1);
  REQUIRE(docs.count("Service/coordinator") == 1);
  const YAML::Node& dep = docs.at("Deployment/coordinator");
  const YAML::Node& svc = docs.at("Service/coordinator");
  CHECK(dep["spec"]["replicas"].as<int>() == 1);
  CHECK(Selects(dep["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"]));
  CHECK(Selects(svc["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"]));
  CHECK(svc["spec"]["ports"][0]["port"].as<int>() == 7401);
  CHECK(dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"].as<int>() == 7401);
  const auto coord = Command(dep);
  CHECK(coord[0] == "/opt/rlmesh/bin/coordinator/coordinator");
  CHECK(coord[1] == "launch");
  CHECK(HasArg(coord, "--cluster=/etc/rlmesh/cluster/cluster.yaml"));
  CHECK(HasArg(coord, "--port=7401"));
  CHECK(Names(dep["spec"]["template"]["spec"]["volumes"]) == std::set<std::string>{"runs", "cluster"});
  CHECK(dep["spec"]["template"]["spec"]["volumes"][1]["configMap"]["name"].as<std::string>() == "rlmesh-cluster");

  struct Want {
    std::string set, binary;
    int replicas, port, gpus;
  };
  for (const Want& w : {Want{"replay-buffer", "replay_buffer/replay_buffer", 1, 7402, 0},
                        Want{"reward", "reward_server/reward_server", 1, 7403, 0},
                        Want{"rollout", "rollout/rollout_worker", 2, 7404, 1},
                        Want{"learner", "learner/learner", 2, 7405, 1}}) {
    INFO("role " << w.set);
    REQUIRE(docs.count("StatefulSet/" + w.set) == 1);
    REQUIRE(docs.count("Service/" + w.set) == 1);
    const YAML::Node& sts = docs.at("StatefulSet/" + w.set);
    const YAML::Node& headless = docs.at("Service/" + w.set);
    const YAML::Node pod_labels = sts["spec"]["template"]["metadata"]["labels"];
    CHECK(sts["spec"]["replicas"].as<int>() == w.replicas);
    CHECK(sts["spec"]["serviceName"].as<std::string>() == w.set);
    CHECK(Selects(sts["spec"]["selector"]["matchLabels"], pod_labels));
    CHECK(headless["spec"]["clusterIP"].as<std::string>() == "None");
    CHECK(headless["spec"]["publishNotReadyAddresses"].as<bool>());
    CHECK(Selects(headless["spec"]["selector"], pod_labels));
    // No other role's Service selects these pods.
    CHECK_FALSE(Selects(svc["spec"]["selector"], pod_labels));
    CHECK(headless["spec"]["ports"][0]["port"].as<int>() == w.port);
    // Plain ints, not "7404" strings.
    CHECK(headless["spec"]["ports"][0]["port"].Tag() == "?");
    const YAML::Node container = sts["spec"]["template"]["spec"]["containers"][0];
    CHECK(container["image"].as<std::string>() == "registry.example.com/rlmesh:latest");
    CHECK(container["ports"][0]["containerPort"].as<int>() == w.port);
    const auto argv = Command(sts);
    CHECK(argv[0] == "/opt/rlmesh/bin/" + w.binary);
    CHECK(HasArg(argv, absl::StrCat("--port=", w.port)));
    CHECK(HasArg(argv, "--bind=0.0.0.0"));
    CHECK(HasArg(argv, "--coordinator=coordinator.rlmesh.svc.cluster.local:7401"));
    CHECK(HasArg(argv, absl::StrCat("--advertise_address=$(POD_NAME).", w.set, ".rlmesh.svc.cluster.local:", w.port)));
    CHECK(container["env"][0]["name"].as<std::string>() == "POD_NAME");
    CHECK(container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>() == "metadata.name");
    // The shared volume, at the mount path, from the claim.
    CHECK(container["volumeMounts"][0]["mountPath"].as<std::string>() == "/rlmesh");
    CHECK(sts["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"].as<std::string>() ==
          "rlmesh-runs");
    const YAML::Node limits = container["resources"]["limits"];
    if (w.gpus > 0) {
      CHECK(limits["nvidia.com/gpu"].as<int>() == w.gpus);
    } else {
      CHECK_FALSE(limits["nvidia.com/gpu"]);
    }
    CHECK(limits["cpu"].Tag() == "!");  // "8" stays a string
  }
  const auto buffer = Command(docs.at("StatefulSet/replay-buffer"));
  CHECK(HasArg(buffer, "--instance_name=replay_buffer"));
  CHECK(HasArg(buffer, "--db_path=/rlmesh/runs/rlmesh/replay_buffer"));
  const auto rollout = Command(docs.at("StatefulSet/rollout"));
  CHECK(HasArg(rollout, "--instance_name=$(POD_NAME)"));
  CHECK(HasArg(rollout, "--name=$(POD_NAME)"));
  CHECK(HasArg(rollout, "--threads=8"));
  CHECK(HasArg(rollout, "--tokenizer=char"));
  CHECK(HasArg(rollout, "--replay_buffer=replay-buffer-0.replay-buffer.rlmesh.svc.cluster.local:7402"));
  CHECK(HasArg(rollout, "--reward_server=reward-0.reward.rlmesh.svc.cluster.local:7403"));
  const auto learner = Command(docs.at("StatefulSet/learner"));
  CHECK(HasArg(learner, "--name=$(POD_NAME)"));
  CHECK(HasArg(learner, "--advertise_address=$(POD_NAME).learner.rlmesh.svc.cluster.local:7405"));
}

TEST_CASE("the coordinator's ConfigMap is a cluster YAML that loads back to the pods' view of the cluster") {
  ClusterConfig c = Shipped();
  c.set_auth_token_file("secrets/token");
  c.mutable_tls()->set_root_cert_file("/home/me/ca.pem");
  K8sSecretFiles files;
  files.auth_token = "s3cret\n";
  files.tls_root_cert = "CA";
  const auto docs = Render(c, files);
  const std::string text = docs.at("ConfigMap/rlmesh-cluster")["data"]["cluster.yaml"].as<std::string>();
  ClusterConfig loaded;
  YamlSource src;
  absl::Status s = MergeYaml(text, &loaded, &src);
  INFO(text << "\n" << s.ToString());
  REQUIRE(s.ok());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(loaded, PodClusterConfig(c)));
  CHECK(ValidateKubernetesCluster(loaded).ok());
  CHECK(loaded.run_dir() == "/rlmesh/runs/rlmesh");
  CHECK(loaded.auth_token_file() == "/etc/rlmesh/auth/token");
  CHECK(loaded.tls().root_cert_file() == "/etc/rlmesh/tls/ca.crt");
  CHECK(loaded.kubernetes().learner_port() == 7405);
  CHECK(KubernetesRoleNames(loaded) ==
        std::vector<std::string>{"replay_buffer", "reward-0", "rollout-0", "rollout-1", "learner-0", "learner-1"});
  CHECK(KubernetesCoordinatorAddress(loaded) == "coordinator.rlmesh.svc.cluster.local:7401");
}

TEST_CASE("auth and TLS become Secrets, mounted on every pod at the paths the flags name") {
  ClusterConfig c = Minimal();
  c.set_auth_token_file("/home/me/token");
  c.mutable_tls()->set_cert_file("/home/me/cert.pem");
  c.mutable_tls()->set_key_file("/home/me/key.pem");
  c.mutable_tls()->set_root_cert_file("/home/me/ca.pem");
  c.mutable_tls()->set_mutual(true);
  const auto docs = Render(c, {"tok", "CERT", "KEY", "CA"});
  REQUIRE(docs.count("Secret/rlmesh-auth") == 1);
  REQUIRE(docs.count("Secret/rlmesh-tls") == 1);
  auto decoded = [&](const std::string& secret, const std::string& key) {
    std::string out;
    REQUIRE(absl::Base64Unescape(docs.at(secret)["data"][key].as<std::string>(), &out));
    return out;
  };
  CHECK(decoded("Secret/rlmesh-auth", "token") == "tok");
  CHECK(decoded("Secret/rlmesh-tls", "tls.crt") == "CERT");
  CHECK(decoded("Secret/rlmesh-tls", "tls.key") == "KEY");
  CHECK(decoded("Secret/rlmesh-tls", "ca.crt") == "CA");
  int workloads = 0;
  for (const auto& [key, d] : docs) {
    if (!absl::StartsWith(key, "StatefulSet/") && !absl::StartsWith(key, "Deployment/")) continue;
    INFO(key);
    ++workloads;
    const YAML::Node pod = d["spec"]["template"]["spec"];
    std::map<std::string, std::string> secret_of;  // volume -> secret
    for (const auto& v : pod["volumes"]) {
      if (v["secret"]) secret_of[v["name"].as<std::string>()] = v["secret"]["secretName"].as<std::string>();
    }
    CHECK(secret_of == std::map<std::string, std::string>{{"auth", "rlmesh-auth"}, {"tls", "rlmesh-tls"}});
    std::map<std::string, std::string> mount_of;
    for (const auto& m : pod["containers"][0]["volumeMounts"]) {
      mount_of[m["name"].as<std::string>()] = m["mountPath"].as<std::string>();
    }
    CHECK(mount_of["auth"] == "/etc/rlmesh/auth");
    CHECK(mount_of["tls"] == "/etc/rlmesh/tls");
    const auto argv = Command(d);
    if (key == "Deployment/coordinator") {
      // The coordinator takes TLS from the ConfigMap's tls block.
      CHECK(HasArg(argv, "--auth_token_file=/etc/rlmesh/auth/token"));
      continue;
    }
    CHECK(HasArg(argv, "--auth_token_file=/etc/rlmesh/auth/token"));
    CHECK(HasArg(argv, "--tls_cert=/etc/rlmesh/tls/tls.crt"));
    CHECK(HasArg(argv, "--tls_key=/etc/rlmesh/tls/tls.key"));
    CHECK(HasArg(argv, "--tls_root_cert=/etc/rlmesh/tls/ca.crt"));
    CHECK(HasArg(argv, "--tls_mutual"));
  }
  CHECK(workloads == 5);
  // A configured file whose contents the caller did not pass is refused.
  auto missing = RenderKubernetes(c, {"", "CERT", "KEY", "CA"});
  CHECK(missing.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(missing.status().message(), "auth_token_file"));
}

TEST_CASE("rollout workers pick reward server ordinal mod count; existing claims and pull secrets are used") {
  ClusterConfig c = Minimal();
  c.set_rollout_workers(3);
  c.set_reward_servers(2);
  c.mutable_kubernetes()->set_existing_claim("shared-nfs");
  c.mutable_kubernetes()->add_image_pull_secrets("regcred");
  c.mutable_kubernetes()->set_network_interface("eth0");
  const auto docs = Render(c);
  CHECK(docs.count("PersistentVolumeClaim/rlmesh-runs") == 0);
  CHECK(docs.count("Namespace/rlmesh") == 0);
  CHECK(docs.at("StatefulSet/reward")["spec"]["replicas"].as<int>() == 2);
  const auto argv = Command(docs.at("StatefulSet/rollout"));
  REQUIRE(argv.size() > 3);
  CHECK(argv[0] == "/bin/sh");
  CHECK(argv[1] == "-c");
  // $$ is the kubelet's escape for $: the shell sees ${POD_NAME##*-} % 2.
  CHECK(argv[2] ==
        "exec \"$$0\" \"$$@\" --reward_server=reward-$$(( $${POD_NAME##*-} % 2 )).reward.rlmesh.svc.cluster.local:7403");
  CHECK(argv[3] == "/opt/rlmesh/bin/rollout/rollout_worker");
  for (const auto& a : argv) CHECK_FALSE(absl::StartsWith(a, "--reward_server="));
  CHECK(HasArg(argv, "--replay_buffer=replay-buffer-0.replay-buffer.rlmesh.svc.cluster.local:7402"));
  const YAML::Node pod = docs.at("StatefulSet/learner")["spec"]["template"]["spec"];
  CHECK(pod["volumes"][0]["persistentVolumeClaim"]["claimName"].as<std::string>() == "shared-nfs");
  CHECK(pod["imagePullSecrets"][0]["name"].as<std::string>() == "regcred");
  std::map<std::string, std::string> env;
  for (const auto& e : pod["containers"][0]["env"]) {
    if (e["value"]) env[e["name"].as<std::string>()] = e["value"].as<std::string>();
  }
  CHECK(env["GLOO_SOCKET_IFNAME"] == "eth0");
  CHECK(env["NCCL_SOCKET_IFNAME"] == "eth0");
  CHECK(KubernetesRoleNames(c) == std::vector<std::string>{"replay_buffer", "reward-0", "reward-1", "rollout-0",
                                                           "rollout-1", "rollout-2", "learner-0"});
}

// yaml-cpp tags a quoted scalar "!" (a string whatever it reads like) and a
// plain one "?" (resolved by its form: 8 is an int, true a bool).
bool QuotedString(const YAML::Node& n) { return n.IsScalar() && n.Tag() == "!"; }
bool PlainScalar(const YAML::Node& n) { return n.IsScalar() && n.Tag() == "?"; }

TEST_CASE("strings that read like numbers, bools or nulls stay strings; numbers and bools stay plain") {
  ClusterConfig c = Minimal();
  c.set_name("1234");
  c.mutable_kubernetes()->set_namespace_("true");
  c.mutable_kubernetes()->set_network_interface("null");
  c.mutable_kubernetes()->set_service_account("yes");
  c.mutable_kubernetes()->mutable_learner_resources()->set_cpu("8");
  c.mutable_kubernetes()->mutable_learner_resources()->set_gpus(2);
  const auto docs = Render(c);
  for (const auto& [key, d] : docs) {
    INFO(key);
    CHECK(QuotedString(d["apiVersion"]));
    CHECK(QuotedString(d["metadata"]["name"]));
    if (d["kind"].as<std::string>() == "Namespace") continue;
    CHECK(QuotedString(d["metadata"]["namespace"]));
    CHECK(d["metadata"]["namespace"].as<std::string>() == "true");
    CHECK(QuotedString(d["metadata"]["labels"]["app.kubernetes.io/instance"]));
    CHECK(d["metadata"]["labels"]["app.kubernetes.io/instance"].as<std::string>() == "1234");
  }
  const YAML::Node sts = docs.at("StatefulSet/learner");
  CHECK(PlainScalar(sts["spec"]["replicas"]));
  CHECK(sts["spec"]["replicas"].as<int>() == 1);
  const YAML::Node pod = sts["spec"]["template"]["spec"];
  CHECK(QuotedString(pod["serviceAccountName"]));
  CHECK(pod["serviceAccountName"].as<std::string>() == "yes");
  const YAML::Node container = pod["containers"][0];
  std::map<std::string, YAML::Node> env;
  for (const auto& e : container["env"]) {
    if (e["value"]) env.emplace(e["name"].as<std::string>(), e["value"]);
  }
  REQUIRE(env.count("GOMP_SPINCOUNT") == 1);
  CHECK(QuotedString(env["GOMP_SPINCOUNT"]));
  CHECK(env["GOMP_SPINCOUNT"].as<std::string>() == "1000");
  REQUIRE(env.count("GLOO_SOCKET_IFNAME") == 1);
  CHECK(QuotedString(env["GLOO_SOCKET_IFNAME"]));
  CHECK(env["GLOO_SOCKET_IFNAME"].as<std::string>() == "null");
  CHECK(QuotedString(container["resources"]["requests"]["cpu"]));
  CHECK(container["resources"]["requests"]["cpu"].as<std::string>() == "8");
  CHECK(PlainScalar(container["resources"]["limits"]["nvidia.com/gpu"]));
  CHECK(container["resources"]["limits"]["nvidia.com/gpu"].as<int>() == 2);
  CHECK(PlainScalar(container["ports"][0]["containerPort"]));
  CHECK(container["ports"][0]["containerPort"].as<int>() == 7405);
  const YAML::Node headless = docs.at("Service/learner");
  CHECK(PlainScalar(headless["spec"]["publishNotReadyAddresses"]));
  CHECK(headless["spec"]["publishNotReadyAddresses"].as<bool>());
  // The ConfigMap's text reads back byte for byte, its trailing characters
  // included.
  const YAML::Node text = docs.at("ConfigMap/rlmesh-cluster")["data"]["cluster.yaml"];
  CHECK(QuotedString(text));
  CHECK(absl::StartsWith(text.as<std::string>(), "# The cluster as the coordinator's pod reads it (JSON is YAML).\n{"));
  CHECK(absl::EndsWith(text.as<std::string>(), "\n}"));
}

TEST_CASE("configs that cannot be rendered are refused naming the field") {
  struct Case {
    std::string field;
    std::function<void(ClusterConfig*)> edit;
  };
  const std::vector<Case> cases = {
      {"launcher", [](ClusterConfig* c) { c->set_launcher("slurm"); }},
      {"kubernetes.image", [](ClusterConfig* c) { c->mutable_kubernetes()->clear_image(); }},
      {"kubernetes.namespace", [](ClusterConfig* c) { c->mutable_kubernetes()->set_namespace_("RL_Mesh"); }},
      {"name", [](ClusterConfig* c) { c->set_name("has space"); }},
      {"kubernetes.image_pull_policy", [](ClusterConfig* c) { c->mutable_kubernetes()->set_image_pull_policy("Sometimes"); }},
      {"kubernetes.storage_size", [](ClusterConfig* c) { c->mutable_kubernetes()->set_storage_size("lots"); }},
      {"kubernetes.mount_path", [](ClusterConfig* c) { c->mutable_kubernetes()->set_mount_path("data"); }},
      {"kubernetes.learner_port", [](ClusterConfig* c) { c->mutable_kubernetes()->set_learner_port(7401); }},
      {"kubernetes.reward_server_port", [](ClusterConfig* c) { c->mutable_kubernetes()->set_reward_server_port(70000); }},
      {"kubernetes.learner_resources.memory",
       [](ClusterConfig* c) { c->mutable_kubernetes()->mutable_learner_resources()->set_memory("16 GB"); }},
      {"kubernetes.rollout_worker_resources.gpus",
       [](ClusterConfig* c) { c->mutable_kubernetes()->mutable_rollout_worker_resources()->set_gpus(-1); }},
      {"run_dir", [](ClusterConfig* c) { c->set_run_dir("/scratch/runs"); }},
      {"buffer_path", [](ClusterConfig* c) { c->set_buffer_path("/var/lib/buffer"); }},
      {"tokenizer", [](ClusterConfig* c) { c->set_tokenizer("configs/data/tok.json"); }},
      {"learners", [](ClusterConfig* c) { c->set_learners(65); }},
      {"kubernetes.start_timeout_seconds", [](ClusterConfig* c) { c->mutable_kubernetes()->set_start_timeout_seconds(-5); }},
      {"tls.mutual", [](ClusterConfig* c) { c->mutable_tls()->set_mutual(true); }},
  };
  REQUIRE(ValidateKubernetesCluster(Minimal()).ok());
  for (const Case& k : cases) {
    INFO("field " << k.field);
    ClusterConfig c = Minimal();
    k.edit(&c);
    const absl::Status s = ValidateKubernetesCluster(c);
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StartsWith(s.message(), k.field + ":"));
    CHECK(RenderKubernetes(c, {}).status().code() == absl::StatusCode::kInvalidArgument);
  }
  // Inside the mount is fine.
  ClusterConfig inside = Minimal();
  inside.set_run_dir("/rlmesh/exp");
  CHECK(ValidateKubernetesCluster(inside).ok());
}

}  // namespace
}  // namespace rlmesh
