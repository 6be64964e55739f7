#!/usr/bin/env python3
"""The learner's malloc, A/B: one GRPO step through rlmesh's Trainer
(bench/learner_step_bench, linked with TCMalloc as the learner binary is)
against the same step on glibc's malloc (bench/learner_step_bench_glibc,
the same source without TCMalloc), alternated repeat by repeat, same
weights, same batch, same threads.

  bazel build //bench:learner_step_bench //bench:learner_step_bench_glibc && \\
    python3 bench/learner_malloc.py [--repeats 3] [--markdown]

Shapes:
  main-job   the main job's Llama (hidden 128, 3 layers, 4 / 2 heads, MLP 344,
             the char vocabulary of 100), 64 prompts x 8 samples of 7 prompt
             and 5 response tokens: 6144 tokens, one micro-batch, as a GRPO
             step of workload (a) in bench/grpo_vs_trl.md;
  1k/4k/8k   bench/learner_memory.py's Llama (hidden 512, 4 layers, 13.9M
             parameters) at 1024, 4096 and 8192 tokens, with that script's
             theory of the peak (state + gradients + activations).
Per shape and side: the median step time of each repeat (after a warm-up
step), and the peak resident set minus the resident set before the trainer
existed, over the repeats. The ratio is glibc's median over TCMalloc's, per
repeat; > 1 means TCMalloc is faster.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import learner_memory  # noqa: E402  (CFG, BATCHES, theory, parse_bench)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = {
    "tcmalloc": os.path.join(ROOT, "bazel-bin/bench/learner_step_bench"),
    "glibc": os.path.join(ROOT, "bazel-bin/bench/learner_step_bench_glibc"),
}
MAIN_JOB = dict(vocab_size=100, hidden_size=128, intermediate_size=344, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False, rms_norm_eps=1e-6)


def run(binary, model_dir, flags, steps):
    env = dict(os.environ)
    env.setdefault("GOMP_SPINCOUNT", "100000")  # as the coordinator starts roles
    out = subprocess.run([binary, f"--model_dir={model_dir}", "--threads=2", "--warmup=1", f"--steps={steps}"] + flags,
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{binary} failed: {out.stderr[-2000:]}")
    secs, mem, tokens = learner_memory.parse_bench(out.stdout)
    return statistics.median(secs), (mem["peak_rss"] - mem["rss_before"]) / 2**20, mem["params"], tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    for b in SIDES.values():
        if not os.access(b, os.X_OK):
            sys.exit("build first: bazel build //bench:learner_step_bench //bench:learner_step_bench_glibc")
    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**MAIN_JOB)).save_pretrained(os.path.join(d, "main"))
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**learner_memory.CFG)).save_pretrained(os.path.join(d, "mem"))
        shapes = [("main-job", "main", ["--tokenizer=char", "--groups=64", "--group_size=8", "--prompt_len=7",
                                        "--response_len=5", "--lr=3e-4"], 10, None)]
        for groups, size, prompt, response in learner_memory.BATCHES:
            shapes.append((f"{groups * size * (prompt + response) // 1024}k", "mem",
                           [f"--groups={groups}", f"--group_size={size}", f"--prompt_len={prompt}",
                            f"--response_len={response}"], 3, groups * size))
        results = {}  # (shape, side) -> [(median s, peak MiB)]
        info = {}
        for rep in range(args.repeats):
            order = list(SIDES) if rep % 2 == 0 else list(reversed(SIDES))
            for name, model, flags, steps, rows in shapes:
                for side in order:
                    sec, peak, params, tokens = run(SIDES[side], os.path.join(d, model), flags, steps)
                    results.setdefault((name, side), []).append((sec, peak))
                    info[name] = (params, tokens, rows)
                    print(json.dumps(dict(repeat=rep, shape=name, side=side, step_s=sec, peak_mib=peak,
                                          tokens=tokens)), file=sys.stderr, flush=True)
    if not args.markdown:
        return
    print("| shape (tokens) | side | step s, median of repeats (min-max) | glibc / TCMalloc per repeat "
          "| peak MiB over repeats | peak / theory |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, _, _, _, rows in shapes:
        params, tokens, rows = info[name]
        total = sum(learner_memory.theory(params, rows, tokens)) / 2**20 if rows else None
        for side in SIDES:
            r = results[(name, side)]
            secs = [s for s, _ in r]
            ratios = ""
            if side == "tcmalloc":
                ratios = ", ".join(f"{g / t:.2f}" for (g, _), (t, _) in zip(results[(name, "glibc")], r))
            peaks = [p for _, p in r]
            print(f"| {name} ({tokens}) | {side} | {statistics.median(secs):.3f} ({min(secs):.3f}-{max(secs):.3f}) | "
                  f"{ratios} | {min(peaks):.0f}-{max(peaks):.0f} | "
                  f"{'' if total is None else f'{min(peaks) / total:.2f}-{max(peaks) / total:.2f}'} |")


if __name__ == "__main__":
    main()
