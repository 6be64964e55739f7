#!/usr/bin/env bash
# The long chaos run (issue 16): //tests:chaos_test with many more kills,
# 10-30 s apart, so one GRPO run sees every role SIGKILLed about 20 times.
# Appends one JSON line per run to the report file and prints it.
#
#   bench/chaos.sh [KILLS] [REPORT]      # defaults: 100, /tmp/chaos_report.jsonl
#
# Takes about KILLS x 20 s plus the SFT stage; not part of `bazel test //...`
# (the test target there runs 10 kills). The GRPO stage gets 60 steps per
# kill (about 20 s each on an idle 2-core machine), so the kills come from
# the 10-30 s clock rather than from the test's step trigger.
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-100}
report=${2:-/tmp/chaos_report.jsonl}
bazel test //tests:chaos_test --nocache_test_results --test_output=streamed \
  --test_timeout=14400 \
  --spawn_strategy=local \
  --test_env=RLMESH_CHAOS_KILLS="$kills" --test_env=RLMESH_CHAOS_STEPS=$((kills * 60 + 20)) \
  --test_env=RLMESH_CHAOS_MIN_S=10 --test_env=RLMESH_CHAOS_MAX_S=30 \
  --test_env=RLMESH_CHAOS_REPORT="$report" 2>&1 | grep -E '^chaos:|PASSED|FAILED|TIMEOUT'
tail -n 1 "$report"
