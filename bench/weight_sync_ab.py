#!/usr/bin/env python3
"""Weight-sync A/B between two commits: bench/weight_sync_bench.cc built at a
reference commit and at the working tree (bench/ab_trees.py), run
alternately (order reversed every other repeat), same flags, one script run.

  python3 bench/weight_sync_ab.py --ref REF --repeats 5 [--markdown] [-- --sync_mb=512 ...]

Each run hands the same fp32 tensors from a publisher to a receiver in a
second process, several rounds; per side it reports the hand-off time
(median of the runs' medians, min-max), GB/s, the ratio to the reference,
and the peak resident set above each round's start on the publisher and the
receiver, against the bytes handed off.
"""
import argparse
import json
import statistics
import subprocess
import sys

from ab_trees import ROOT, build, reference_tree

TARGET = "weight_sync_bench"
RULE = '''
cc_binary(
    name = "weight_sync_bench",
    srcs = ["weight_sync_bench.cc"],
    deps = [
        ":process_memory",
        "//common:subprocess",
        "//dist:device",
        "//weight_sync",
        "@libtorch//:torch",
        "@system//:absl",
    ],
)
'''
MIB = 2**20


def spread(values):
    return statistics.median(values), min(values), max(values)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True, help="reference commit")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("flags", nargs="*", help="flags for weight_sync_bench (after --)")
    args = ap.parse_args()
    ref_tree = reference_tree(args.ref, TARGET, ["bench/weight_sync_bench.cc", "bench/process_memory.h"], RULE)
    bins = {"ref": build(ref_tree, TARGET), "new": build(ROOT, TARGET)}
    runs = {"ref": [], "new": []}
    for rep in range(args.repeats):
        for side in (["ref", "new"] if rep % 2 == 0 else ["new", "ref"]):
            out = subprocess.run([bins[side]] + args.flags, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            runs[side].append(r)
            print(f"repeat {rep} {side}: hand-off {statistics.median(r['handoff_s']):.3f} s, publisher peak "
                  f"{max(r['publisher_peak_bytes']) / MIB:.0f} MiB, receiver peak "
                  f"{max(r['receiver_peak_bytes']) / MIB:.0f} MiB", file=sys.stderr)
    rows = {}
    for side, rs in runs.items():
        handoff = [statistics.median(r["handoff_s"]) for r in rs]
        rows[side] = dict(
            handoff=spread(handoff),
            publish=spread([statistics.median(r["publish_s"]) for r in rs]),
            pub_peak=spread([max(r["publisher_peak_bytes"]) / MIB for r in rs]),
            recv_peak=spread([max(r["receiver_peak_bytes"]) / MIB for r in rs]),
            recv_first=spread([r["receiver_first_peak_bytes"] / MIB for r in rs]),
            mib=rs[0]["bytes"] / MIB, backend=rs[0]["backend"])
    print(json.dumps(rows, indent=1))
    if args.markdown:
        fmt = lambda t, p=0: f"{t[0]:.{p}f} ({t[1]:.{p}f}-{t[2]:.{p}f})"
        print("| side | hand-off s, median (min-max) | GB/s | time vs reference | publisher peak MiB | "
              "receiver peak MiB, later rounds | receiver peak MiB, round 1 |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for side in ("ref", "new"):
            r = rows[side]
            name = f"reference ({args.ref})" if side == "ref" else "this tree"
            gbps = r["mib"] * MIB / 1e9 / r["handoff"][0]
            print(f"| {name} | {fmt(r['handoff'], 3)} | {gbps:.2f} | {r['handoff'][0] / rows['ref']['handoff'][0]:.2f} | "
                  f"{fmt(r['pub_peak'])} | {fmt(r['recv_peak'])} | {fmt(r['recv_first'])} |")


if __name__ == "__main__":
    main()
