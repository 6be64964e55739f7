#!/bin/bash
# coordinator run --profile: every role's spans merged into one Chrome
# trace-event file on one time axis. Runs a short SFT + GRPO experiment and
# checks the file with Python's json parser: one track per process, spans
# from each role's own work, all inside the run's wall-clock window.
set -euo pipefail
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
PY="${RLMESH_PYTHON:-python3}"
W="$TEST_TMPDIR/work"
mkdir -p "$W"
cat > "$W/experiment.yaml" <<'YAML'
name: prof
seed: 5
model: {init: scratch, arch: llama, hidden: 32, layers: 1, heads: 2, kv_heads: 1, max_positions: 32, tokenizer: char}
task: {kind: arithmetic, digits: 1, ops: "+", train: 2000, eval: 40}
stages:
  - sft: {steps: 10, batch: 32, optimizer: {lr: 3.0e-3}}
  - grpo: {rl: {steps: 4, prompts_per_step: 4, samples_per_prompt: 4, optimizer: {lr: 1.0e-4}}}
rollout: {workers: 1, sampling: {temperature: 1.0, max_new_tokens: 4}}
reward: {verifiers: [{name: numeric_answer, weight: 1.0}]}
learner: {shards: 1}
weight_sync: {backend: shm}
eval: {every: 2}
logging: {quiet: true}
YAML
start_us=$(( $(date +%s%N) / 1000 ))
"$ROOT/coordinator/coordinator" run "$W/experiment.yaml" --bin_dir="$ROOT" --run_dir="$W/run" --profile > "$W/run.log" 2>&1 \
  || { cat "$W/run.log"; echo "FAIL: run failed" >&2; exit 1; }
end_us=$(( $(date +%s%N) / 1000 ))
grep "profile of" "$W/run.log"
PROFILE=$(ls "$W"/run/*/profile.json 2>/dev/null | head -1)
[ -n "$PROFILE" ] || { cat "$W/run.log"; echo "FAIL: no profile.json" >&2; exit 1; }
"$PY" - "$PROFILE" "$start_us" "$end_us" <<'PY'
import json, sys
path, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
trace = json.load(open(path))
events = trace["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
spans = [e for e in events if e.get("ph") == "X"]
by_process = {}
for e in spans:
    assert e["pid"] in names, f"span of an unnamed process: {e}"
    assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0, e
    assert start - 1_000_000 <= e["ts"] and e["ts"] + e["dur"] <= end + 1_000_000, f"span outside the run: {e}"
    by_process.setdefault(names[e["pid"]], set()).add(e["name"])
print({p: sorted(s) for p, s in by_process.items()})
want = {
    "coordinator": {"generate", "train", "eval"},
    "replay_buffer": {"put_groups", "sample_groups"},
    "reward_server": {"score"},
    "rollout_worker": {"generate", "generate_eval", "score", "put_groups"},
    "learner": {"train_step", "forward_backward", "optimizer", "sample"},
}
assert len(names) == 5, f"want 5 processes (coordinator + 4 roles), got {sorted(names.values())}"
for role, need in want.items():
    have = by_process.get(role, set())
    missing = need - have
    assert not missing, f"{role}: no {sorted(missing)} span (has {sorted(have)})"
print(f"PASSED: {len(spans)} spans from {len(names)} processes")
PY
