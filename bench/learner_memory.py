#!/usr/bin/env python3
"""The learner's memory against its theory: rlmesh's Trainer (one GRPO step
through bench/learner_step_bench, one process) on a Llama written by
transformers, for batches of increasing size.

  bazel build //bench:learner_step_bench && python3 bench/learner_memory.py [--markdown]

Theory, bytes, fp32, P parameters, N tokens in the micro-batch, L layers,
hidden H, KV = kv_heads x head_dim, MLP width I, A heads, vocabulary V,
log-prob chunk C time steps over R rows:
  state       20 P   weights 4, AdamW's two moments 8, DataParallel's flat
                     copies of weights and gradients 8
  gradients    4 P   the parameters' .grad
  activations  N x L x 4 x (9H + 4KV + 4I + A + 4), what each decoder
                     layer keeps for its backward: the two RMSNorms' inputs
                     and outputs (4H), q and rotate_half(q) for RoPE (2H),
                     k and rotate_half(k) (2KV), the attention's roped q, k,
                     v and output (2H + 2KV) with its log-sum-exp (A), o's
                     input (H), gate, silu(gate), up and their product (4I),
                     and per-row norm statistics (4)
             + N x 4 x 3H        the embedding output and the final norm
             + R x C x V x 4 x 3 one chunk of logits, its softmax and its
                                 gradient (chunks are recomputed, never kept)
The measured figure is the peak resident set minus the resident set before
the trainer existed (LibTorch's start-up), from one process per batch size.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bazel-bin/bench/learner_step_bench")
CFG = dict(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
           num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6)
CHUNK = 64  # learner_step_bench's --logprob_chunk default
# (groups, group size, prompt, response): 1k, 4k and 8k tokens in one micro-batch.
BATCHES = [(2, 4, 32, 96), (8, 4, 32, 96), (8, 8, 32, 96)]


def parse_bench(stdout):
    """learner_step_bench's output -> (per-step seconds, its "memory" record, tokens per step)."""
    lines = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
    secs = [l["seconds"] for l in lines if "seconds" in l]
    mem = [l["memory"] for l in lines if "memory" in l][0]
    tokens = int([l for l in lines if "tokens" in l][0]["tokens"])
    return secs, mem, tokens


def layer_activation_bytes(cfg):
    """What one decoder layer keeps per token for its backward (the docstring's term)."""
    H, I, A = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    KV = cfg["num_key_value_heads"] * H // A
    return 4 * (9 * H + 4 * KV + 4 * I + A + 4)


def outside_layers_bytes(cfg, rows, tokens):
    """The embedding output, the final norm and one log-prob chunk."""
    return tokens * 4 * 3 * cfg["hidden_size"] + rows * CHUNK * cfg["vocab_size"] * 4 * 3


def theory(params, rows, tokens):
    state = 20 * params
    grads = 4 * params
    acts = tokens * CFG["num_hidden_layers"] * layer_activation_bytes(CFG) + outside_layers_bytes(CFG, rows, tokens)
    return state, grads, acts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit("build first: bazel build //bench:learner_step_bench")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CFG))
    rows_out = []
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        for groups, size, prompt, response in BATCHES:
            out = subprocess.run([BIN, f"--model_dir={d}", f"--threads={args.threads}", "--warmup=1", "--steps=2",
                                  f"--groups={groups}", f"--group_size={size}", f"--prompt_len={prompt}",
                                  f"--response_len={response}"], capture_output=True, text=True, check=True).stdout
            _, mem, tokens = parse_bench(out)
            rows = groups * size
            state, grads, acts = theory(mem["params"], rows, tokens)
            configured = mem["rss_configured"] - mem["rss_before"]
            peak = mem["peak_rss"] - mem["rss_before"]
            total = state + grads + acts
            r = dict(tokens=tokens, rows=rows, params=mem["params"], state_mib=configured / 2**20,
                     state_theory_mib=state / 2**20, peak_mib=peak / 2**20, theory_mib=total / 2**20,
                     grads_mib=grads / 2**20, acts_mib=acts / 2**20, ratio=peak / total)
            rows_out.append(r)
            print(json.dumps(r), file=sys.stderr)
    if args.markdown:
        print("| tokens (rows) | state MiB measured / theory | theory MiB: state + grads + activations = total "
              "| peak MiB | peak / theory |")
        print("| --- | --- | --- | --- | --- |")
        for r in rows_out:
            print(f"| {r['tokens']} ({r['rows']}) | {r['state_mib']:.0f} / {r['state_theory_mib']:.0f} | "
                  f"{r['state_theory_mib']:.0f} + {r['grads_mib']:.0f} + {r['acts_mib']:.0f} = {r['theory_mib']:.0f} | "
                  f"{r['peak_mib']:.0f} | {r['ratio']:.2f} |")


if __name__ == "__main__":
    main()
