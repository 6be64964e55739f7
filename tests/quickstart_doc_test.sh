#!/bin/bash
# The commands of docs/quickstart.md, run as written (tests/quickstart_doc_test.py).
set -euo pipefail
PY="${RLMESH_PYTHON:-python3}"
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PY" "$ROOT/tests/quickstart_doc_test.py" "$ROOT" "$TEST_TMPDIR/work"
