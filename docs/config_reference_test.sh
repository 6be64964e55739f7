#!/bin/bash
# docs/configuration.md must be what scripts/gen_config_reference.py writes
# from proto/config.proto (and proto/common.proto, which it imports).
set -euo pipefail
PY="${RLMESH_PYTHON:-python3}"
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PY" "$ROOT/docs/gen_config_reference.py" --root "$ROOT" --check "$ROOT/docs/configuration.md"
