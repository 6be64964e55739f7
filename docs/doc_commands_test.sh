#!/bin/bash
# The commands of README.md and docs/*.md, run as written or checked against
# the tests that run them (docs/doc_commands_test.py).
set -euo pipefail
PY="${RLMESH_PYTHON:-python3}"
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PY" "$ROOT/docs/doc_commands_test.py" "$ROOT" "$TEST_TMPDIR/work"
