#!/usr/bin/env python3
"""Learning results over seeds: runs shipped configs with `coordinator run`
for several seeds and reports, per config, held-out greedy accuracy of the
base (after SFT) and after the final stage, the gain, the SFT steps the stop
rule chose, and wall time, as mean +- sd with every seed listed.

  bazel build //coordinator //learner //replay_buffer //reward_server //rollout:rollout_worker
  python3 bench/learning.py --seeds 1 2 3 4 5 --configs grpo_arith_tiny ppo_arith_tiny \
      --out /tmp/learning.json

Runs are sequential (the machine has 2 cores; a run uses both). The JSON has
one record per run; --markdown prints the table bench/learning.md quotes.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_one(config, seed, extra, workdir, label):
    run_root = os.path.join(workdir, f"{config}-s{seed}")
    cmd = [os.path.join(ROOT, "bazel-bin/coordinator/coordinator"), "run",
           os.path.join(ROOT, "configs", config + ".yaml"), f"--run_dir={run_root}",
           f"--bin_dir={os.path.join(ROOT, 'bazel-bin')}", f"--set=seed={seed}"] + [f"--set={s}" for s in extra]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        return {"config": label, "seed": seed, "ok": False, "wall_s": wall}
    (exp_dir,) = [os.path.join(run_root, d) for d in os.listdir(run_root)
                  if os.path.isdir(os.path.join(run_root, d))]
    evals = {}
    curves = {}  # stage -> [[step, accuracy], ...], every eval of the stage
    sft_steps = None
    for line in open(os.path.join(exp_dir, "metrics.jsonl")):
        j = json.loads(line)
        if j.get("event") == "eval":
            evals[j["stage"]] = j["accuracy"]  # the last one of a stage is its final eval
            curves.setdefault(j["stage"], []).append([j["step"], j["accuracy"]])
            if j["stage"] == "sft":
                sft_steps = j["step"]
    stages = [s for s in evals if s not in ("init",)]
    final_stage = stages[-1]
    # The base of an RL/preference stage is the SFT policy; an SFT-only
    # config is measured against the untrained model.
    base = evals.get("init") if final_stage == "sft" else evals.get("sft")
    return {"config": label, "seed": seed, "ok": True, "wall_s": round(wall, 1),
            "init": evals.get("init"), "base": base, "final_stage": final_stage,
            "final": evals[final_stage], "gain": None if base is None else evals[final_stage] - base,
            "sft_steps": sft_steps, "curve": curves.get(final_stage, [])}


def fmt(values, pct=True):
    scale = 100 if pct else 1
    v = [x * scale for x in values]
    if len(v) == 1:
        return f"{v[0]:.1f}"
    return f"{statistics.mean(v):.1f} ± {statistics.stdev(v):.1f}"


def markdown(records):
    out = ["| config | seeds | base (after SFT) | final | gain (points) | min gain | SFT steps | wall s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    configs = []
    for r in records:
        if r["config"] not in configs:
            configs.append(r["config"])
    for c in configs:
        rs = [r for r in records if r["config"] == c and r["ok"]]
        failed = [r["seed"] for r in records if r["config"] == c and not r["ok"]]
        if not rs:
            out.append(f"| {c} | failed: {failed} | | | | | | |")
            continue
        gains = [r["gain"] for r in rs if r["gain"] is not None]
        out.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            c, " ".join(str(r["seed"]) for r in rs), fmt([r["base"] for r in rs]),
            fmt([r["final"] for r in rs]), fmt(gains) if gains else "-",
            f"{100 * min(gains):+.1f}" if gains else "-",
            " ".join(str(r["sft_steps"]) for r in rs), fmt([r["wall_s"] for r in rs], pct=False)))
        if failed:
            out.append(f"| {c}: failed seeds | {failed} | | | | | | |")
    out.append("")
    out.append("Per seed (base → final, %):")
    out.append("")
    for r in records:
        if r["ok"]:
            out.append(f"- {r['config']} seed {r['seed']}: {100 * r['base']:.1f} → {100 * r['final']:.1f} "
                       f"({r['final_stage']}), SFT {r['sft_steps']} steps, {r['wall_s']} s")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    ap.add_argument("--set", action="append", default=[], help="extra --set for every run")
    ap.add_argument("--label", help="name in the table (default: the config)")
    ap.add_argument("--out", required=True, help="JSON records (appended across calls)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    records = json.load(open(args.out)) if os.path.exists(args.out) else []
    with tempfile.TemporaryDirectory() as work:
        for c in args.configs:
            for s in args.seeds:
                r = run_one(c, s, args.set, work, args.label or c)
                print(json.dumps(r), flush=True)
                records.append(r)
                json.dump(records, open(args.out, "w"), indent=1)
    if args.markdown:
        print(markdown(records))


if __name__ == "__main__":
    main()
