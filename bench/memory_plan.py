#!/usr/bin/env python3
"""`coordinator plan` against measured peaks: for two learner layouts (one
process; two data-parallel ranks under ZeRO-1), the learner memory the plan
predicts per rank beside the peak resident set a real GRPO step reaches in
rlmesh's Trainer (bench/learner_step_bench, one process per rank, the
learner's own Configure and TCMalloc).

  bazel build //coordinator //bench:learner_step_bench && python3 bench/memory_plan.py [--markdown]

The model is a random Llama written by transformers (hidden 512, 8 layers, 8
heads / 4 KV heads, MLP 1408, vocabulary 32000: 56.4M parameters). The
experiment given to `coordinator plan --json` is the step the bench takes: a
GRPO stage of `groups` prompts x `group_size` samples per step, prompts of
prompt_len tokens and max_new_tokens = response_len, kl.coef 0.

Compared: the plan's learner bytes less its "runtime" term, against the
peak resident set minus the resident set before the trainer existed (what
LibTorch's start-up takes, reported separately: the plan's runtime term).
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
BENCH = COORDINATOR = None  # under --bazel_bin
SHAPE = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6)
GROUP_SIZE, PROMPT, RESPONSE = 4, 32, 96
# (name, ranks, zero, groups per step): the rows a rank trains set the
# log-prob chunk's size, so K=1 runs at two.
LAYOUTS = [("K=1, 32 rows", 1, 0, 8), ("K=1, 16 rows", 1, 0, 4), ("dp=2 ZeRO-1, 16 rows a rank", 2, 1, 8)]


def measure(model_dir, world, zero, groups, work, serial, threads):
    store = os.path.join(work, f"store-{serial}")
    procs = []
    for rank in range(world):
        procs.append(subprocess.Popen(
            [BENCH, f"--model_dir={model_dir}", f"--threads={max(1, threads // world)}", "--warmup=1", "--steps=2",
             f"--groups={groups}", f"--group_size={GROUP_SIZE}", f"--prompt_len={PROMPT}",
             f"--response_len={RESPONSE}", f"--world={world}", f"--rank={rank}", f"--store={store}",
             f"--zero={zero}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for rank, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=900)
        if p.returncode != 0:
            sys.exit(f"rank {rank} failed ({p.returncode}):\n{stderr[-3000:]}")
        mem = [json.loads(l)["memory"] for l in stdout.splitlines() if l.startswith("{") and '"memory"' in l][0]
        out.append(dict(peak=mem["peak_rss"] - mem["rss_before"], runtime=mem["rss_before"], params=mem["params"]))
    return out


def plan(model_dir, world, zero, groups, work):
    # Prompts of PROMPT tokens (the char tokenizer: a BOS and PROMPT - 1
    # characters), completions of up to RESPONSE: the rows the bench trains.
    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": str(i) * (PROMPT - 1), "answer": "1"}) + "\n")
    exp = os.path.join(work, "exp.yaml")
    with open(exp, "w") as f:
        f.write(f"name: plan_bench\ntask: {{kind: jsonl, train_path: {data}, eval_path: {data}}}\n"
                f"model: {{init: checkpoint, path: {model_dir}, tokenizer: char}}\n"
                f"stages: [{{grpo: {{rl: {{steps: 1, prompts_per_step: {groups}, samples_per_prompt: {GROUP_SIZE}, "
                "optimizer: {lr: 1.0e-5}}}}]\n"
                f"learner: {{shards: {world}, zero: {zero}}}\n"
                f"rollout: {{sampling: {{max_new_tokens: {RESPONSE}}}}}\n")
    text = subprocess.run([COORDINATOR, "plan", exp, "--json"], capture_output=True, text=True, check=True).stdout
    j = json.loads(text[text.index("{"):])
    learner = [r for r in j["roles"] if r["role"].startswith("learner")][0]
    return learner["each"] - learner["parts"]["runtime"], learner["parts"]["runtime"], j["parameters"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--bazel_bin", default=os.path.join(ROOT, "bazel-bin"), help="where the binaries are")
    args = ap.parse_args()
    global BENCH, COORDINATOR
    BENCH = os.path.join(args.bazel_bin, "bench/learner_step_bench")
    COORDINATOR = os.path.join(args.bazel_bin, "coordinator/coordinator")
    for b in (BENCH, COORDINATOR):
        if not os.access(b, os.X_OK):
            sys.exit("build first: bazel build //coordinator //bench:learner_step_bench")
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        model_dir = os.path.join(work, "llama")
        LlamaForCausalLM(LlamaConfig(**SHAPE)).save_pretrained(model_dir)
        serial = 0
        for name, world, zero, groups in LAYOUTS:
            predicted, runtime_plan, params_plan = plan(model_dir, world, zero, groups, work)
            peaks, runtimes = [], []
            for _ in range(args.repeats):
                serial += 1
                ranks = measure(model_dir, world, zero, groups, work, serial, args.threads)
                assert all(r["params"] == params_plan for r in ranks), (ranks, params_plan)
                peaks += [r["peak"] for r in ranks]
                runtimes += [r["runtime"] for r in ranks]
            r = dict(layout=name, params=params_plan, plan_mib=predicted / 2**20,
                     peak_mib=statistics.median(peaks) / 2**20, peak_min=min(peaks) / 2**20,
                     peak_max=max(peaks) / 2**20, ratio=statistics.median(peaks) / predicted,
                     runtime_mib=statistics.median(runtimes) / 2**20, runtime_plan_mib=runtime_plan / 2**20)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr)
    if args.markdown:
        print("| layout | plan MiB per rank | measured peak MiB per rank, median (min-max) | measured / plan "
              "| start-up MiB measured / plan |")
        print("| --- | --- | --- | --- | --- |")
        for r in rows:
            print(f"| {r['layout']} | {r['plan_mib']:.0f} | {r['peak_mib']:.0f} ({r['peak_min']:.0f}-"
                  f"{r['peak_max']:.0f}) | {r['ratio']:.2f} | {r['runtime_mib']:.0f} / {r['runtime_plan_mib']:.0f} |")
    bad = [r for r in rows if abs(r["ratio"] - 1) > 0.15]
    if bad:
        sys.exit(f"plan off by more than 15%: {[r['layout'] for r in bad]}")


if __name__ == "__main__":
    main()
