#!/usr/bin/env python3
"""A GRPO learner step of a Qwen3-MoE policy with its micro-batches packed
against the same step on padded rows (what every MoE policy
got before), A/B alternated in one script run.

  bazel build //bench:learner_step_bench
  python3 bench/moe_packing.py --repeats 3 --markdown

Both sides are the same binary (`learner_step_bench --pack_rl=on|off`), the
same random weights (a Qwen3-MoE written by transformers, seed 0: workload
b's attention shape, hidden 512, 8 layers, 8 heads / 4 KV heads, every MLP
a MoE layer of 8 experts of width 704, 2 per token, the char tokenizer's 100
ids) and the same synthetic batch: workload b's, 4 groups x 8, prompt 6,
long-tailed responses of mean 100 up to 256, where most of a padded row is
padding. Two intra-op threads. A run takes one untimed step and then two
timed ones; its figure is their median. Each repeat runs both sides, the
order reversed every other repeat. The first timed step's loss is printed
beside: packing changes only the summation order.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shared_prompts import BIN, run  # noqa: E402

SHAPE = dict(groups=4, group_size=8, prompt_len=6, response_len=256, long_tail_mean=100)


def write_moe(folder):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=100, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                         hidden_size=512, intermediate_size=1408, moe_intermediate_size=704, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=512,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                         rms_norm_eps=1e-6)
    Qwen3MoeForCausalLM(cfg).save_pretrained(folder)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        raise SystemExit(f"{BIN} missing: bazel build //bench:learner_step_bench")
    folder = os.path.join(tempfile.mkdtemp(prefix="moe_packing_"), "moe")
    write_moe(folder)
    results = []
    for r in range(a.repeats):
        for packed in ([True, False] if r % 2 == 0 else [False, True]):
            rows = run(folder, {**SHAPE, "pack_rl": "on" if packed else "off"}, True, 2, 1, a.threads)
            rec = {"repeat": r, "packed": packed, "seconds": statistics.median(x["seconds"] for x in rows),
                   "first_loss": rows[0]["loss"], "packed_frac": rows[0]["packed_frac"],
                   "pad_frac": rows[0]["pad_frac"], "tokens": rows[0]["tokens"]}
            results.append(rec)
            print(json.dumps(rec), file=sys.stderr, flush=True)
    if a.markdown:
        on = [x for x in results if x["packed"]]
        off = [x for x in results if not x["packed"]]
        s_on, s_off = [x["seconds"] for x in on], [x["seconds"] for x in off]
        ratios = [f'{b["seconds"] / x["seconds"]:.2f}' for x, b in zip(on, off)]
        print("| side | packed micro-batches | padding share of the slots | step s: median (min-max) | "
              "padded / packed per repeat | first loss |")
        print("| --- | --- | --- | --- | --- | --- |")
        print(f"| packed | {on[0]['packed_frac']} | {on[0]['pad_frac']:.2f} | {statistics.median(s_on):.2f} "
              f"({min(s_on):.2f}-{max(s_on):.2f}) | {', '.join(ratios)} | {on[0]['first_loss']:.6g} |")
        print(f"| padded rows | {off[0]['packed_frac']} | {off[0]['pad_frac']:.2f} | {statistics.median(s_off):.2f} "
              f"({min(s_off):.2f}-{max(s_off):.2f}) | - | {off[0]['first_loss']:.6g} |")


if __name__ == "__main__":
    main()
