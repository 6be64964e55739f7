#!/bin/bash
# The dashboard in a real browser: launches a cluster with a token and
# --dashboard_port, runs a short SFT + GRPO experiment through it, then has
# headless Chromium (Debian's `chromium`) load the page as a user would
# (/?token=..., the page's own requests then ride on the cookie) and checks
# the DOM the page's script built: plots with data points, every role's
# health, trajectories in the sample browser. Screenshots go to the test's
# undeclared outputs (bazel-testlogs/tests/dashboard_browser_test/test.outputs).
set -euo pipefail
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
BIN="$ROOT/coordinator/coordinator"
W="$TEST_TMPDIR/work"
OUT="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}"
mkdir -p "$W" "$OUT"
CHROMIUM="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$CHROMIUM" ]; then
  echo "FAIL: no chromium on PATH (scripts/setup.sh installs Debian's chromium)" >&2
  exit 1
fi

echo "dashboard-test-token" > "$W/token"
cat > "$W/cluster.yaml" <<YAML
name: dash
coordinator_port: 0
rollout_workers: 1
reward_servers: 1
learners: 1
auth_token_file: $W/token
run_dir: $W/runs
YAML
cat > "$W/experiment.yaml" <<'YAML'
name: dash
seed: 3
model: {init: scratch, arch: llama, hidden: 32, layers: 1, heads: 2, kv_heads: 1, max_positions: 32, tokenizer: char}
task: {kind: arithmetic, digits: 1, ops: "+", train: 2000, eval: 40}
stages:
  - sft: {steps: 30, batch: 32, optimizer: {lr: 3.0e-3}}
  - grpo: {rl: {steps: 6, prompts_per_step: 4, samples_per_prompt: 4, optimizer: {lr: 1.0e-4}}}
rollout: {workers: 1, sampling: {temperature: 1.0, max_new_tokens: 4}}
reward: {verifiers: [{name: numeric_answer, weight: 1.0}]}
learner: {shards: 1}
weight_sync: {backend: shm}
eval: {every: 2}
YAML

"$BIN" launch --cluster="$W/cluster.yaml" --bin_dir="$ROOT" --port_file="$W/port" --dashboard_port=0 \
  > "$W/coordinator.log" 2>&1 &
COORD=$!
cleanup() { kill -TERM "$COORD" 2>/dev/null || true; wait "$COORD" 2>/dev/null || true; }
trap cleanup EXIT

for _ in $(seq 1 600); do
  [ -s "$W/port" ] && grep -q "dashboard on" "$W/coordinator.log" && break
  kill -0 "$COORD" 2>/dev/null || { cat "$W/coordinator.log"; echo "FAIL: coordinator exited" >&2; exit 1; }
  sleep 0.2
done
ADDR="127.0.0.1:$(cat "$W/port")"
DASH="$(grep -o 'dashboard on http://[0-9.:]*/' "$W/coordinator.log" | head -1 | sed 's/dashboard on //')"
[ -n "$DASH" ] || { cat "$W/coordinator.log"; echo "FAIL: no dashboard address printed" >&2; exit 1; }
CLIFLAGS=(--address="$ADDR" --auth_token_file="$W/token")

# Without the token the page is refused.
code=$(curl -s -o /dev/null -w '%{http_code}' "$DASH" || true)
[ "$code" = 401 ] || { echo "FAIL: dashboard without token answered $code, want 401" >&2; exit 1; }

EXP=$("$BIN" submit "$W/experiment.yaml" "${CLIFLAGS[@]}")
echo "experiment $EXP, dashboard $DASH"
state=""
for _ in $(seq 1 600); do
  state=$("$BIN" status "$EXP" "${CLIFLAGS[@]}" | head -1 | awk '{print $3}')
  case "$state" in SUCCEEDED|FAILED|CANCELLED) break ;; esac
  sleep 0.5
done
[ "$state" = SUCCEEDED ] || { "$BIN" status "$EXP" "${CLIFLAGS[@]}"; echo "FAIL: experiment ended $state" >&2; exit 1; }

BROWSER=("$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
         --user-data-dir="$TEST_TMPDIR/chromium" --virtual-time-budget=15000)
URL="${DASH}?token=$(cat "$W/token")"
"${BROWSER[@]}" --dump-dom "$URL" > "$OUT/dashboard_dom.html" 2> "$W/chromium.log" || true
"${BROWSER[@]}" --window-size=1400,1700 --screenshot="$OUT/dashboard.png" "$URL" >> "$W/chromium.log" 2>&1 || true

DOM="$OUT/dashboard_dom.html"
fail() { echo "FAIL: $*" >&2; tail -20 "$W/chromium.log" >&2; exit 1; }
[ -s "$DOM" ] || fail "chromium wrote no DOM"
plots=$(grep -o 'data-points="[0-9]*"' "$DOM" | grep -vc 'data-points="0"' || true)
echo "plots with data points: $plots"
[ "$plots" -ge 6 ] || fail "only $plots plots have data points (want >= 6)"
grep -q 'data-series="accuracy (eval)"' "$DOM" || fail "no held-out accuracy series"
grep -q 'data-series="reward_mean"' "$DOM" || fail "no reward series"
roles=$(grep -o 'class="role"' "$DOM" | wc -l)
[ "$roles" -ge 4 ] || fail "$roles roles listed (want replay buffer, reward, rollout, learner)"
[ "$(grep -o '>SERVING<' "$DOM" | wc -l)" -ge 4 ] || fail "roles not shown SERVING"
samples=$(grep -o 'class="sample"' "$DOM" | wc -l)
[ "$samples" -ge 1 ] || fail "the sample browser shows no trajectory"
grep -q 'class="tok' "$DOM" || fail "no per-token spans in the samples"
grep -q "SUCCEEDED" "$DOM" || fail "the header does not show the experiment's state"
[ "$(stat -c %s "$OUT/dashboard.png" 2>/dev/null || echo 0)" -gt 20000 ] || fail "no screenshot"
echo "PASSED: $plots plots, $roles roles, $samples samples; screenshot $OUT/dashboard.png"
