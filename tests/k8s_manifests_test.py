"""Parses what `coordinator k8s` renders with PyYAML and checks that every
document is a well-formed Kubernetes object and that the objects refer to
each other correctly: selectors pick their pods, StatefulSets name a
headless Service, volumes name a claim/Secret/ConfigMap that is rendered,
every role's --coordinator is the coordinator Service, every wiring flag
names a pod that exists on the port it serves. No cluster is needed (none
is available here; kubectl is not installed).

usage: k8s_manifests_test.py COORDINATOR CONFIGS_DIR WORK_DIR
"""
import base64
import os
import re
import subprocess
import sys

import yaml

NAMESPACED = {"Secret", "ConfigMap", "PersistentVolumeClaim", "Service", "Deployment", "StatefulSet"}


def render(coordinator, *args):
    r = subprocess.run([coordinator, "k8s", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"coordinator k8s {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check(docs):
    """Checks one rendered set; returns {(kind, name): doc}."""
    objects = {}
    for d in docs:
        assert isinstance(d, dict), d
        for field in ("apiVersion", "kind", "metadata"):
            assert field in d, f"document without {field}: {d}"
        assert d["metadata"].get("name"), f"document without metadata.name: {d}"
        key = (d["kind"], d["metadata"]["name"])
        assert key not in objects, f"{key} rendered twice"
        objects[key] = d
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] in NAMESPACED}
    assert len(namespaces) == 1 and None not in namespaces, namespaces
    ns = namespaces.pop()
    if ("Namespace", ns) not in objects:
        assert not any(d["kind"] == "Namespace" for d in docs)

    services = {n: d for (k, n), d in objects.items() if k == "Service"}
    workloads = {(k, n): d for (k, n), d in objects.items() if k in ("Deployment", "StatefulSet")}
    assert ("Deployment", "coordinator") in workloads
    roles = {n for (k, n) in workloads if k == "StatefulSet"}
    assert roles == {"replay-buffer", "reward", "rollout", "learner"}, roles

    coord_svc = services["coordinator"]
    coord_port = coord_svc["spec"]["ports"][0]["port"]
    coord_address = f"coordinator.{ns}.svc.cluster.local:{coord_port}"
    # host -> port for every pod of every StatefulSet.
    pods = {}
    for (kind, name), w in workloads.items():
        spec = w["spec"]
        tmpl = spec["template"]
        labels = tmpl["metadata"]["labels"]
        assert selects(spec["selector"]["matchLabels"], labels), f"{name}: selector does not match its pods"
        pod = tmpl["spec"]
        (container,) = pod["containers"]
        assert container["image"], name
        port = container["ports"][0]
        assert isinstance(port["containerPort"], int), f"{name}: containerPort is not an int"
        # Every mount names a volume of the pod; every volume's source exists.
        volumes = {v["name"]: v for v in pod["volumes"]}
        for m in container["volumeMounts"]:
            assert m["name"] in volumes, f"{name}: mount {m['name']} has no volume"
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in objects, f"{name}: claim {claim} not rendered"
                assert objects[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"]
            if "secret" in v:
                assert ("Secret", v["secret"]["secretName"]) in objects, f"{name}: secret not rendered"
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in objects, f"{name}: configmap not rendered"
        env = {e["name"] for e in container.get("env", [])}
        for word in container["command"]:
            for var in re.findall(r"(?<!\$)\$\(([A-Z_]+)\)", word):
                assert var in env, f"{name}: $({var}) is not in the container's env"
        if kind == "StatefulSet":
            svc = services.get(spec["serviceName"])
            assert svc is not None, f"{name}: serviceName {spec['serviceName']} not rendered"
            assert svc["spec"]["clusterIP"] == "None", f"{name}: its Service is not headless"
            assert selects(svc["spec"]["selector"], labels), f"{name}: its Service does not select its pods"
            assert svc["spec"]["ports"][0]["port"] == port["containerPort"]
            assert svc["spec"]["ports"][0]["targetPort"] == port["name"]
            assert not selects(coord_svc["spec"]["selector"], labels)
            for i in range(spec["replicas"]):
                pods[f"{name}-{i}.{name}.{ns}.svc.cluster.local"] = port["containerPort"]
            cmd = container["command"]
            assert f"--coordinator={coord_address}" in cmd, f"{name}: --coordinator is not the coordinator Service"
            adv = [a for a in cmd if a.startswith("--advertise_address=")]
            assert adv == [f"--advertise_address=$(POD_NAME).{name}.{ns}.svc.cluster.local:{port['containerPort']}"], adv
        else:
            assert selects(coord_svc["spec"]["selector"], labels), "the coordinator Service misses its pod"
            assert port["containerPort"] == coord_port
    # Wiring names pods that exist, on their ports.
    for (kind, name), w in workloads.items():
        for word in w["spec"]["template"]["spec"]["containers"][0]["command"]:
            m = re.match(r"--(replay_buffer|reward_server)=([^:]+):(\d+)$", word)
            if m:
                assert pods.get(m.group(2)) == int(m.group(3)), f"{name}: {word} names no pod on that port"
            m = re.search(r"--reward_server=reward-\$\$\(\( .* % (\d+) \)\)\.reward\.", word)
            if m:
                assert objects[("StatefulSet", "reward")]["spec"]["replicas"] == int(m.group(1))
    return objects


def main():
    coordinator, configs, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)

    # The shipped config, on stdout and as files.
    shipped = os.path.join(configs, "k8s_cluster.yaml")
    docs = list(yaml.safe_load_all(render(coordinator, f"--cluster={shipped}").stdout))
    objects = check(docs)
    assert ("Namespace", "rlmesh") in objects
    gpus = {n: d["spec"]["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {}).get(
        "nvidia.com/gpu") for (k, n), d in objects.items() if k == "StatefulSet"}
    assert gpus == {"replay-buffer": None, "reward": None, "rollout": 1, "learner": 1}, gpus
    out = os.path.join(work, "out")
    render(coordinator, f"--cluster={shipped}", f"--out={out}")
    files = sorted(os.listdir(out))
    assert files[0].endswith("-namespace.yaml"), files
    from_files = [yaml.safe_load(open(os.path.join(out, f))) for f in files]
    assert from_files == docs, "--out wrote other documents than stdout printed"

    # Auth, TLS and two reward servers.
    for name, text in (("token", "s3cret\n"), ("cert.pem", "CERT"), ("key.pem", "KEY"), ("ca.pem", "CA")):
        with open(os.path.join(work, name), "w") as f:
            f.write(text)
    cluster = yaml.safe_load(open(shipped))
    cluster.update(reward_servers=2, rollout_workers=3, auth_token_file=os.path.join(work, "token"),
                   tls={"cert_file": os.path.join(work, "cert.pem"), "key_file": os.path.join(work, "key.pem"),
                        "root_cert_file": os.path.join(work, "ca.pem"), "mutual": True})
    cluster["kubernetes"]["create_namespace"] = False
    secured = os.path.join(work, "secured.yaml")
    with open(secured, "w") as f:
        yaml.safe_dump(cluster, f)
    r = render(coordinator, f"--cluster={secured}")
    assert "keep it out of version control" in r.stderr, r.stderr
    objects = check(list(yaml.safe_load_all(r.stdout)))
    assert ("Namespace", "rlmesh") not in objects
    assert base64.b64decode(objects[("Secret", "rlmesh-auth")]["data"]["token"]) == b"s3cret\n"
    assert set(objects[("Secret", "rlmesh-tls")]["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    for (kind, name), w in objects.items():
        if kind not in ("Deployment", "StatefulSet"):
            continue
        cmd = w["spec"]["template"]["spec"]["containers"][0]["command"]
        assert "--auth_token_file=/etc/rlmesh/auth/token" in cmd, name
        if kind == "StatefulSet":
            assert "--tls_root_cert=/etc/rlmesh/tls/ca.crt" in cmd and "--tls_mutual" in cmd, name
    rollout = objects[("StatefulSet", "rollout")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert rollout[:2] == ["/bin/sh", "-c"], rollout
    pod_cluster = yaml.safe_load(objects[("ConfigMap", "rlmesh-cluster")]["data"]["cluster.yaml"])
    assert pod_cluster["auth_token_file"] == "/etc/rlmesh/auth/token"
    assert pod_cluster["tls"]["cert_file"] == "/etc/rlmesh/tls/tls.crt"
    assert pod_cluster["reward_servers"] == 2

    # A broken config is refused naming the field.
    del cluster["kubernetes"]["image"]
    broken = os.path.join(work, "broken.yaml")
    with open(broken, "w") as f:
        yaml.safe_dump(cluster, f)
    r = subprocess.run([coordinator, "k8s", f"--cluster={broken}"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "kubernetes.image" in r.stderr, (r.returncode, r.stderr)
    print("k8s manifests: ok")


if __name__ == "__main__":
    main()
