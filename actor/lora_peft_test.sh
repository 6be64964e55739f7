#!/bin/bash
# rlmesh's LoRA adapters against PyPI peft (actor/lora_peft_test.py).
set -euo pipefail
PY="${RLMESH_PYTHON:-python3}"
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PY" "$ROOT/actor/lora_peft_test.py" "$ROOT" "$TEST_TMPDIR/work"
