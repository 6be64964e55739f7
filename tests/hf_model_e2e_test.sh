#!/bin/bash
# A user's own Hugging Face folder, end to end, for Llama-3.2-style, Qwen2.5,
# Qwen3 and Qwen3-MoE folders: coordinator run, coordinator eval, and the
# output folder checked with transformers (tests/hf_model_e2e_test.py).
set -euo pipefail
PY="${RLMESH_PYTHON:-python3}"
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
exec "$PY" "$ROOT/tests/hf_model_e2e_test.py" "$ROOT" "$TEST_TMPDIR/work"
