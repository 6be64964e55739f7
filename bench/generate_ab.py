#!/usr/bin/env python3
"""Generation A/B between two commits: bench/generate_bench.cc built at a
reference commit and at the working tree, run alternately (order reversed
every other repeat), same flags, same machine, one script run.

  python3 bench/generate_ab.py --ref REF --repeats 5 [--markdown] [-- --requests=128 ...]

The reference tree is a git worktree under /tmp with this tree's
generate_bench.cc (and its BUILD rule when missing) copied in, so both sides
run the same measurement code on their own actor/generate.cc. Reports
tokens/s (median, min-max) for each side, the ratio, and peak memory above
start-up against the theory (weights + KV cache of max_batch rows of the
longest sequence).
"""
import argparse
import json
import statistics
import subprocess
import sys

from ab_trees import ROOT, build, reference_tree

RULE = '''
cc_binary(
    name = "generate_bench",
    srcs = ["generate_bench.cc"],
    deps = [
        "//actor:generate",
        "//actor:model",
        "@libtorch//:torch",
        "@system//:absl",
    ],
)
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True, help="reference commit")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("flags", nargs="*", help="flags for generate_bench (after --)")
    args = ap.parse_args()
    bins = {"ref": build(reference_tree(args.ref, "generate_bench", ["bench/generate_bench.cc"], RULE), "generate_bench"),
            "new": build(ROOT, "generate_bench")}
    runs = {"ref": [], "new": []}
    for rep in range(args.repeats):
        order = ["ref", "new"] if rep % 2 == 0 else ["new", "ref"]
        for side in order:
            out = subprocess.run([bins[side], "--repeats=1"] + args.flags, check=True, capture_output=True,
                                 text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            runs[side].append(r)
            print(f"repeat {rep} {side}: {r['tokens'] / r['seconds'][0]:.1f} tok/s, peak above start "
                  f"{(r['peak_rss'] - r['rss_before']) / 2**20:.0f} MiB", file=sys.stderr)
    rows = {}
    for side, rs in runs.items():
        tps = [r["tokens"] / r["seconds"][0] for r in rs]
        peak = [(r["peak_rss"] - r["rss_before"]) / 2**20 for r in rs]
        theory = (rs[0]["weight_bytes"] + rs[0]["kv_theory_bytes"]) / 2**20
        rows[side] = dict(tps=statistics.median(tps), tps_min=min(tps), tps_max=max(tps),
                          peak=statistics.median(peak), peak_min=min(peak), peak_max=max(peak), theory=theory,
                          tokens=rs[0]["tokens"])
    print(json.dumps(rows, indent=1))
    if args.markdown:
        print("| side | tok/s median (min-max) | ratio | peak MiB above start-up, median (min-max) | theory MiB "
              "(weights + KV cache) | peak / theory |")
        print("| --- | --- | --- | --- | --- | --- |")
        for side in ("ref", "new"):
            r = rows[side]
            name = f"reference ({args.ref})" if side == "ref" else "this tree"
            print(f"| {name} | {r['tps']:.1f} ({r['tps_min']:.1f}-{r['tps_max']:.1f}) | "
                  f"{r['tps'] / rows['ref']['tps']:.2f} | {r['peak']:.0f} ({r['peak_min']:.0f}-{r['peak_max']:.0f}) | "
                  f"{r['theory']:.0f} | {r['peak'] / r['theory']:.2f} |")


if __name__ == "__main__":
    main()
