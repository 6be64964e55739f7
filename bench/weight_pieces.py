#!/usr/bin/env python3
"""Weight sync between tensor-parallel layouts, end to end through the
coordinator: the time of each sync when the weights travel in pieces (each
learner TP rank sends its own slice, each rollout rank receives only its
own) against the whole model from learner rank 0 (weight_sync.whole_model:
true, where the worker cuts its slices), runs alternated, each a fresh
`coordinator run`.

  bazel build //coordinator //learner //rollout:rollout_worker //replay_buffer //reward_server
  python3 bench/weight_pieces.py --repeats 3 [--markdown]

The run: GRPO only, from a scratch Llama (hidden 512, 8 layers, 8 heads / 4
KV heads, MLP 1368, the char vocabulary: 23.2M parameters, 93 MB in fp32),
learner {shards: 2, tp: 2}, one rollout worker with rollout.tp 2, small
batches (4 prompts x 2 samples, 4 new tokens) so that the sync is a
visible part of the step. `seconds_sync` is read from metrics.jsonl (the
sync before each step); the first two steps are left out (the groups form).

With --baseline_bin_dir DIR (the bazel-bin of another build, e.g. a git
worktree at an older commit) each side also runs with that build's
binaries, alternated with this tree's, and the table gives both and their
ratio per pair:

  python3 bench/weight_pieces.py --backends gloo --baseline_bin_dir /tmp/old/bazel-bin --markdown
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bazel-bin")

CONFIG = """name: weight_pieces_bench
seed: 11
model: {init: scratch, arch: llama, hidden: 512, layers: 8, heads: 8, kv_heads: 4, max_positions: 64, tokenizer: char}
task: {kind: arithmetic, digits: 2, ops: "+", train: 200, eval: 20}
stages:
  - grpo:
      rl: {steps: %(steps)d, prompts_per_step: 4, samples_per_prompt: 2, optimizer: {lr: 1.0e-4}}
rollout: {workers: 1, tp: 2, sampling: {temperature: 1.0, max_new_tokens: 4}}
reward: {verifiers: [{name: numeric_answer, weight: 1.0}]}
learner: {shards: 2, tp: 2}
checkpoint: {every: 0}
eval: {every: 0}
logging: {tensorboard: false}
"""


def run(tmp, config, backend, whole, tag, bin_dir=BIN):
    runs = os.path.join(tmp, f"runs-{tag}")
    cmd = [os.path.join(bin_dir, "coordinator/coordinator"), "run", config, f"--run_dir={runs}", f"--bin_dir={bin_dir}",
           f"--set=weight_sync.backend={backend}", f"--set=weight_sync.whole_model={'true' if whole else 'false'}",
           "--set=model.threads=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"run failed ({' '.join(cmd)}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    pieces_logged = "weight sync in 2 pieces" in out.stdout + out.stderr
    if pieces_logged == whole:
        sys.exit(f"{tag}: expected {'no ' if whole else ''}weight sync in pieces")
    (run_dir,) = [os.path.join(runs, d) for d in os.listdir(runs)]
    sync, diff = [], []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("event") != "step":
                continue
            sync.append(j["seconds_sync"])
            diff.append(j["behaviour_logp_abs_diff_max"])
    # The rollout sampled from the learner's weights at every step.
    assert max(diff) <= 1e-4, f"{tag}: behaviour_logp_abs_diff_max {max(diff)}"
    return sync[2:]


def spread(xs):
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs per side and backend, alternated")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--backends", default="shm,gloo")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--baseline_bin_dir", default="", help="bazel-bin of a build to compare against")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(BIN, "coordinator/coordinator")):
        sys.exit("build first: bazel build //coordinator //learner //rollout:rollout_worker //replay_buffer "
                 "//reward_server")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "bench.yaml")
        with open(config, "w") as f:
            f.write(CONFIG % {"steps": args.steps})
        if args.baseline_bin_dir:
            return against_baseline(args, tmp, config)
        for backend in args.backends.split(","):
            med = {True: [], False: []}
            ratios = []
            for i in range(args.repeats):
                # Alternate which side goes first.
                order = (False, True) if i % 2 == 0 else (True, False)
                got = {}
                for whole in order:
                    sync = run(tmp, config, backend, whole, f"{backend}-{'whole' if whole else 'pieces'}-{i}")
                    got[whole] = statistics.median(sync)
                    med[whole].append(got[whole])
                ratios.append(got[True] / got[False])
                print(f"{backend} repeat {i}: whole {got[True]:.3f} s, pieces {got[False]:.3f} s", file=sys.stderr)
            rows.append((backend, spread(med[True]), spread(med[False]), spread(ratios)))
    if args.markdown:
        print("| backend | sync, whole model (s) | sync, pieces (s) | whole / pieces (per pair) |")
        print("|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in rows:
            print(f"{r[0]}: whole {r[1]}, pieces {r[2]}, whole/pieces {r[3]}")


def against_baseline(args, tmp, config):
    """Each side (whole, pieces) with this tree's binaries and the baseline's,
    alternated, the order reversed every other repeat."""
    rows = []
    for backend in args.backends.split(","):
        for whole in (True, False):
            side = "whole" if whole else "pieces"
            med = {"new": [], "ref": []}
            ratios = []
            for i in range(args.repeats):
                got = {}
                for build in (("ref", "new") if i % 2 == 0 else ("new", "ref")):
                    bin_dir = BIN if build == "new" else args.baseline_bin_dir
                    sync = run(tmp, config, backend, whole, f"{backend}-{side}-{build}-{i}", bin_dir)
                    got[build] = statistics.median(sync)
                    med[build].append(got[build])
                ratios.append(got["ref"] / got["new"])
                print(f"{backend} {side} repeat {i}: baseline {got['ref']:.3f} s, this tree {got['new']:.3f} s",
                      file=sys.stderr)
            rows.append((backend, side, spread(med["ref"]), spread(med["new"]), spread(ratios)))
    print("| backend | sync | baseline (s) | this tree (s) | baseline / this tree (per pair) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
