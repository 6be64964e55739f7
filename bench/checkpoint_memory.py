#!/usr/bin/env python3
"""What a learner checkpoint costs in memory, per rank, for each layout:
the peak resident set of Trainer::Save over the resident set just before it
(bench/learner_step_bench --save, which resets the kernel's peak first), and
its time. Two builds side by side, alternated: `--bin` (this tree) and
`--baseline_bin` (an older one), on bench/tensor_parallel.py's model after
one GRPO step of bench/learner_layouts.py's batch.

  bazel build //bench:learner_step_bench
  python3 bench/checkpoint_memory.py --baseline_bin /path/to/old/learner_step_bench --repeats 3 [--markdown]
      [--load] [--layouts "K=1,dp=2 ZeRO-3"]

With --load each rank then loads the checkpoint it saved (Trainer::Load, as a
resume does) and the load's own peak is reported the same way. Theory of a
load's extra memory: the whole policy's weights, 4 P, on every rank of a
split layout (each reads the whole model and keeps its part), plus the
moments: 8 P where a rank rebuilds them whole, about 8 P / dp where a ZeRO-3
rank without TP reads only its share of them.

Theory of the extra memory a save needs on a rank (fp32, P parameters, U the
largest unit of the fully sharded model, the embedding or the head, and the
largest parameter under TP, the embedding or lm_head, about the same):
  K=1                 ~0   the files are written from the tensors held
  gathered whole (the baseline, before streaming): every rank taking part
                      8 P of moments (each gathered tensor cloned, then
                      concatenated) and, with weight sync in pieces, rank 0
                      the whole policy, 4 P
  streamed (this tree, ZeRO-3 and TP without ZeRO-1): 4 U on every rank
                      taking part, one gathered unit or parameter at a time;
                      rank 0's whole policy, where weight sync keeps it
                      (whole_model), is written from there
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import learner_layouts  # noqa: E402  (its layouts and its launcher)
from tensor_parallel import SHAPE, param_counts  # noqa: E402

LAYOUTS = [l for l in learner_layouts.LAYOUTS
           if l[0] in ("K=1", "dp=2 ZeRO-3", "dp=2 ZeRO-3 whole_model", "tp=2", "tp=2 whole_model")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=learner_layouts.BIN)
    ap.add_argument("--baseline_bin", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--load", action="store_true", help="also load each checkpoint back and report the load")
    ap.add_argument("--layouts", default="", help="comma-separated layout names (default all)")
    args = ap.parse_args()
    layouts = [l for l in LAYOUTS + [l for l in learner_layouts.LAYOUTS if l[0] == "tp=2 x dp=2 ZeRO-3"]
               if not args.layouts or l[0] in args.layouts.split(",")]
    for b in (args.bin, args.baseline_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"not an executable: {b} (bazel build //bench:learner_step_bench)")
    torch.manual_seed(0)
    sliced, replicated = param_counts(SHAPE)
    P = sliced + replicated
    U = SHAPE["vocab"] * SHAPE["hidden"] + SHAPE["hidden"]  # the head unit: lm_head and the final norm
    model = learner_layouts.dense_model()
    sides = [("this tree", args.bin), ("baseline", args.baseline_bin)]
    results = {(l[0], side): [] for l in layouts for side, _ in sides}
    with tempfile.TemporaryDirectory() as d:
        model_dir = os.path.join(d, "model")
        model.save_pretrained(model_dir)
        serial = 0
        for rep in range(args.repeats):
            order = sides if rep % 2 == 0 else list(reversed(sides))
            for layout in layouts:
                for side, binary in order:
                    serial += 1
                    ckpt = os.path.join(d, f"ckpt-{serial}")
                    ranks = learner_layouts.run_layout(layout, model_dir, args.cores, 1, d, serial, SHAPE,
                                                       binary=binary, save=ckpt,
                                                       extra=["--load"] if args.load else [])
                    results[(layout[0], side)].append(ranks)
                    print(json.dumps(dict(layout=layout[0], side=side, repeat=rep, ranks=ranks)), file=sys.stderr)
    rows = []
    what = "load" if args.load else "save"
    for layout in layouts:
        for side, _ in sides:
            runs = results[(layout[0], side)]
            for rank in range(layout[1]):
                peaks = [r[rank][what + "_peak"] for r in runs]
                secs = [r[rank][what + "_seconds"] for r in runs]
                rows.append(dict(layout=layout[0], side=side, rank=rank, peak=statistics.median(peaks),
                                 peak_min=min(peaks), peak_max=max(peaks), seconds=statistics.median(secs),
                                 state=statistics.median(r[rank]["state"] for r in runs)))
    print(json.dumps(dict(params=P, largest_unit=U, measured=what, rows=rows), indent=1))
    if args.markdown:
        print(f"{P / 1e6:.1f}M parameters (4 P = {4 * P / 2**20:.0f} MiB); largest unit {U / 1e6:.1f}M "
              f"(4 U = {4 * U / 2**20:.0f} MiB); {args.cores} cores; {args.repeats} repeats alternated.\n")
        print(f"| layout | build | rank | {what} peak over the RSS before it, MiB: median (min-max) "
              f"| in units of 4 P | {what} s | state MiB |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['layout']} | {r['side']} | {r['rank']} | {r['peak']:.0f} ({r['peak_min']:.0f}-"
                  f"{r['peak_max']:.0f}) | {r['peak'] * 2**20 / (4 * P):.2f} | {r['seconds']:.2f} | "
                  f"{r['state']:.0f} |")


if __name__ == "__main__":
    main()
