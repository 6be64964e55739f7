"""actor/ benchmark: our LibTorch model vs transformers on the same weights,
same machine, same run. Writes bench/actor.md.

  bazel build //actor:actor_bench && python3 bench/actor_bench.py [--threads 1,2] [--repeats 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CFG = dict(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
           num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False)
B, T, NEW, PROMPT = 8, 128, 64, 16


def timeit(fn, repeats, warm=1):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def python_runs(model, repeats):
    rows = []
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CFG["vocab_size"], (B, T), generator=g)
    with torch.no_grad():
        for s in timeit(lambda: model(input_ids=ids), repeats):
            rows.append(("forward", B, B * T, s))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step():
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    for s in timeit(step, repeats):
        rows.append(("train", B, B * T, s))
    for batch in (1, 16, 64):
        prompts = torch.tensor([[(i * 7) % CFG["vocab_size"]] * PROMPT for i in range(batch)])
        with torch.no_grad():
            gen = lambda: model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                         max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
            for s in timeit(gen, repeats, warm=0):
                rows.append(("decode", batch, batch * NEW, s))
    return rows


def matmul_rate(repeats):
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    secs = timeit(lambda: a @ b, repeats * 4, warm=2)
    return 2 * 1024 ** 3 / statistics.median(secs)


def gemm_floor(model, batch, repeats):
    """Seconds of one decode step's matrix products alone at `batch` rows:
    every layer's q/k/v/o and gate/up/down projections and the output head,
    on the model's own weights (attention over the cache, norms, RoPE and
    sampling left out). No implementation's decode step can be faster than
    this on the same cores, so batch / floor bounds decode tokens/s."""
    F = torch.nn.functional
    x = torch.randn(batch, CFG["hidden_size"])
    mlp_x = torch.randn(batch, CFG["intermediate_size"])
    weights = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        weights += [(x, a.q_proj.weight), (x, a.k_proj.weight), (x, a.v_proj.weight), (x, a.o_proj.weight),
                    (x, m.gate_proj.weight), (x, m.up_proj.weight), (mlp_x, m.down_proj.weight)]
    weights.append((x, model.lm_head.weight))

    def step():
        for inp, w in weights:
            F.linear(inp, w)

    with torch.no_grad():
        return statistics.median(timeit(step, repeats * 20, warm=5))


def summary(rows):
    by = {}
    for what, batch, tokens, s in rows:
        by.setdefault((what, batch), []).append(tokens / s)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in by.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--binary", default="bazel-bin/actor/actor_bench")
    ap.add_argument("--out", default="bench/actor.md")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CFG)).eval()
    n_params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    load_before = os.getloadavg()
    lines = [
        "# actor/ benchmark: rlmesh (LibTorch C++) vs transformers (PyTorch eager)",
        "",
        f"Model: Llama, hidden {CFG['hidden_size']}, {CFG['num_hidden_layers']} layers, {CFG['num_attention_heads']} heads"
        f" / {CFG['num_key_value_heads']} KV heads, MLP {CFG['intermediate_size']}, vocab {CFG['vocab_size']},"
        f" fp32, CPU; {args.repeats} repeats; the same weights in both (saved by transformers,"
        " loaded by our reader). Forward and train: batch 8 x 128 tokens (train = forward + backward + AdamW;"
        " ours computes the loss with the chunked log-prob path). Decode: greedy, prompt 16, 64 new tokens"
        " (transformers: `generate()` with its KV cache; ours: `Generator`). Each measurement runs ours and then"
        " transformers back to back in one script, interleaved repeat by repeat.",
        "",
    ]
    for threads in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(threads)
        model.load_state_dict(init_state)
        ours, ref = [], []
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            # Interleave the two sides repeat by repeat so that both see the
            # same background load on this shared machine.
            for _ in range(args.repeats):
                proc = subprocess.run([args.binary, d, str(threads), "1"], capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit("actor_bench failed: " + proc.stderr)
                ours += [(j["what"], j["batch"], j["tokens"], j["seconds"])
                         for j in map(json.loads, proc.stdout.splitlines())]
                model.load_state_dict(init_state)
                ref += python_runs(model, 1)
        rate = matmul_rate(args.repeats)
        floors = {batch: gemm_floor(model, batch, args.repeats) for batch in (1, 16, 64)}
        so, sr = summary(ours), summary(ref)
        lines += [
            f"## {threads} intra-op thread(s)",
            "",
            "| measurement | batch | rlmesh tok/s median (min-max) | transformers tok/s median (min-max) | ratio |"
            " GEMM ceiling tok/s | ceiling / transformers |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for key in sorted(so, key=lambda k: (["forward", "train", "decode"].index(k[0]), k[1])):
            o, r = so[key], sr[key]
            ceiling = ""
            if key[0] == "decode":
                c = key[1] / floors[key[1]]
                ceiling = f" {c:.0f} | {c / r[0]:.2f}x |"
            else:
                ceiling = " | |"
            lines.append(f"| {key[0]} | {key[1]} | {o[0]:.0f} ({o[1]:.0f}-{o[2]:.0f}) |"
                         f" {r[0]:.0f} ({r[1]:.0f}-{r[2]:.0f}) | {o[0] / r[0]:.2f}x |{ceiling}")
        flops_tok = 6 * n_params  # fwd + bwd matmul FLOPs per token (attention scores excluded)
        ours_train = so[("train", B)][0] * flops_tok
        ref_train = sr[("train", B)][0] * flops_tok
        lines += [
            "",
            f"fp32 matmul rate (1024^3, same process, {threads} thread(s)): {rate / 1e9:.0f} GFLOP/s. Training step"
            f" (6 x {n_params / 1e6:.1f}M non-embedding params x tokens/s): rlmesh {ours_train / 1e9:.0f} GFLOP/s"
            f" = {100 * ours_train / rate:.0f}% of it; transformers {ref_train / 1e9:.0f} GFLOP/s"
            f" = {100 * ref_train / rate:.0f}%.",
            "",
        ]
    load_after = os.getloadavg()
    lines += [
        f"Load average (1 min) before/after: {load_before[0]:.1f} / {load_after[0]:.1f} on {os.cpu_count()} cores.",
        "The machine is shared with other engineers' builds and tests; under such load 2 OpenMP threads",
        "collapse (a descheduled thread stalls every barrier), so the 1-thread table is the steadier comparison.",
        "Targets: decode >= 2x transformers, training step >= Python eager, >= 60% of the matmul rate.",
        "",
        "## Notes",
        "",
        "- Exactness (from `bazel test //actor:checkpoint_test`, not this script): fp32 logits of four tiny",
        "  Llama/Qwen2 variants (GQA and MHA, tied and untied, q/k/v bias) match transformers with max |diff| 0",
        "  (the same LibTorch kernels in the same order), greedy generations are identical, and folders we write",
        "  (single and sharded) load in transformers with identical logits.",
        "- Decode per step runs ~40 small ops per layer; at batch 1 it is bound by reading the weights (51 MB",
        "  fp32 per token), at batch 64 by the projections. The GEMM ceiling column is batch / (seconds of one",
        "  decode step's matrix products alone, timed with torch on the same weights and threads): no decode",
        "  step can beat it on these cores, so `ceiling / transformers` is the most any implementation could",
        "  gain over `generate()` here.",
        "- Fused q/k/v and gate/up projections (one GEMM instead of three and two) were measured at these",
        "  shapes with torch on 1 thread: no gain within noise (16 rows: 980/927 us separate against 861/944",
        "  fused; 64 rows: 3164/3131 against 3073/3274), so they were not built. Membership changes of the",
        "  running batch move one KV-cache row in place instead of copying the cache (session 15;",
        "  bench/rollout.md); these fixed-length decodes never change membership, so it does not show here.",
        "  CUDA graphs on GPU are not built.",
        "- GPU: this task had no GPU machine, so the bf16 CUDA parity run and decode vs. the memory-bandwidth",
        "  bound (weight bytes / copy rate) are not measured. The code is device-agnostic (`LoadOptions.device`,",
        "  tensors follow the model's device) but has not run on CUDA.",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
