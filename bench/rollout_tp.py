#!/usr/bin/env python3
"""A rollout split over tensor-parallel ranks on this CPU: generation time and
memory of rollout::TensorParallelEngine at tp=2 against one actor::Generator
(tp=1) on the same model and requests, runs alternated (tp=1, tp=2, tp=1,
...), each in its own process (bench/generate_bench.cc --tp).

  bazel build //bench:generate_bench
  python3 bench/rollout_tp.py --repeats 3 [--markdown]

The workload is generate_bench's: a random Llama (hidden 512, 8 layers, 8
heads / 4 KV heads, MLP 1408, vocabulary 32000), 128 prompts of 32 tokens,
long-tailed greedy completions (mean 48, at most 256), max_batch 64. tp=1
gets --cores intra-op threads; each tp=2 rank half of them.

Theory per rank: the weights are 1/tp of every split matrix plus the whole
norms (so just over 1/2 at tp=2); the KV cache holds 1/tp of the KV heads.
The ranks are threads of one process, so the resident set is their sum and
is reported for the process, not per rank.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bazel-bin/bench/generate_bench")


def run(tp, cores, timed):
    out = subprocess.run([BIN, f"--tp={tp}", f"--threads={cores}", f"--repeats={timed}"], check=True,
                         capture_output=True, text=True, timeout=1800).stdout
    return json.loads(out.strip().splitlines()[-1])


def spread(xs):
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="processes per layout, alternated")
    ap.add_argument("--timed", type=int, default=1, help="timed generations per process (after one untimed)")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} missing: bazel build //bench:generate_bench")
    runs = {1: [], 2: []}
    for _ in range(args.repeats):
        for tp in (1, 2):
            runs[tp].append(run(tp, args.cores, args.timed))
    one, two = runs[1], runs[2]
    assert all(r["tokens"] == one[0]["tokens"] for r in one + two), "layouts generated different token counts"
    weights = one[0]["weight_bytes"]
    ratios = [statistics.median(b["seconds"]) / statistics.median(a["seconds"]) for a, b in zip(one, two)]
    mib = 1 << 20
    rows = [
        ("time per generation, s (tp=1)", spread([statistics.median(r["seconds"]) for r in one])),
        ("time per generation, s (tp=2)", spread([statistics.median(r["seconds"]) for r in two])),
        ("time ratio tp=2 / tp=1 (per pair)", spread(ratios)),
        ("tokens per generation", str(one[0]["tokens"])),
        ("weights, MiB (whole)", f"{weights / mib:.1f}"),
        ("weights per rank, MiB (tp=2)", ", ".join(f"{b / mib:.1f}" for b in two[0]["rank_weight_bytes"])),
        ("weights per rank / whole (tp=2)", ", ".join(f"{b / weights:.3f}" for b in two[0]["rank_weight_bytes"])),
        ("KV cache theory per rank, MiB (tp=1 / tp=2)",
         f"{one[0]['rank_kv_theory_bytes'] / mib:.1f} / {two[0]['rank_kv_theory_bytes'] / mib:.1f}"),
        ("process peak RSS - RSS before the model, MiB (tp=1)",
         spread([(r["peak_rss"] - r["rss_before"]) / mib for r in one])),
        ("process peak RSS - RSS before the model, MiB (tp=2)",
         spread([(r["peak_rss"] - r["rss_before"]) / mib for r in two])),
    ]
    if args.markdown:
        print("| measure | median [min, max] |\n|---|---|")
        for k, v in rows:
            print(f"| {k} | {v} |")
    else:
        for k, v in rows:
            print(f"{k}: {v}")
    print(json.dumps({"tp1": one, "tp2": two}), file=sys.stderr)


if __name__ == "__main__":
    main()
