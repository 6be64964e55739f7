#!/usr/bin/env bash
# Installs everything rlmesh needs on a fresh Debian 12 machine of this kind:
# Debian packages (Bazel, gRPC, Protobuf, Abseil, RocksDB, yaml-cpp, Catch2,
# ...) and, from PyPI, torch==2.11.0 (LibTorch for the build) plus the
# packages the tests use as references. Idempotent: when everything is
# present it only checks, in a few seconds. Loud on failure: the step that
# failed is named and the exit code is non-zero.
set -euo pipefail

step="start"
trap 'echo "rlmesh setup: FAILED during: $step" >&2' ERR
start=$(date +%s)
log() { echo "rlmesh setup: $*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# --- Debian packages -------------------------------------------------------
APT_PACKAGES=(
  bazel-bootstrap bazel-rules-java
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev librocksdb-dev libyaml-cpp-dev catch2 nlohmann-json3-dev
  libcpp-httplib-dev libssl-dev libicu-dev openssl g++ python3
  # TCMalloc, the learner's malloc (third_party/system.BUILD).
  libgoogle-perftools-dev
  # The dashboard's browser test (headless) and its HTTP checks.
  chromium curl
  # The hang detector (thread stacks of a stuck step).
  gdb
  # The thread-safety analysis (scripts/thread_safety.sh, --config=clang-tsa).
  clang
  # Slurm launcher (coordinator launch/run with launcher: slurm) and
  # //tests:slurm_e2e_test, which starts its own munged/slurmctld/slurmd;
  # iproute2 for that test's network namespaces.
  slurm-wlm munge iproute2
)
step="checking Debian packages"
missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  step="apt-get update"
  $SUDO apt-get update -qq
  step="apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  log "Debian packages present"
fi

# --- Python packages (PyPI) --------------------------------------------------
# The Python that has (or will have) torch: $RLMESH_PYTHON, else python3 on PATH
# (pyenv's 3.11 on these machines).
PY="${RLMESH_PYTHON:-python3}"
step="finding Python ($PY)"
command -v "$PY" >/dev/null || { echo "rlmesh setup: no $PY on PATH" >&2; exit 1; }
PY_PACKAGES=(
  "torch==2.11.0"
  "transformers==5.24.0"
  # LoRA tests: peft opens the adapters rlmesh saves (actor/lora_peft_test.py).
  "peft==0.21.2"
  "tokenizers==0.23.3"
  "safetensors==0.8.0"
  "grpcio==1.85.3"
  "grpcio-tools==1.85.1"
  "tensorboard==2.21.0"
  "numpy==2.4.6"
  # Building and using the Python client (python/): pip install ./python.
  "setuptools==81.0.0"
  "protobuf==7.36.2"
  "PyYAML==6.0.3"
)
step="checking Python packages"
if ! "$PY" - "${PY_PACKAGES[@]}" <<'PYEOF'
import sys
from importlib import metadata
bad = []
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or have.split("+")[0] != want:
        bad.append(f"{name} (have {have}, want {want})")
if bad:
    print("rlmesh setup: Python packages to install: " + ", ".join(bad))
    sys.exit(1)
PYEOF
then
  step="pip install ${PY_PACKAGES[*]}"
  "$PY" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
else
  log "Python packages present"
fi

step="checking that LibTorch is usable"
torch_dir=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
[ -f "$torch_dir/lib/libtorch_cpu.so" ] || { echo "rlmesh setup: $torch_dir/lib/libtorch_cpu.so missing" >&2; exit 1; }

mkdir -p "$HOME/.cache/rlmesh/bazel-disk"
log "ok in $(( $(date +%s) - start ))s (torch at $torch_dir)"
