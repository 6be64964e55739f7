#!/usr/bin/env python3
"""A PPO learner step with the critic's values packed like the policy's
log-probs against a build where only the policy's are, A/B
alternated in one script run.

  bazel build //bench:learner_step_bench
  python3 bench/critic_packing.py --baseline_bin /path/to/old/learner_step_bench --markdown

Both sides run `learner_step_bench --stage=ppo` (the policy, and a critic of
the same shape with a value head) on the same random weights and the same
synthetic batch, two intra-op threads, packing on auto, prompts shared in
each group. The shapes are bench/shared_prompts.py's with long-tailed
responses, where most of a padded row is padding: "b" (workload b's model,
4 groups x 8, prompt 6, responses of mean 100 up to 256) and "long" (2
groups x 8, prompt 200, mean 50 up to 128). A run takes one untimed step
and then its timed ones; its figure is their median. Each repeat runs both
sides, the order reversed every other repeat. The first timed step's loss
is printed beside: packing changes only the summation order.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shared_prompts import BIN, SHAPES, run, write_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline_bin", required=True, help="learner_step_bench of the build to compare against")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", default="b,long")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    for b in (BIN, a.baseline_bin):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"{b} missing: bazel build //bench:learner_step_bench")
    work = tempfile.mkdtemp(prefix="critic_packing_")
    folders, results = {}, []
    for name in a.shapes.split(","):
        model, args, _ = SHAPES[name]
        if model not in folders:
            folders[model] = os.path.join(work, model)
            write_model(folders[model], model)
        for r in range(a.repeats):
            order = [True, False] if r % 2 == 0 else [False, True]
            for new in order:
                rows = run(folders[model], {**args, "stage": "ppo"}, True, 2, 1, a.threads,
                           binary=BIN if new else a.baseline_bin)
                rec = {"shape": name, "repeat": r, "new": new,
                       "seconds": statistics.median(x["seconds"] for x in rows), "first_loss": rows[0]["loss"],
                       "packed_frac": rows[0].get("packed_frac"), "tokens": rows[0]["tokens"]}
                results.append(rec)
                print(json.dumps(rec), file=sys.stderr, flush=True)
    if a.markdown:
        print("| shape | policy packed | step s, critic packed: median (min-max) | step s, critic padded: "
              "median (min-max) | padded / packed per repeat | first loss, packed / padded |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name in a.shapes.split(","):
            on = [x for x in results if x["shape"] == name and x["new"]]
            off = [x for x in results if x["shape"] == name and not x["new"]]
            s_on, s_off = [x["seconds"] for x in on], [x["seconds"] for x in off]
            ratios = [f'{b["seconds"] / x["seconds"]:.2f}' for x, b in zip(on, off)]
            print(f"| {name} | {on[0]['packed_frac']} | {statistics.median(s_on):.2f} ({min(s_on):.2f}-{max(s_on):.2f})"
                  f" | {statistics.median(s_off):.2f} ({min(s_off):.2f}-{max(s_off):.2f}) | {', '.join(ratios)} "
                  f"| {on[0]['first_loss']:.6g} / {off[0]['first_loss']:.6g} |")


if __name__ == "__main__":
    main()
