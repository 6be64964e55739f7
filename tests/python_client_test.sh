#!/bin/bash
# Builds the Python client with pip (stubs generated from proto/ at build
# time) into a temporary folder, then runs python_client_test.py against
# real binaries.
set -euo pipefail
PY="${RLMESH_PYTHON:-python3}"
# The interpreter itself, not a pyenv shim (whose pip hook rehashes shims
# the sandbox cannot write).
PY="$("$PY" -c 'import sys; print(sys.executable)')"
export PIP_ROOT_USER_ACTION=ignore
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
SRC="$TEST_TMPDIR/src"
mkdir -p "$SRC"
cp -rL "$ROOT/python" "$ROOT/proto" "$SRC/"
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-index --no-deps \
  --target "$TEST_TMPDIR/site" "$SRC/python"
PYTHONPATH="$TEST_TMPDIR/site" exec "$PY" "$ROOT/tests/python_client_test.py" "$ROOT" "$TEST_TMPDIR/work"
