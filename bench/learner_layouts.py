#!/usr/bin/env python3
"""Learner layouts through the real Trainer: per-step time and memory per
rank of one GRPO step for K=1, data parallelism (dp=2), ZeRO-3 (dp=2,
zero 3) and tensor parallelism (tp=2, with and without sequence
parallelism), each rank a process of bench/learner_step_bench (the
learner's own Configure: groups, broadcast, layout, optimizer), layouts
alternated (order reversed every other repeat). With --moe: a Qwen3-MoE
(bench/expert_parallel.py's model) under K=1, dp=2 and expert parallelism
(ep=2).

  bazel build //bench:learner_step_bench
  python3 bench/learner_layouts.py --repeats 3 [--moe] [--markdown]

bench/tensor_parallel.py measures the model-parallel libraries alone; this
adds what the trainer keeps beside them. Every layout uses the same cores:
K=1 gets --cores intra-op threads, each rank of a two-rank layout half.

Theory of the training state per rank (fp32, P parameters: `sliced` split
by TP, `replicated` norms), as bench/tensor_parallel.py states it:
  K=1, dp=2      20 P                      weights 4, AdamW moments 8,
                                           DataParallel's flat weights and
                                           gradients 8
  tp=2           20 (sliced / 2 + replicated)
  ZeRO-3, dp=2   20 P / 2
  tp x dp ZeRO-3 20 (sliced / tp + replicated) / dp (ZeRO-3 over the
                 replicas of each TP rank's slices)
  ep=2 (MoE)     20 (replicated + experts / 2)
plus, on rank 0 under EP, and under TP and ZeRO-3 with
weight_sync.whole_model ("tp=2 whole_model", "dp=2 ZeRO-3 whole_model"), the
whole policy's weights (4 P) that the trainer keeps there for weight sync and
checkpoints. With weight sync in pieces (the default) rank 0 gathers it only
for checkpoints; under ZeRO-3 every rank then keeps its slice of the weights
for the sync, 4 (sliced / 2 + replicated). --layouts picks some. Measured: the
resident set once the trainer is configured minus the one before it
existed (LibTorch's start-up); peak: the peak resident set minus the same.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tensor_parallel import SHAPE, param_counts  # noqa: E402  (the same model as the library bench)
import expert_parallel  # noqa: E402  (its MoE model for --moe)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bazel-bin/bench/learner_step_bench")
# (name, world, tp, sequence parallel, zero, ep, weight_sync.whole_model)
LAYOUTS = [("K=1", 1, 1, False, 0, 1, False), ("dp=2", 2, 1, False, 0, 1, False),
           ("dp=2 ZeRO-3", 2, 1, False, 3, 1, False), ("tp=2", 2, 2, False, 0, 1, False),
           ("tp=2 + SP", 2, 2, True, 0, 1, False), ("tp=2 whole_model", 2, 2, False, 0, 1, True),
           ("dp=2 ZeRO-3 whole_model", 2, 1, False, 3, 1, True), ("tp=2 x dp=2", 4, 2, False, 0, 1, False),
           ("tp=2 x dp=2 ZeRO-3", 4, 2, False, 3, 1, False)]
MOE_LAYOUTS = [("K=1", 1, 1, False, 0, 1, False), ("dp=2", 2, 1, False, 0, 1, False),
               ("ep=2", 2, 1, False, 0, 2, False)]


def dense_model():
    """bench/tensor_parallel.py's random Llama (SHAPE), as transformers
    initialises it under the caller's torch seed."""
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=SHAPE["vocab"], hidden_size=SHAPE["hidden"], intermediate_size=SHAPE["intermediate"],
        num_hidden_layers=SHAPE["layers"], num_attention_heads=SHAPE["heads"],
        num_key_value_heads=SHAPE["kv_heads"], max_position_embeddings=256, tie_word_embeddings=False,
        rms_norm_eps=1e-6))


def run_layout(layout, model_dir, cores, steps, workdir, serial, shape, binary=BIN, save="", extra=()):
    """One run of `layout`, a process per rank (`extra`: more flags for each);
    per rank: state/peak MiB, step s, first loss, the critic's elements held,
    and with `save` (a checkpoint path) the save's seconds and its own peak
    over the resident set before it, MiB (and the same for the load, with
    --load in `extra`)."""
    name, world, tp, sp, zero, ep, whole = layout
    store = os.path.join(workdir, f"store-{serial}")
    procs = []
    for rank in range(world):
        args = [binary, f"--model_dir={model_dir}", f"--threads={max(1, cores // world)}", "--warmup=1",
                f"--steps={steps}", f"--groups={shape['batch'] // 2}", "--group_size=2", "--prompt_len=32",
                f"--response_len={shape['seq'] - 32}", f"--world={world}", f"--rank={rank}", f"--store={store}",
                f"--tp={tp}", f"--sequence_parallel={'true' if sp else 'false'}", f"--zero={zero}", f"--ep={ep}",
                f"--whole_model={'true' if whole else 'false'}", f"--save={save}", *extra]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    ranks = []
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            sys.exit(f"{name} rank {rank} failed ({p.returncode}):\n{err[-3000:]}")
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        mem = [l["memory"] for l in lines if "memory" in l][0]
        secs = [l["seconds"] for l in lines if "seconds" in l]
        loss = [l["loss"] for l in lines if "loss" in l]
        ranks.append(dict(state=(mem["rss_configured"] - mem["rss_before"]) / 2**20,
                          peak=(mem["peak_rss"] - mem["rss_before"]) / 2**20, step=statistics.median(secs),
                          loss=loss[0], params=mem["params"], critic_held=mem.get("critic_held", 0)))
        saves = [l["save"] for l in lines if "save" in l]
        if save:
            ranks[-1].update(save_seconds=saves[0]["seconds"],
                             save_peak=(saves[0]["peak_rss"] - saves[0]["rss_before"]) / 2**20)
        loads = [l["load"] for l in lines if "load" in l]  # with --load among `extra`
        if loads:
            ranks[-1].update(load_seconds=loads[0]["seconds"],
                             load_peak=(loads[0]["peak_rss"] - loads[0]["rss_before"]) / 2**20)
    return ranks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--moe", action="store_true", help="a Qwen3-MoE under K=1, dp=2 and ep=2")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--layouts", default="", help="comma-separated layout names to run (default all; K=1 always)")
    args = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit("build first: bazel build //bench:learner_step_bench")
    torch.manual_seed(0)
    if args.moe:
        shape, layouts = expert_parallel.SHAPE, MOE_LAYOUTS
        replicated, experts = expert_parallel.param_counts(shape)
        P = replicated + experts
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
            vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=4 * shape["hidden"],
            moe_intermediate_size=shape["moe_intermediate"], num_hidden_layers=shape["layers"],
            num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
            head_dim=shape["hidden"] // shape["heads"], num_experts=shape["experts"],
            num_experts_per_tok=shape["experts_per_tok"], norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6))
    else:
        shape, layouts = SHAPE, LAYOUTS
        sliced, replicated = param_counts(SHAPE)
        P = sliced + replicated
        model = dense_model()
    if args.layouts:
        wanted = set(args.layouts.split(",")) | {"K=1"}
        unknown = wanted - {l[0] for l in layouts}
        if unknown:
            sys.exit(f"--layouts: unknown {sorted(unknown)}; known: {[l[0] for l in layouts]}")
        layouts = [l for l in layouts if l[0] in wanted]
    results = {l[0]: [] for l in layouts}
    with tempfile.TemporaryDirectory() as d:
        model_dir = os.path.join(d, "model")
        model.save_pretrained(model_dir)
        serial = 0
        for rep in range(args.repeats):
            order = layouts if rep % 2 == 0 else list(reversed(layouts))
            for layout in order:
                serial += 1
                ranks = run_layout(layout, model_dir, args.cores, args.steps, d, serial, shape)
                results[layout[0]].append(ranks)
                print(json.dumps(dict(layout=layout[0], repeat=rep, ranks=ranks)), file=sys.stderr)
    rows = []
    for name, world, tp, sp, zero, ep, whole in layouts:
        runs = results[name]
        step = [max(r["step"] for r in ranks) for ranks in runs]  # a step ends when its slowest rank does
        per_rank = []
        for rank in range(world):
            if zero == 3:
                theory = 20 * (sliced / tp + replicated) / (world // tp)
            elif ep > 1:
                theory = 20 * (replicated + experts / ep)
            elif tp > 1:
                theory = 20 * (sliced / tp + replicated)
            else:
                theory = 20 * P
            # Rank 0's whole copy of the policy: under TP and ZeRO-3 only
            # with weight_sync.whole_model (in pieces it is gathered for
            # checkpoints only).
            if rank == 0 and (ep > 1 or ((tp > 1 or zero == 3) and whole)):
                theory += 4 * P
            # ZeRO-3 in pieces: every rank keeps its slice of the weights
            # for weight sync (the norms whole).
            if zero == 3 and not whole:
                theory += 4 * (sliced / world + replicated)
            per_rank.append(dict(rank=rank, state=statistics.median(r[rank]["state"] for r in runs),
                                 peak=statistics.median(r[rank]["peak"] for r in runs),
                                 peak_min=min(r[rank]["peak"] for r in runs),
                                 peak_max=max(r[rank]["peak"] for r in runs), theory=theory / 2**20))
        rows.append(dict(layout=name, step_median=statistics.median(step), step_min=min(step), step_max=max(step),
                         loss=runs[0][0]["loss"], ranks=per_rank))
    base = rows[0]
    for r in rows:
        r["time_ratio"] = r["step_median"] / base["step_median"]
        for k in r["ranks"]:
            k["state_ratio"] = k["state"] / base["ranks"][0]["state"]
            k["theory_ratio"] = k["theory"] / base["ranks"][0]["theory"]
            k["peak_ratio"] = k["peak"] / base["ranks"][0]["peak"]
    print(json.dumps(dict(params=P, rows=rows), indent=1))
    if args.markdown:
        print(f"{P / 1e6:.1f}M parameters; batch {shape['batch']} x {shape['seq']} tokens; {args.cores} cores; "
              f"{args.repeats} repeats alternated, {args.steps} timed steps each.\n")
        print("| layout | rank | s/step median (min-max) | time ratio | state MiB measured / theory "
              "| state ratio measured / theory | peak MiB median (min-max) | peak ratio | first loss |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            for k in r["ranks"]:
                step = (f"{r['step_median']:.3f} ({r['step_min']:.3f}-{r['step_max']:.3f})" if k["rank"] == 0
                        else "")
                ratio = f"{r['time_ratio']:.2f}" if k["rank"] == 0 else ""
                print(f"| {r['layout']} | {k['rank']} | {step} | {ratio} | {k['state']:.0f} / {k['theory']:.0f} | "
                      f"{k['state_ratio']:.2f} / {k['theory_ratio']:.2f} | {k['peak']:.0f} "
                      f"({k['peak_min']:.0f}-{k['peak_max']:.0f}) | {k['peak_ratio']:.2f} | "
                      f"{r['loss']:.5f} |")


if __name__ == "__main__":
    main()
