#!/usr/bin/env python3
"""Writes a randomly initialised tiny Qwen3-MoE as a Hugging Face folder, for
the main job's expert-parallel variant (a scratch model is always dense):

  python3 scripts/make_tiny_moe.py /tmp/tiny_moe
  bazel run //coordinator -- run $PWD/configs/grpo_arith_tiny.yaml \
      --set model.init=checkpoint --set model.path=/tmp/tiny_moe \
      --set learner.shards=2 --set learner.ep=2

The shape follows the main job's model (hidden 128, 3 layers, 4 heads / 2
KV heads, 32 positions) with every MLP a MoE layer of 4 experts, 2 per
token. The vocabulary is the char tokenizer's (100 ids: <pad> <bos> <eos>
<unk> and 96 characters, actor/tokenizer.cc). Uses PyPI transformers (what
scripts/setup.sh installs); nothing in the engine depends on it.
"""
import argparse

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="folder to write (config.json, model.safetensors)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--experts", type=int, default=4)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    config = Qwen3MoeConfig(
        vocab_size=100,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=32,
        num_experts=args.experts,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = Qwen3MoeForCausalLM(config)
    model.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: Qwen3-MoE, {n / 1e6:.2f}M parameters, {args.experts} experts per layer")


if __name__ == "__main__":
    main()
