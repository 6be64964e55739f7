#!/usr/bin/env bash
# The long chaos run: //tests:chaos_test with many more kills,
# 5-15 s apart, so one GRPO run sees every role SIGKILLed about 20 times.
# Appends one JSON line per run to the report file and prints it.
#
#   bench/chaos.sh [KILLS] [REPORT]      # defaults: 100, /tmp/chaos_report.jsonl
#
# Takes about KILLS x 10 s plus the SFT stage; not part of `bazel test //...`
# (the test target there runs 10 kills). The GRPO stage gets 30 steps per
# kill (about 10 s on an idle 2-core machine), so the kills come from
# the 5-15 s clock rather than from the test's step trigger. No undisturbed
# reference run (it would take as long again): the report gives the final
# accuracies, restarts, recovery times and the ledger's counts.
set -euo pipefail
cd "$(dirname "$0")/.."
kills=${1:-100}
report=${2:-/tmp/chaos_report.jsonl}
bazel test //tests:chaos_test --nocache_test_results --test_output=streamed \
  --test_timeout=14400 \
  --spawn_strategy=local \
  --test_env=RLMESH_CHAOS_KILLS="$kills" --test_env=RLMESH_CHAOS_STEPS=$((kills * 30 + 20)) \
  --test_env=RLMESH_CHAOS_MIN_S=5 --test_env=RLMESH_CHAOS_MAX_S=15 --test_env=RLMESH_CHAOS_REFERENCE=0 \
  --test_env=RLMESH_CHAOS_REPORT="$report" 2>&1 | grep -E '^chaos:|PASSED|FAILED|TIMEOUT'
tail -n 1 "$report"
