#!/bin/bash
# The CLI against a real replay_buffer: stats/query tables and --json, the
# token, export formats, and clear errors. Every wait is bounded.
set -euo pipefail
RB=replay_buffer/replay_buffer
CLI=replay_buffer/cli
SEED=replay_buffer/seed_tool
D=$(mktemp -d "${TEST_TMPDIR:-/tmp}/cli_test.XXXXXX")
echo secret-token > "$D/token"
"$RB" --port=0 --port_file="$D/port" --db_path="$D/db" --auth_token_file="$D/token" \
  > "$D/server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 100); do [[ -s "$D/port" ]] && break; sleep 0.1; done
ADDR="127.0.0.1:$(cat "$D/port")"
fail() { echo "FAIL: $*"; exit 1; }

# Without the token: refused, non-zero exit, a clear line.
if out=$("$CLI" stats --address="$ADDR" 2>&1); then fail "stats without token succeeded"; fi
grep -q UNAUTHENTICATED <<<"$out" || fail "no UNAUTHENTICATED in: $out"

# The seed tool carries no token: run it against a second, open server.
"$RB" --port=0 --port_file="$D/port2" --db_path="$D/db2" > "$D/server2.log" 2>&1 &
PID2=$!
trap 'kill $PID $PID2 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 100); do [[ -s "$D/port2" ]] && break; sleep 0.1; done
ADDR2="127.0.0.1:$(cat "$D/port2")"
timeout 20 "$SEED" "$ADDR2" exp1 | grep -q "written=6" || fail "seed"

C=(--address="$ADDR2" --timeout_seconds=5)
out=$(timeout 20 "$CLI" stats "${C[@]}")
grep -Eq "exp1 +6 +24" <<<"$out" || fail "stats table: $out"
out=$(timeout 20 "$CLI" stats "${C[@]}" --json)
grep -q '"trajectories":"24"' <<<"$out" || fail "stats json: $out"

out=$(timeout 20 "$CLI" query "${C[@]}" --experiment=exp1 --step=1 --min_reward=1)
[[ $(grep -c "answer-1-0-0" <<<"$out") == 1 ]] || fail "query table: $out"
[[ $(grep -c "answer-" <<<"$out") == 1 ]] || fail "query filter: $out"
out=$(timeout 20 "$CLI" query "${C[@]}" --experiment=exp1 --limit=5 --aggregates)
grep -q "more: --page_token=" <<<"$out" || fail "no page token: $out"
grep -Eq "^ +2 +8 +2 " <<<"$out" || fail "aggregates: $out"
out=$(timeout 20 "$CLI" query "${C[@]}" --experiment=exp1 --json --limit=2)
grep -q '"next_page_token"' <<<"$out" || fail "query json: $out"

timeout 20 "$CLI" export "${C[@]}" --experiment=exp1 --format=dpo --out="$D/dpo.jsonl" 2>/dev/null
[[ $(wc -l < "$D/dpo.jsonl") == 3 ]] || fail "dpo lines: $(cat "$D/dpo.jsonl")"
timeout 20 "$CLI" export "${C[@]}" --experiment=exp1 --format=sft --out="$D/sft.jsonl" 2>/dev/null
[[ $(wc -l < "$D/sft.jsonl") == 2 ]] || fail "sft lines"
out=$(timeout 20 "$CLI" tail "${C[@]}" --experiment=exp1 --polls=1 --json)
[[ $(grep -c '"step":"2"' <<<"$out") == 8 ]] || fail "tail: $out"

# Clear errors.
if out=$(timeout 20 "$CLI" query "${C[@]}" --experiment=nope 2>&1); then fail "unknown experiment"; fi
grep -q "INVALID_ARGUMENT" <<<"$out" || fail "unknown experiment message: $out"
if out=$(timeout 20 "$CLI" query "${C[@]}" 2>&1); then fail "missing --experiment"; fi
grep -q -- "--experiment is required" <<<"$out" || fail "missing experiment message: $out"
if out=$(timeout 20 "$CLI" query "${C[@]}" --experiment=exp1 --page_token=garbage 2>&1); then
  fail "garbage token"
fi
grep -q "page_token" <<<"$out" || fail "token message: $out"

# SIGTERM: exit 0 within 2 s.
kill -TERM $PID2
for _ in $(seq 20); do kill -0 $PID2 2>/dev/null || break; sleep 0.1; done
if kill -0 $PID2 2>/dev/null; then fail "server still running 2 s after SIGTERM"; fi
wait $PID2 || fail "server exit code $?"
echo PASS
