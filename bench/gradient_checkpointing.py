#!/usr/bin/env python3
"""learner.gradient_checkpointing against the plain learner: peak memory and
step time of one GRPO step (bench/learner_step_bench, one process per run)
on a Llama written by transformers, for micro-batches of increasing size.
The two settings run alternated, repeat by repeat, in this one script.

  bazel build //bench:learner_step_bench && python3 bench/gradient_checkpointing.py [--markdown]

Theory of the activations, bytes, fp32 (the notation of
bench/learner_memory.py: N tokens in the micro-batch, L layers, hidden H,
per layer and token 4 x (9H + 4KV + 4I + A + 4) kept for its backward):
  plain          N x L x 4 x (9H + 4KV + 4I + A + 4)
  checkpointed   N x L x 4 x H   (each block's input)
               + N x 4 x (9H + 4KV + 4I + A + 4)  (one block recomputed at a
                 time in the backward)
plus, in both, N x 4 x 3H for the embedding and the final norm and one
log-prob chunk. The measured figure is the peak resident set minus the
resident set before the trainer existed.
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
from learner_memory import BIN, layer_activation_bytes, outside_layers_bytes, parse_bench  # noqa: E402

# bench/learner_memory.py's model with 8 layers instead of 4.
CFG = dict(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
           num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False, rms_norm_eps=1e-6)
# (groups, group size, prompt, response): 2k, 4k and 8k tokens, one micro-batch each.
BATCHES = [(4, 4, 32, 96), (8, 4, 32, 96), (8, 8, 32, 96)]


def activations(tokens, rows, checkpointed):
    L, H = CFG["num_hidden_layers"], CFG["hidden_size"]
    per_layer = layer_activation_bytes(CFG)
    fixed = outside_layers_bytes(CFG, rows, tokens)
    if checkpointed:
        # Each block's input, and one block's activations while it is recomputed.
        return tokens * L * 4 * H + tokens * per_layer + fixed
    return tokens * L * per_layer + fixed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit("build first: bazel build //bench:learner_step_bench")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CFG))
    results = {}  # (batch index, checkpointed) -> list of (peak bytes, median step seconds, loss line)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        for rep in range(args.repeats):
            for b, (groups, size, prompt, response) in enumerate(BATCHES):
                # Alternate which setting goes first.
                order = [False, True] if (rep + b) % 2 == 0 else [True, False]
                for ckpt in order:
                    out = subprocess.run(
                        [BIN, f"--model_dir={d}", f"--threads={args.threads}", "--warmup=1", "--steps=2",
                         f"--groups={groups}", f"--group_size={size}", f"--prompt_len={prompt}",
                         f"--response_len={response}", "--micro_batch_tokens=16384",
                         f"--gradient_checkpointing={'true' if ckpt else 'false'}"],
                        capture_output=True, text=True, check=True).stdout
                    secs, mem, tokens = parse_bench(out)
                    peak = mem["peak_rss"] - mem["rss_before"]
                    results.setdefault((b, ckpt), []).append((peak, statistics.median(secs), tokens))
                    print(json.dumps(dict(rep=rep, tokens=tokens, checkpointed=ckpt, peak_mib=peak / 2**20,
                                          step_s=statistics.median(secs))), file=sys.stderr)
    if args.markdown:
        print("| tokens (rows) | activations theory MiB: plain / checkpointed | peak MiB plain | peak MiB "
              "checkpointed | peak saved MiB (theory) | step s plain | step s checkpointed | time ratio |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for b, (groups, size, _, _) in enumerate(BATCHES):
            plain, ckpt = results[(b, False)], results[(b, True)]
            tokens, rows = plain[0][2], groups * size
            tp, tc = activations(tokens, rows, False), activations(tokens, rows, True)

            def med(xs, i):
                return statistics.median(x[i] for x in xs)

            def spread(xs, i):
                return f"{min(x[i] for x in xs):.2f}-{max(x[i] for x in xs):.2f}"

            ratios = [c[1] / p[1] for p, c in zip(plain, ckpt)]
            print(f"| {tokens} ({rows}) | {tp / 2**20:.0f} / {tc / 2**20:.0f} | {med(plain, 0) / 2**20:.0f} | "
                  f"{med(ckpt, 0) / 2**20:.0f} | {(med(plain, 0) - med(ckpt, 0)) / 2**20:.0f} "
                  f"({(tp - tc) / 2**20:.0f}) | {med(plain, 1):.2f} ({spread(plain, 1)}) | "
                  f"{med(ckpt, 1):.2f} ({spread(ckpt, 1)}) | {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
