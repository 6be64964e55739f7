#!/usr/bin/env python3
"""PPO's critic per rank, for each learner layout: the training state a PPO
step's trainer holds once configured, minus what the same layout holds for
GRPO (no critic), per rank, on bench/tensor_parallel.py's model. Each run is
bench/learner_layouts.py's (a process per rank of bench/learner_step_bench,
one warm-up and one timed step); the two stages and the layouts take turns,
the order of the stages reversed every other repeat.

  bazel build //bench:learner_step_bench
  python3 bench/critic_memory.py --repeats 3 [--markdown]

Theory of the critic's state per rank (fp32; the critic is the policy's
shape with a scalar head, P_c = P + H parameters of which the lm_head, V H,
is frozen: weights only, out of the optimizer; `sliced` and `replicated` as
bench/tensor_parallel.py counts them):
  K=1            4 P_c + 16 (P_c - V H)   weights, AdamW's two moments and
                                          DataParallel's flat weights and
                                          gradients of the trained part
  ZeRO-3, dp=2   that / 2                 every unit sharded, the frozen
                                          lm_head too
  tp=2           that over (sliced / 2 + replicated) instead of P
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

LAYOUTS = [l for l in learner_layouts.LAYOUTS if l[0] in ("K=1", "dp=2 ZeRO-3", "tp=2")]


def theory_mib(layout, sliced, replicated):
    H, V = SHAPE["hidden"], SHAPE["vocab"]
    name, world, tp, _, zero, _, _ = layout
    if tp > 1:
        total = sliced / tp + replicated + H
        frozen = V * H / tp
    else:
        total = sliced + replicated + H
        frozen = V * H
    state = 4 * total + 16 * (total - frozen)
    if zero == 3:
        state /= world
    return state / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not os.access(learner_layouts.BIN, os.X_OK):
        sys.exit("build first: bazel build //bench:learner_step_bench")
    torch.manual_seed(0)
    sliced, replicated = param_counts(SHAPE)
    model = learner_layouts.dense_model()
    stages = ["grpo", "ppo"]
    results = {(l[0], st): [] for l in LAYOUTS for st in stages}
    with tempfile.TemporaryDirectory() as d:
        model_dir = os.path.join(d, "model")
        model.save_pretrained(model_dir)
        serial = 0
        for rep in range(args.repeats):
            order = stages if rep % 2 == 0 else list(reversed(stages))
            for layout in LAYOUTS:
                for stage in order:
                    serial += 1
                    ranks = learner_layouts.run_layout(layout, model_dir, args.cores, 1, d, serial, SHAPE,
                                                       extra=[f"--stage={stage}"])
                    results[(layout[0], stage)].append(ranks)
                    print(json.dumps(dict(layout=layout[0], stage=stage, repeat=rep, ranks=ranks)), file=sys.stderr)
    rows = []
    for layout in LAYOUTS:
        for rank in range(layout[1]):
            grpo = [r[rank]["state"] for r in results[(layout[0], "grpo")]]
            ppo = [r[rank]["state"] for r in results[(layout[0], "ppo")]]
            critic = [p - g for p, g in zip(ppo, grpo)]  # per repeat
            held = results[(layout[0], "ppo")][0][rank]["critic_held"]
            rows.append(dict(layout=layout[0], rank=rank, critic=statistics.median(critic), critic_min=min(critic),
                             critic_max=max(critic), theory=theory_mib(layout, sliced, replicated), held=held,
                             grpo=statistics.median(grpo), ppo=statistics.median(ppo)))
    base = rows[0]
    for r in rows:
        r["ratio"] = r["critic"] / base["critic"]
        r["theory_ratio"] = r["theory"] / base["theory"]
    print(json.dumps(dict(rows=rows), indent=1))
    if args.markdown:
        print(f"{(sliced + replicated) / 1e6:.1f}M parameters; {args.cores} cores; {args.repeats} repeats "
              "alternated.\n")
        print("| layout | rank | critic elements held | state MiB, GRPO / PPO | critic MiB (PPO - GRPO): median "
              "(min-max) | theory MiB | ratio to K=1, measured / theory |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['layout']} | {r['rank']} | {r['held'] / 1e6:.2f}M | {r['grpo']:.0f} / {r['ppo']:.0f} | "
                  f"{r['critic']:.0f} ({r['critic_min']:.0f}-{r['critic_max']:.0f}) | {r['theory']:.0f} | "
                  f"{r['ratio']:.2f} / {r['theory_ratio']:.2f} |")


if __name__ == "__main__":
    main()
