#!/bin/bash
# Renders the Kubernetes manifests of configs/k8s_cluster.yaml (and of a
# variant with auth, TLS and two reward servers) with the coordinator and
# checks them with PyYAML (tests/k8s_manifests_test.py). No cluster needed.
set -euo pipefail
PY="${RLMESH_PYTHON:-python3}"
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PY" "$ROOT/tests/k8s_manifests_test.py" "$ROOT/coordinator/coordinator" "$ROOT/configs" "$TEST_TMPDIR/work"
