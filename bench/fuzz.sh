#!/bin/bash
# Runs every libFuzzer target (fuzz/BUILD) for RUNS executions each, from
# its seed corpus, built with clang + ASan + UBSan in a separate output
# base; writes bench/fuzz.md with executions, crashes and new corpus sizes.
#   bench/fuzz.sh [RUNS_PER_TARGET]   (default 250000)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-250000}"
OB="${RLMESH_FUZZ_OUTPUT_BASE:-$HOME/.cache/rlmesh/fuzz-output-base}"
TARGETS=(experiment_yaml hf_config tokenizer_json chat_template replay_store)
bazel --output_base="$OB" build --config=fuzz $(printf '//fuzz:%s_fuzz ' "${TARGETS[@]}")
BIN="$(bazel --output_base="$OB" info --config=fuzz bazel-bin)/fuzz"
WORK="$(mktemp -d)"
REPORT=bench/fuzz.md
{
  echo "# Fuzzing"
  echo
  echo "libFuzzer (clang $(clang --version | head -1 | grep -o '[0-9][0-9.]*' | head -1)) with ASan + UBSan, $RUNS executions per target from the seed corpus in fuzz/corpus/, $(date -u +%Y-%m-%d) on this machine; \`bench/fuzz.sh\` makes this table."
  echo
  echo "| target | executions | crashes | seed inputs | corpus after | seconds |"
  echo "| --- | --- | --- | --- | --- | --- |"
} > "$REPORT.tmp"
total=0
crashes_total=0
for t in "${TARGETS[@]}"; do
  mkdir -p "$WORK/$t" "$WORK/$t-crashes"
  cp fuzz/corpus/$t/* "$WORK/$t/"
  seeds=$(ls fuzz/corpus/$t | wc -l)
  start=$(date +%s)
  set +e
  "$BIN/${t}_fuzz" -runs="$RUNS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
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
} >> "$REPORT.tmp"
mv "$REPORT.tmp" "$REPORT"
cat "$REPORT"
