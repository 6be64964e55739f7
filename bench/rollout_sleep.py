#!/usr/bin/env python3
"""rollout.sleep: what a rollout worker gives back while the learner trains.

The last mode, "weights+learner", adds the learner's half (learner.sleep:
cache: the learner hands its free memory back after each step, while the
workers generate).

Runs `coordinator run` on one host (a learner and one rollout worker, as a
colocated pair shares a GPU) with a 26M-parameter scratch Llama, a few
synchronous GRPO steps of long random completions, once per rollout.sleep
mode ("off", "cache", "weights"), the modes alternated repeat by repeat.
Every 20 ms it reads each role's resident set from /proc. Per mode it reports:

- the worker's resident set while the learner trains, and at its peak;
- the peak of learner + worker sampled at the same instant, in the train
  phases and over the whole run: what a host (or, on a GPU, a device)
  colocating the two must hold;
- what the worker reported releasing (metrics rollout_sleep_*), the theory
  for `weights` (the parameters twice: the model and the weight-sync receive
  buffers);
- the seconds of a step and of its sleep and sync: the price.

  bazel build //coordinator //learner //rollout:rollout_worker //replay_buffer //reward_server
  python3 bench/rollout_sleep.py --repeats 3 --out bench/rollout_sleep.md
"""
import argparse
import datetime
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import ROOT, children, name_of, sample  # noqa: E402

# rollout.sleep, and last the learner's half too (learner.sleep: cache).
MODES = ["off", "cache", "weights", "weights+learner"]
HIDDEN, LAYERS, HEADS, KV_HEADS, MLP, VOCAB_APPROX = 512, 8, 8, 4, 1408, 100
CONFIG = f"""name: sleep_bench
seed: 1
model: {{init: scratch, arch: llama, hidden: {HIDDEN}, layers: {LAYERS}, heads: {HEADS}, kv_heads: {KV_HEADS},
        intermediate: {MLP}, max_positions: 160, tokenizer: char}}
task: {{kind: arithmetic, digits: 2, ops: "+", train: 2000, eval: 8}}
stages:
  - grpo:
      rl: {{steps: STEPS, prompts_per_step: 4, samples_per_prompt: 8, optimizer: {{lr: 1.0e-5}}}}
rollout:
  workers: 1
  sampling: {{temperature: 1.0, max_new_tokens: 128}}
  max_batch: 64
reward:
  verifiers: [{{name: numeric_answer}}]
learner: {{shards: 1}}
weight_sync: {{backend: shm}}
logging: {{quiet: true}}
"""


def run_once(mode, steps, workdir):
    coordinator = os.path.join(ROOT, "bazel-bin/coordinator/coordinator")
    cfg = os.path.join(workdir, "sleep_bench.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG.replace("STEPS", str(steps)))
    run_dir = tempfile.mkdtemp(prefix=f"sleep-{mode}-", dir=workdir)
    rollout_mode, _, learner = mode.partition("+")
    cmd = [coordinator, "run", cfg, f"--run_dir={run_dir}", f"--bin_dir={os.path.join(ROOT, 'bazel-bin')}",
           "--set", f"rollout.sleep={rollout_mode}"]
    if learner:
        cmd += ["--set", "learner.sleep=cache"]
    log = open(os.path.join(run_dir, "coordinator.out"), "w")
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    samples = []  # (t, {name: rss MiB})
    while proc.poll() is None:
        now = {}
        for pid in children(proc.pid):
            n = name_of(pid)
            s = sample(pid)
            if n and s:
                now[n] = s[0]
        if "learner-0" in now and "rollout-0" in now:
            samples.append((time.time(), now))
        time.sleep(0.02)
    if proc.returncode != 0:
        sys.exit(f"bench/rollout_sleep.py: {mode} run failed (exit {proc.returncode}); see {run_dir}/coordinator.out")
    metrics = glob.glob(os.path.join(run_dir, "*", "metrics.jsonl"))[0]
    records = [json.loads(line) for line in open(metrics)]
    steps_rec = [r for r in records if r.get("event") == "step"]
    return samples, steps_rec


def summarise(samples, steps_rec):
    # A step record's `time` is taken right after its train phase, which
    # lasted seconds_train: the worker sleeps in those windows.
    windows = [(r["time"] - r["seconds_train"], r["time"]) for r in steps_rec]
    in_train = [s for t, s in samples if any(a <= t <= b for a, b in windows)]
    t_steps = [r["time"] for r in steps_rec]
    step_s = [b - a for a, b in zip(t_steps, t_steps[1:])]
    later = steps_rec[1:]  # the first step includes warm-up
    return {
        "worker_train": statistics.median([s["rollout-0"] for s in in_train]),
        "worker_max": max(s["rollout-0"] for _, s in samples),
        "pair_train_peak": max(s["rollout-0"] + s["learner-0"] for s in in_train),
        "pair_peak": max(s["rollout-0"] + s["learner-0"] for _, s in samples),
        "step_s": statistics.median(step_s) if step_s else float("nan"),
        "sleep_s": statistics.median([r.get("seconds_sleep", 0.0) for r in later]),
        "sync_s": statistics.median([r.get("seconds_sync", 0.0) for r in later]),
        "train_s": statistics.median([r.get("seconds_train", 0.0) for r in later]),
        "released_mib": statistics.median([r.get("rollout_sleep_released_bytes", 0.0) for r in later]) / 2**20,
        "fell_mib": statistics.median([r.get("rollout_sleep_memory_before_bytes", 0.0) -
                                       r.get("rollout_sleep_memory_after_bytes", 0.0) for r in later]) / 2**20,
        "learner_fell_mib": statistics.median([r.get("learner_memory_before_release_bytes", 0.0) -
                                               r.get("learner_memory_after_release_bytes", 0.0)
                                               for r in later]) / 2**20,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    for b in ("coordinator/coordinator", "learner/learner", "rollout/rollout_worker"):
        if not os.access(os.path.join(ROOT, "bazel-bin", b), os.X_OK):
            sys.exit(f"bench/rollout_sleep.py: build first (bazel-bin/{b} missing)")
    workdir = tempfile.mkdtemp(prefix="rlmesh-sleep-bench-")
    results = {m: [] for m in MODES}
    load_before = os.getloadavg()[0]
    for rep in range(args.repeats):
        order = MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]
        for mode in order:
            samples, steps_rec = run_once(mode, args.steps, workdir)
            r = summarise(samples, steps_rec)
            results[mode].append(r)
            print(f"repeat {rep} {mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    load_after = os.getloadavg()[0]

    params = (VOCAB_APPROX * HIDDEN  # embeddings (the char vocabulary, about 100), tied? untied: x2 below
              + LAYERS * (HIDDEN * HIDDEN * 2 + HIDDEN * (HIDDEN // HEADS) * KV_HEADS * 2 + 3 * HIDDEN * MLP))
    def med(mode, key):
        v = [r[key] for r in results[mode]]
        return statistics.median(v), min(v), max(v)

    lines = [
        "# rollout.sleep: a rollout worker's memory while the learner trains",
        "",
        f"`python3 bench/rollout_sleep.py --repeats {args.repeats} --steps {args.steps}` on "
        f"{datetime.date.today()}, this 2-core CPU machine (no GPU was lent). One learner and one rollout worker "
        "on one host, as a colocated pair shares a GPU; a scratch Llama (hidden 512, 8 layers, 8/4 heads, MLP 1408, "
        f"about {params / 1e6:.0f}M parameters in the blocks, fp32), {args.steps} synchronous GRPO steps of 4 prompts x "
        "8 samples, up to 128 new tokens each (a random policy writes them all), weights over shm. The modes "
        "alternate repeat by repeat; `weights+learner` is rollout.sleep: weights with learner.sleep: cache. "
        "Resident sets are sampled from /proc every 20 ms; MiB.",
        "",
        "| mode | worker while the learner trains | learner + worker, peak while training | "
        "learner + worker, peak over the run | worker peak | released per step (worker's count) | "
        "worker's resident set fell by | learner's fell by | step s | sleep s | sync s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in MODES:
        cells = []
        for key, fmt in (("worker_train", "{:.0f}"), ("pair_train_peak", "{:.0f}"), ("pair_peak", "{:.0f}"),
                         ("worker_max", "{:.0f}"),
                         ("released_mib", "{:.1f}"), ("fell_mib", "{:.1f}"), ("learner_fell_mib", "{:.0f}"),
                         ("step_s", "{:.2f}"),
                         ("sleep_s", "{:.3f}"), ("sync_s", "{:.3f}")):
            mid, lo, hi = med(m, key)
            cells.append(f"{fmt.format(mid)} ({fmt.format(lo)}-{fmt.format(hi)})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each cell: median over repeats (min-max). \"While the learner trains\": the samples inside each step's "
        "train phase (its record's time minus seconds_train, to its time); the worker's figure is their median. "
        "\"released\" is what the worker counted "
        "(parameters and receive buffers); \"fell by\" is its own resident set before the Sleep minus after it "
        "(malloc's free pages, the KV cache's included, go back with malloc_trim).",
        "",
        f"Load average (1 min) before/after: {load_before:.1f} / {load_after:.1f} on 2 cores.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
