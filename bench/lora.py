#!/usr/bin/env python3
"""LoRA against full fine-tuning on the learner: one GRPO step per process
through bench/learner_step_bench (rlmesh's Trainer, one process), with a KL
reference in both (rl.kl.coef 0.05), on a Llama written by transformers.
The sides alternate repeat by repeat.

  bazel build //bench:learner_step_bench
  python3 bench/lora.py [--bin PATH] [--ranks 16 64] [--repeats 3] [--markdown]

Theory, bytes, fp32, P the policy's parameters, T the adapters' (the
trainable parameters under LoRA):
  state, full   24 P   weights 4, AdamW's two moments 8, DataParallel's flat
                       copies of weights and gradients 8, the KL reference's
                       frozen copy 4
  state, LoRA   4 P + 20 T   the frozen base 4 P; the adapters' weights 4,
                       moments 8 and flat copies 8 per trainable parameter;
                       no reference (the policy with its adapters off)
  gradients     4 P (full), 4 T (LoRA)
  activations   as bench/learner_memory.py: N x L x 4 x (9H + 4KV + 4I + A + 4)
                + N x 4 x 3H + R x C x V x 4 x 3, and under LoRA N x L x 4 x 7r
                for each adapter's x A^T, kept for B's gradient
The state is the resident set once the trainer is configured, the peak the
process's peak, both minus the resident set before the trainer existed. A
weight sync is Trainer::SyncTensors(): the whole policy, or the adapters.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bazel-bin/bench/learner_step_bench")
CFG = dict(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
           num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6)
CHUNK = 64  # learner_step_bench's --logprob_chunk default
KL_COEF = 0.05
# 8 groups of 4 samples, 32 prompt + 96 response tokens: 4096 tokens, 32 rows.
GROUPS, GROUP_SIZE, PROMPT, RESPONSE = 8, 4, 32, 96
MIB = 2**20


def activations(rank, rows, tokens):
    H, I, A, L = CFG["hidden_size"], CFG["intermediate_size"], CFG["num_attention_heads"], CFG["num_hidden_layers"]
    KV = CFG["num_key_value_heads"] * H // A
    layer = 4 * (9 * H + 4 * KV + 4 * I + A + 4) + 4 * 7 * rank
    return tokens * L * layer + tokens * 4 * 3 * H + rows * CHUNK * CFG["vocab_size"] * 4 * 3


def theory(rank, params, trainable, rows, tokens):
    if rank == 0:
        state, grads = 24 * params, 4 * params
    else:
        state, grads = 4 * params + 20 * trainable, 4 * trainable
    return state, state + grads + activations(rank, rows, tokens)


def run(binary, model_dir, rank, threads, steps, warmup):
    cmd = [binary, f"--model_dir={model_dir}", f"--threads={threads}", f"--warmup={warmup}", f"--steps={steps}",
           f"--groups={GROUPS}", f"--group_size={GROUP_SIZE}", f"--prompt_len={PROMPT}", f"--response_len={RESPONSE}",
           f"--kl_coef={KL_COEF}", f"--lora_rank={rank}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    par = [l["parameters"] for l in lines if "parameters" in l][0]
    mem = [l["memory"] for l in lines if "memory" in l][0]
    st = [l for l in lines if "seconds" in l]
    tokens = int(st[0]["tokens"])
    state, total = theory(rank, par["total"], par["trainable"], GROUPS * GROUP_SIZE, tokens)
    return dict(rank=rank, tokens=tokens, params=par["total"], trainable=par["trainable"],
                sync_bytes=par["sync_bytes"], policy_bytes=par["policy_bytes"],
                state_mib=(mem["rss_configured"] - mem["rss_before"]) / MIB, state_theory_mib=state / MIB,
                peak_mib=(mem["peak_rss"] - mem["rss_before"]) / MIB, peak_theory_mib=total / MIB,
                seconds=statistics.median(s["seconds"] for s in st),
                seconds_optimizer=statistics.median(s["seconds_optimizer"] for s in st))


def spread(xs, fmt="{:.2f}"):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def markdown(results, ranks):
    full = [r for r in results if r["rank"] == 0]
    print("| side | trainable params | state MiB measured / theory | peak MiB measured / theory "
          "| optimizer state MiB (8 B x trainable) | MiB per sync (/ full policy) | step s | step / full "
          "| optimizer s | optimizer / full |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for rank in [0] + ranks:
        rs = [r for r in results if r["rank"] == rank]
        if not rs:
            continue
        r0 = rs[0]
        name = "full fine-tuning" if rank == 0 else f"LoRA rank {rank}"
        ratio = [r["seconds"] / f["seconds"] for r, f in zip(rs, full)]
        oratio = [r["seconds_optimizer"] / f["seconds_optimizer"] for r, f in zip(rs, full)]
        print(f"| {name} | {r0['trainable'] / 1e6:.3f}M ({100 * r0['trainable'] / r0['params']:.2f}%) | "
              f"{spread([r['state_mib'] for r in rs], '{:.0f}')} / {r0['state_theory_mib']:.0f} | "
              f"{spread([r['peak_mib'] for r in rs], '{:.0f}')} / {r0['peak_theory_mib']:.0f} | "
              f"{8 * r0['trainable'] / MIB:.1f} | "
              f"{r0['sync_bytes'] / MIB:.2f} ({100 * r0['sync_bytes'] / r0['policy_bytes']:.2f}%) | "
              f"{spread([r['seconds'] for r in rs])} | {'—' if rank == 0 else spread(ratio)} | "
              f"{spread([r['seconds_optimizer'] for r in rs], '{:.3f}')} | {'—' if rank == 0 else spread(oratio, '{:.3f}')} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=BIN, help="learner_step_bench binary")
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64], help="LoRA ranks against full fine-tuning")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (the peak covers them too)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per process (the median is kept)")
    ap.add_argument("--out", help="append one JSON line per run to this file")
    ap.add_argument("--from_json", help="print the table of a previous --out file instead of running")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.from_json:
        results = [json.loads(l) for l in open(args.from_json)]
        markdown(results, sorted({r["rank"] for r in results if r["rank"] > 0}))
        return
    if not os.access(args.bin, os.X_OK):
        sys.exit("build first: bazel build //bench:learner_step_bench (or pass --bin)")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CFG))
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters", file=sys.stderr)
    results = []
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        for rep in range(args.repeats):
            sides = [0] + args.ranks
            if rep % 2:
                sides.reverse()
            for rank in sides:
                r = run(args.bin, d, rank, args.threads, args.steps, args.warmup)
                r["repeat"] = rep
                results.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(r) + "\n")
    if args.markdown:
        markdown(results, args.ranks)


if __name__ == "__main__":
    main()
