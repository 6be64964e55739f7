#!/usr/bin/env python3
"""Model parallelism on this CPU: per-step time and peak memory per rank of
a training step for tp=1, tp=2, tp=2 with sequence parallelism and dp=2
with ZeRO-3 (fully sharded, each rank on half of the batch's rows), the
ranks of each layout as separate processes (bench/tensor_parallel_bench.cc),
layouts alternated (order reversed every other repeat).

  bazel build //bench:tensor_parallel_bench
  python3 bench/tensor_parallel.py --repeats 3 [--markdown]

tp=1 gets --cores intra-op threads in its one process; each rank of a
two-rank layout gets cores / 2, so every layout uses the same cores. Memory per rank is the peak
resident set minus the resident set before the model was built (LibTorch's
own start-up); the training state (resident set once the model and its
optimizer are set up, before the first step) is set against its theory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bazel-bin/bench/tensor_parallel_bench")

# The model (a 56M-parameter Llama: hidden 512, 8 layers, 8 heads / 4 KV
# heads, MLP 1408, vocabulary 32000) and the batch.
SHAPE = dict(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1408, vocab=32000, batch=4, seq=128)


def param_counts(s):
    """(sliced, replicated) parameter counts of the model."""
    d = s["hidden"] // s["heads"]
    per_layer_sliced = (s["hidden"] * s["heads"] * d * 2 + s["hidden"] * s["kv_heads"] * d * 2
                        + 3 * s["hidden"] * s["intermediate"])
    sliced = s["layers"] * per_layer_sliced + 2 * s["vocab"] * s["hidden"]
    replicated = s["layers"] * 2 * s["hidden"] + s["hidden"]
    return sliced, replicated


def launch_ranks(ranks, flags, workdir, label):
    """Runs `ranks` processes of tensor_parallel_bench with `flags` (each
    also gets --rank, one fresh --store and its own --out) and returns each
    rank's JSON record, in rank order. Exits naming `label` if one fails."""
    serial = f"{os.getpid()}-{len(os.listdir(workdir))}"
    store = os.path.join(workdir, f"store-{serial}")
    procs, outs = [], []
    for rank in range(ranks):
        out = os.path.join(workdir, f"out-{serial}-{rank}.json")
        args = [BIN, f"--rank={rank}", f"--store={store}", f"--out={out}"] + flags
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
        outs.append(out)
    for p in procs:
        if p.wait(timeout=900) != 0:
            sys.exit(f"tensor_parallel_bench {label} failed")
    return [json.load(open(o)) for o in outs]


def run_layout(tp, sp, zero3, cores, steps, workdir):
    ranks = zero3 or tp
    flags = [f"--tp={tp}", f"--sp={'true' if sp else 'false'}", f"--zero3_dp={zero3}",
             f"--threads={max(1, cores // ranks)}", f"--steps={steps}"] + [f"--{k}={v}" for k, v in SHAPE.items()]
    return launch_ranks(ranks, flags, workdir, f"tp={tp} sp={sp} zero3_dp={zero3}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    layouts = [(1, False, 0), (2, False, 0), (2, True, 0), (1, False, 2)]
    results = {l: [] for l in layouts}  # layout -> [per repeat: [rank records]]
    with tempfile.TemporaryDirectory() as workdir:
        for rep in range(args.repeats):
            order = layouts if rep % 2 == 0 else list(reversed(layouts))
            for tp, sp, zero3 in order:
                results[(tp, sp, zero3)].append(run_layout(tp, sp, zero3, args.cores, args.steps, workdir))
                r = results[(tp, sp, zero3)][-1]
                print(f"repeat {rep} tp={tp} sp={sp} zero3_dp={zero3}: step {statistics.median(r[0]['seconds']):.3f} s, "
                      f"peak-before {max(x['peak_rss'] - x['rss_before'] for x in r) / 2**20:.0f} MiB",
                      file=sys.stderr)

    sliced, replicated = param_counts(SHAPE)
    base = None
    rows = []
    for (tp, sp, zero3) in layouts:
        reps = results[(tp, sp, zero3)]
        # A step takes as long as its slowest rank: per repeat, the max over
        # ranks of the median step.
        step = [max(statistics.median(x["seconds"]) for x in r) for r in reps]
        mem = [max(x["peak_rss"] - x["rss_before"] for x in r) / 2**20 for r in reps]
        setup = [max(x["rss_setup"] - x["rss_before"] for x in r) / 2**20 for r in reps]
        loss = reps[0][0]["first_loss"]
        local = reps[0][0]["local_params"]
        # Training state per rank once set up: fp32 weights, two AdamW
        # moments and DataParallel's flat copies of weights and gradients,
        # 20 bytes per local parameter; the gradients (4 more) come with the
        # first backward, with the activations. Under ZeRO-3 every
        # parameter, replicated ones included, is cut into dp shards.
        if zero3:
            theory_state = 20 * (sliced + replicated) / zero3 / 2**20
        else:
            theory_state = 20 * (sliced / tp + replicated) / 2**20
        row = dict(tp=tp, sp=sp, zero3=zero3, step_median=statistics.median(step), step_min=min(step), step_max=max(step),
                   mem_median=statistics.median(mem), mem_min=min(mem), mem_max=max(mem),
                   setup_median=statistics.median(setup), first_loss=loss,
                   local_params=local, theory_state_mib=theory_state)
        if base is None:
            base = row
        row["time_ratio"] = row["step_median"] / base["step_median"]
        row["mem_ratio"] = row["mem_median"] / base["mem_median"]
        row["setup_ratio"] = row["setup_median"] / base["setup_median"]
        row["theory_ratio"] = theory_state / base["theory_state_mib"]
        rows.append(row)
    print(json.dumps(rows, indent=1))
    if args.markdown:
        print("| layout | s/step median (min-max) | time ratio | state MiB/rank (measured / theory) | state ratio "
              "(measured / theory) | peak MiB/rank, median (min-max) | peak ratio | local params | first loss, rank 0 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            name = (f"dp={r['zero3']} ZeRO-3" if r["zero3"] else f"tp={r['tp']}") + (" + SP" if r["sp"] else "")
            print(f"| {name} | {r['step_median']:.3f} ({r['step_min']:.3f}-{r['step_max']:.3f}) | "
                  f"{r['time_ratio']:.2f} | {r['setup_median']:.0f} / {r['theory_state_mib']:.0f} | "
                  f"{r['setup_ratio']:.2f} / {r['theory_ratio']:.2f} | "
                  f"{r['mem_median']:.0f} ({r['mem_min']:.0f}-{r['mem_max']:.0f}) | {r['mem_ratio']:.2f} | "
                  f"{r['local_params']:,} | {r['first_loss']:.6f} |")

if __name__ == "__main__":
    main()
