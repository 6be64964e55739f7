"""Why is the learner step at 2 threads slow on this machine? An A/B of
variants of the same GRPO step (bench/learner_step_bench.py), each in its
own process, rotated round by round so that every variant sees the same
background load. Prints per-variant step seconds (min, median, max over all
timed steps) and, for the eager side, the time per phase.

  bazel build //bench:learner_step_bench && python3 bench/learner_step_threads.py [--rounds 4]

Variants: ours (rlmesh Trainer::TrainStep) with the defaults, with one
log-prob chunk (--logprob_chunk=128 = T) and with 1 inter-op thread; eager
(transformers, same step) in a fresh process; and both with
OMP_WAIT_POLICY=passive (OpenMP workers sleep instead of spinning at
barriers). 1-thread runs of both are the control.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import learner_step_bench as L

VARIANTS = [
    # name, side, threads, extra flags, extra env
    ("ours 1t", "ours", 1, [], {}),
    ("eager 1t", "eager", 1, [], {}),
    ("ours 2t", "ours", 2, [], {}),
    ("ours 2t chunk=128", "ours", 2, ["--logprob_chunk=128"], {}),
    ("ours 2t interop=1", "ours", 2, ["--interop_threads=1"], {}),
    ("eager 2t", "eager", 2, [], {}),
    ("ours 2t passive", "ours", 2, [], {"OMP_WAIT_POLICY": "passive"}),
    ("eager 2t passive", "eager", 2, [], {"OMP_WAIT_POLICY": "passive"}),
]


def eager_worker(model_dir, threads, warmup, steps):
    import torch
    from transformers import LlamaForCausalLM
    torch.set_num_threads(threads)
    model = L.LlamaForCausalLM.from_pretrained(model_dir).train()
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    batch = L.synthetic_batch(model.config.vocab_size)
    model.load_state_dict(init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for s in range(warmup + steps):
        phases = []
        t0 = time.perf_counter()
        L.eager_step(model, opt, batch, phases)
        secs = time.perf_counter() - t0
        if s >= warmup:
            print(json.dumps(dict(seconds=secs, phases=phases[0])), flush=True)


def run_variant(v, model_dir, binary, steps):
    name, side, threads, extra, env = v
    e = dict(os.environ, **env)
    if side == "ours":
        cmd = [binary, f"--model_dir={model_dir}", f"--threads={threads}", "--warmup=1", f"--steps={steps}", *extra]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--eager_worker", model_dir, f"--threads_one={threads}",
               f"--steps={steps}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=e)
    if proc.returncode != 0:
        sys.exit(f"{name} failed: {proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--binary", default="bazel-bin/bench/learner_step_bench")
    ap.add_argument("--eager_worker", default="")
    ap.add_argument("--threads_one", type=int, default=1)
    ap.add_argument("--raw", default="")
    ap.add_argument("--only", default="", help="comma-separated variant names to run (default: all)")
    args = ap.parse_args()
    if args.eager_worker:
        eager_worker(args.eager_worker, args.threads_one, 1, args.steps)
        return
    import torch
    torch.manual_seed(0)
    model = L.LlamaForCausalLM(L.LlamaConfig(**L.CFG))
    variants = [v for v in VARIANTS if not args.only or v[0] in args.only.split(",")]
    results = {v[0]: [] for v in variants}
    loads = []
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        for rnd in range(args.rounds):
            order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
            for v in order:
                results[v[0]] += run_variant(v, d, args.binary, args.steps)
            loads.append(os.getloadavg()[0])
    print(f"rounds {args.rounds} x {args.steps} timed steps per variant; load average (1 min) after each round:"
          f" {', '.join(f'{x:.1f}' for x in loads)}\n")
    print("| variant | step s min | median | max | eager phases at the min step: no-grad / fwd+loss / bwd / clip+AdamW s |")
    print("| --- | --- | --- | --- | --- |")
    for v in variants:
        rows = results[v[0]]
        secs = [r["seconds"] for r in rows]
        best = min(rows, key=lambda r: r["seconds"])
        ph = " / ".join(f"{x:.3f}" for x in best["phases"]) if "phases" in best else (
            f"(ours: fwd+bwd incl. no-grad pass {best['seconds_forward_backward']:.3f},"
            f" clip+AdamW {best['seconds_optimizer']:.3f})")
        print(f"| {v[0]} | {min(secs):.3f} | {statistics.median(secs):.3f} | {max(secs):.3f} | {ph} |")
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
