#!/usr/bin/env python3
"""Expert parallelism on this CPU: per-step time and memory per rank of a
training step of a Qwen3-MoE, in one process (ep=1, the whole batch) and
over two expert-parallel ranks (ep=2, half of the rows each, half of every
MoE layer's experts), the ranks as separate processes
(bench/tensor_parallel_bench.cc --ep), layouts alternated.

  bazel build //bench:tensor_parallel_bench
  python3 bench/expert_parallel.py --repeats 3 [--markdown]

The model: bench/tensor_parallel.py's attention shape (hidden 512, 8 layers,
8 heads / 4 KV heads) with every MLP a MoE layer of 8 experts of width 704,
2 per token, and a vocabulary of 8000, so that the experts are most of the
parameters. ep=1 gets --cores intra-op threads, each ep=2 rank half.

Theory of the training state per rank (fp32; 20 bytes a parameter: weights
4, AdamW's moments 8, DataParallel's flat weights and gradients 8):
  20 (replicated + experts / ep)
where `replicated` is everything but the routed experts (embeddings, head,
attention, norms, routers). Measured: the resident set once the model and
its optimizer are set up minus the one before the model was built; peak:
the peak resident set minus the same.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensor_parallel import BIN, launch_ranks  # noqa: E402  (the same binary and launcher)

SHAPE = dict(hidden=512, layers=8, heads=8, kv_heads=4, vocab=8000, batch=4, seq=128, experts=8,
             experts_per_tok=2, moe_intermediate=704)


def param_counts(s):
    """(replicated, experts) parameter counts."""
    d = s["hidden"] // s["heads"]
    attention = s["hidden"] * s["heads"] * d * 2 + s["hidden"] * s["kv_heads"] * d * 2
    per_layer = attention + 2 * s["hidden"] + s["hidden"] * s["experts"] + 2 * d  # norms, router, q/k norms
    replicated = s["layers"] * per_layer + 2 * s["vocab"] * s["hidden"] + s["hidden"]
    experts = s["layers"] * s["experts"] * 3 * s["hidden"] * s["moe_intermediate"]
    return replicated, experts


def run_layout(ep, cores, steps, workdir):
    flags = [f"--ep={ep}", f"--threads={max(1, cores // ep)}", f"--steps={steps}"] + [
        f"--{k}={v}" for k, v in SHAPE.items()]
    return launch_ranks(ep, flags, workdir, f"--ep={ep}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit("build first: bazel build //bench:tensor_parallel_bench")
    layouts = [1, 2]
    results = {l: [] for l in layouts}
    with tempfile.TemporaryDirectory() as workdir:
        for rep in range(args.repeats):
            for ep in (layouts if rep % 2 == 0 else list(reversed(layouts))):
                results[ep].append(run_layout(ep, args.cores, args.steps, workdir))
                print(json.dumps(dict(ep=ep, repeat=rep, ranks=results[ep][-1])), file=sys.stderr)
    replicated, experts = param_counts(SHAPE)
    rows = []
    for ep in layouts:
        reps = results[ep]
        step = [max(statistics.median(x["seconds"]) for x in r) for r in reps]
        state = [max(x["rss_setup"] - x["rss_before"] for x in r) / 2**20 for r in reps]
        peak = [max(x["peak_rss"] - x["rss_before"] for x in r) / 2**20 for r in reps]
        theory = 20 * (replicated + experts / ep) / 2**20
        rows.append(dict(ep=ep, step_median=statistics.median(step), step_min=min(step), step_max=max(step),
                         state_median=statistics.median(state), theory_state_mib=theory,
                         peak_median=statistics.median(peak), peak_min=min(peak), peak_max=max(peak),
                         local_params=reps[0][0]["local_params"], first_loss=reps[0][0]["first_loss"]))
    base = rows[0]
    for r in rows:
        r["time_ratio"] = r["step_median"] / base["step_median"]
        r["state_ratio"] = r["state_median"] / base["state_median"]
        r["theory_ratio"] = r["theory_state_mib"] / base["theory_state_mib"]
        r["peak_ratio"] = r["peak_median"] / base["peak_median"]
    print(json.dumps(dict(replicated=replicated, experts=experts, rows=rows), indent=1))
    if args.markdown:
        print(f"{(replicated + experts) / 1e6:.1f}M parameters ({experts / 1e6:.1f}M in routed experts); batch "
              f"{SHAPE['batch']} x {SHAPE['seq']} tokens; {args.cores} cores; {args.repeats} repeats alternated.\n")
        print("| layout | s/step median (min-max) | time ratio | state MiB/rank measured / theory | state ratio "
              "measured / theory | peak MiB/rank median (min-max) | peak ratio | local params | first loss, rank 0 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print(f"| ep={r['ep']} | {r['step_median']:.3f} ({r['step_min']:.3f}-{r['step_max']:.3f}) | "
                  f"{r['time_ratio']:.2f} | {r['state_median']:.0f} / {r['theory_state_mib']:.0f} | "
                  f"{r['state_ratio']:.2f} / {r['theory_ratio']:.2f} | {r['peak_median']:.0f} "
                  f"({r['peak_min']:.0f}-{r['peak_max']:.0f}) | {r['peak_ratio']:.2f} | {r['local_params']:,} | "
                  f"{r['first_loss']:.6f} |")


if __name__ == "__main__":
    main()
