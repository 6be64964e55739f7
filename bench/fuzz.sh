#!/bin/bash
# Runs every libFuzzer target (fuzz/BUILD) for RUNS executions each, from
# its seed corpus, built with clang + ASan + UBSan in a separate output
# base; writes bench/fuzz.md with executions, crashes and new corpus sizes.
# The RPC targets (a loopback call and checks per input) run RPC_RUNS each.
#   bench/fuzz.sh [RUNS_PER_TARGET [RPC_RUNS_PER_TARGET [MAX_SECONDS_PER_TARGET]]]
#   (defaults 250000, 20000, 300)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-250000}"
RPC_RUNS="${2:-20000}"
# No target runs longer than this (the rollout target, a model per call,
# manages ~20 calls a second here).
MAX_SECONDS="${3:-300}"
# clang and libFuzzer's runtime, from Debian.
dpkg -s clang-14 libfuzzer-14-dev >/dev/null 2>&1 || apt-get install -y -q clang-14 libfuzzer-14-dev
OB="${RLMESH_FUZZ_OUTPUT_BASE:-$HOME/.cache/rlmesh/fuzz-output-base}"
TARGETS=(experiment_yaml hf_config tokenizer_json chat_template replay_store safetensors jsonl_datasets
         preference_pairs replay_buffer_rpc coordinator_rpc reward_rpc environment_rpc rollout_rpc learner_rpc)
bazel --output_base="$OB" build --config=fuzz $(printf '//fuzz:%s_fuzz ' "${TARGETS[@]}")
BIN="$(bazel --output_base="$OB" info --config=fuzz bazel-bin)/fuzz"
WORK="$(mktemp -d)"
REPORT=bench/fuzz.md
{
  echo "# Fuzzing"
  echo
  echo "libFuzzer (clang $(clang --version | head -1 | grep -o '[0-9][0-9.]*' | head -1)) with ASan + UBSan, $RUNS executions per target ($RPC_RUNS for the RPC targets, one loopback call and its checks each; no target longer than $MAX_SECONDS s) from the seed corpus in fuzz/corpus/, $(date -u +%Y-%m-%d) on this machine; \`bench/fuzz.sh\` makes this table."
  echo
  echo "| target | executions | crashes | seed inputs | corpus after | seconds |"
  echo "| --- | --- | --- | --- | --- | --- |"
} > "$REPORT.tmp"
total=0
crashes_total=0
for t in "${TARGETS[@]}"; do
  mkdir -p "$WORK/$t" "$WORK/$t-crashes"
  # The RPC targets: no per-input leak check. A call's work may outlive its
  # input on the server's threads (a cancelled call, a detached scorer),
  # which LeakSanitizer's per-input check reports as leaks, and libraries'
  # process-lifetime allocations (OpenSSL's, under the learner) show in the
  # check at exit; bench/soak.py is the leak check of the serving processes.
  corpus=$t runs=$RUNS leaks=1
  case $t in *_rpc) corpus=rpc runs=$RPC_RUNS leaks=0 ;; esac
  cp fuzz/corpus/$corpus/* "$WORK/$t/"
  seeds=$(ls fuzz/corpus/$corpus | wc -l)
  start=$(date +%s)
  set +e
  ASAN_OPTIONS="detect_leaks=$leaks" "$BIN/${t}_fuzz" -runs="$runs" -max_total_time="$MAX_SECONDS" -detect_leaks=$leaks -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$WORK/$t-crashes/" "$WORK/$t" > "$WORK/$t.log" 2>&1
  rc=$?
  set -e
  secs=$(( $(date +%s) - start ))
  execs=$(grep -o 'Done [0-9]* runs' "$WORK/$t.log" | grep -o '[0-9]*' || echo 0)
  crashes=$(ls "$WORK/$t-crashes" | wc -l)
  [ "$rc" = 0 ] || [ "$crashes" -gt 0 ] || crashes="rc=$rc"
  echo "| $t | ${execs:-0} | $crashes | $seeds | $(ls "$WORK/$t" | wc -l) | $secs |" >> "$REPORT.tmp"
  total=$(( total + ${execs:-0} ))
  if [ "$crashes" != 0 ]; then
    crashes_total=$(( crashes_total + 1 ))
    mkdir -p "bench/fuzz_crashes/$t" && cp "$WORK/$t-crashes/"* "bench/fuzz_crashes/$t/" 2>/dev/null || true
    tail -30 "$WORK/$t.log" > "bench/fuzz_crashes/$t/log.txt"
  fi
done
{
  echo
  echo "Total: $total executions; targets with a crash: $crashes_total (inputs, if any, in bench/fuzz_crashes/)."
  echo
  echo "## What the RPC targets' calls answered"
  echo
  echo "Status code per method over the run (0 OK, 3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, 5 NOT_FOUND, 8 RESOURCE_EXHAUSTED, 9 FAILED_PRECONDITION, 1 CANCELLED, 2 UNKNOWN, 13 INTERNAL), with the first message of each:"
  for t in "${TARGETS[@]}"; do
    case $t in *_rpc) ;; *) continue ;; esac
    echo
    echo "$t:"
    echo
    echo '```'
    grep -E '^  /' "$WORK/$t.log" | cut -c1-220 || true
    echo '```'
  done
} >> "$REPORT.tmp"
mv "$REPORT.tmp" "$REPORT"
cat "$REPORT"
