#!/usr/bin/env python3
"""`coordinator plan` against measured peaks: for each learner layout (one
process; two data-parallel ranks under ZeRO-1; tensor, pipeline (1F1B and
interleaved) and context parallelism over two ranks; pipeline x tensor and
context x tensor parallelism over four), the
learner memory the plan predicts for each rank beside the peak resident set
a real GRPO step reaches in rlmesh's Trainer (bench/learner_step_bench, one
process per rank, the learner's own Configure and TCMalloc).

  bazel build //coordinator //bench:learner_step_bench && python3 bench/memory_plan.py [--markdown]

The model is a random Llama written by transformers (hidden 512, 8 layers, 8
heads / 4 KV heads, MLP 1408, vocabulary 32000: 56.4M parameters). The
experiment given to `coordinator plan --json` is the step the bench takes: a
GRPO stage of `groups` prompts x `group_size` samples per step, prompts of
prompt_len tokens and max_new_tokens = response_len, kl.coef 0.

Compared, rank by rank: the plan's bytes for the role that rank is (rank 0
may differ from the others, a pipeline's stages differ) less its "runtime"
term, against the peak resident set minus the resident set before the
trainer existed (what LibTorch's start-up takes, reported separately: the
plan's runtime term).
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
# (name, ranks, groups per step, learner settings): the rows a rank trains
# set the log-prob chunk's size, so K=1 runs at two.
LAYOUTS = [("K=1, 32 rows", 1, 8, {}), ("K=1, 16 rows", 1, 4, {}),
           ("dp=2 ZeRO-1, 16 rows a rank", 2, 8, {"zero": 1}),
           ("tp=2, 32 rows", 2, 8, {"tp": 2}),
           ("pp=2, 32 rows in 4 micro-batches", 2, 8, {"pp": 2}),
           ("pp=2 interleaved (2 virtual stages), 32 rows in 4 micro-batches", 2, 8,
            {"pp": 2, "pp_schedule": "interleaved", "pp_virtual_stages": 2}),
           ("pp=2 x tp=2, 32 rows in 4 micro-batches", 4, 8, {"pp": 2, "tp": 2}),
           ("cp=2, 32 rows", 2, 8, {"cp": 2}),
           ("cp=2 x tp=2, 32 rows", 4, 8, {"cp": 2, "tp": 2})]


def measure(model_dir, world, groups, settings, work, serial, threads):
    store = os.path.join(work, f"store-{serial}")
    flags = [f"--{k}={v}" for k, v in settings.items()]
    procs = []
    for rank in range(world):
        procs.append(subprocess.Popen(
            [BENCH, f"--model_dir={model_dir}", f"--threads={max(1, threads // world)}", "--warmup=1", "--steps=2",
             f"--groups={groups}", f"--group_size={GROUP_SIZE}", f"--prompt_len={PROMPT}",
             f"--response_len={RESPONSE}", f"--world={world}", f"--rank={rank}", f"--store={store}"] + flags,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for rank, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=900)
        if p.returncode != 0:
            sys.exit(f"rank {rank} failed ({p.returncode}):\n{stderr[-3000:]}")
        mem = [json.loads(l)["memory"] for l in stdout.splitlines() if l.startswith("{") and '"memory"' in l][0]
        out.append(dict(peak=mem["peak_rss"] - mem["rss_before"], runtime=mem["rss_before"], params=mem["params"]))
    return out


def plan(model_dir, world, groups, settings, work):
    """The plan's learner bytes (less the runtime term) for each rank, its
    runtime term and the parameter count."""
    # Prompts of PROMPT tokens (the char tokenizer: a BOS and PROMPT - 1
    # characters), completions of up to RESPONSE: the rows the bench trains.
    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w") as f:
        for i in range(4):
            f.write(json.dumps({"prompt": str(i) * (PROMPT - 1), "answer": "1"}) + "\n")
    exp = os.path.join(work, "exp.yaml")
    learner = ", ".join([f"shards: {world}"] + [f"{k}: {v}" for k, v in settings.items()])
    with open(exp, "w") as f:
        f.write(f"name: plan_bench\ntask: {{kind: jsonl, train_path: {data}, eval_path: {data}}}\n"
                f"model: {{init: checkpoint, path: {model_dir}, tokenizer: char}}\n"
                f"stages: [{{grpo: {{rl: {{steps: 1, prompts_per_step: {groups}, samples_per_prompt: {GROUP_SIZE}, "
                "optimizer: {lr: 1.0e-5}}}}]\n"
                f"learner: {{{learner}}}\n"
                f"rollout: {{sampling: {{max_new_tokens: {RESPONSE}}}}}\n")
    text = subprocess.run([COORDINATOR, "plan", exp, "--json"], capture_output=True, text=True, check=True).stdout
    j = json.loads(text[text.index("{"):])
    roles = {r["role"]: r for r in j["roles"] if r["role"].startswith("learner")}
    assert sum(r["count"] for r in roles.values()) == world, (roles, world)

    def role_of(rank):
        # Rank r is stage (r / tp) % pp of a pipeline; rank 0 may hold more.
        pp, tp = settings.get("pp", 1), settings.get("tp", 1)
        if rank == 0:
            for name in ("learner 0 (stage 0)", "learner 0"):
                if name in roles:
                    return name
        return f"learner stage {rank // tp % pp}" if pp > 1 else "learner"

    ranks = [(role_of(k), roles[role_of(k)]["each"] - roles[role_of(k)]["parts"]["runtime"]) for k in range(world)]
    runtime = next(iter(roles.values()))["parts"]["runtime"]
    return ranks, runtime, j["parameters"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--bazel_bin", default=os.path.join(ROOT, "bazel-bin"), help="where the binaries are")
    ap.add_argument("--layouts", nargs="*", default=[], help="only these layouts (their names); default all")
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
        for name, world, groups, settings in LAYOUTS:
            if args.layouts and name not in args.layouts:
                continue
            predicted, runtime_plan, params_plan = plan(model_dir, world, groups, settings, work)
            # The plan's roles in rank order: one row per distinct role.
            by_role = {}
            for rank, (role, bytes_) in enumerate(predicted):
                by_role.setdefault(role, dict(plan=bytes_, ranks=[]))["ranks"].append(rank)
            peaks = {role: [] for role in by_role}
            runtimes = []
            for _ in range(args.repeats):
                serial += 1
                ranks = measure(model_dir, world, groups, settings, work, serial, args.threads)
                # Rank 0 holds the whole policy unless it travels in pieces
                # (TP): then no rank does.
                assert ranks[0]["params"] in (params_plan, 0), (ranks, params_plan)
                for role, v in by_role.items():
                    peaks[role] += [ranks[k]["peak"] for k in v["ranks"]]
                runtimes += [r["runtime"] for r in ranks]
            for role, v in by_role.items():
                p = peaks[role]
                r = dict(layout=name, role=role, ranks=v["ranks"], params=params_plan, plan_mib=v["plan"] / 2**20,
                         peak_mib=statistics.median(p) / 2**20, peak_min=min(p) / 2**20, peak_max=max(p) / 2**20,
                         ratio=statistics.median(p) / v["plan"], runtime_mib=statistics.median(runtimes) / 2**20,
                         runtime_plan_mib=runtime_plan / 2**20)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr)
    if args.markdown:
        print("| layout | ranks (plan's role) | plan MiB per rank | measured peak MiB per rank, median (min-max) "
              "| measured / plan | start-up MiB measured / plan |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in rows:
            ranks = ", ".join(str(k) for k in r["ranks"])
            print(f"| {r['layout']} | {ranks} ({r['role']}) | {r['plan_mib']:.0f} | {r['peak_mib']:.0f} "
                  f"({r['peak_min']:.0f}-{r['peak_max']:.0f}) | {r['ratio']:.2f} | "
                  f"{r['runtime_mib']:.0f} / {r['runtime_plan_mib']:.0f} |")
    bad = [r for r in rows if abs(r["ratio"] - 1) > 0.15]
    if bad:
        sys.exit(f"plan off by more than 15%: {[(r['layout'], r['role']) for r in bad]}")


if __name__ == "__main__":
    main()
