#!/bin/bash
# Runs examples/rewards/contains_answer.py through the reward server's
# command-verifier protocol (see contains_answer_test.py).
set -euo pipefail
PY="${RLMESH_PYTHON:-python3}"
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PY" "$ROOT/examples/contains_answer_test.py" "$ROOT" "$ROOT/reward_server/reward_server" "$TEST_TMPDIR/work"
