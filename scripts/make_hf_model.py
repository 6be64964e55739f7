#!/usr/bin/env python3
"""Writes a small, randomly initialised model folder laid out as the Hugging
Face Hub ships one, to try configs/grpo_hf_model.yaml without a download
and to test the engine against transformers:

  python3 scripts/make_hf_model.py /tmp/tiny_qwen3 --arch qwen3
  bazel run //coordinator -- run configs/grpo_hf_model.yaml --set model.path=/tmp/tiny_qwen3

--arch picks the family and its conventions:
  llama3     Llama-3.2 style: tied embeddings, llama3 RoPE scaling, a BOS,
             <|eot_id|> and <|end_of_text|> as stop tokens
  qwen2      Qwen2.5 style: q/k/v biases, tied embeddings, ChatML
  qwen3      Qwen3 dense: QK-norm, an explicit head_dim, ChatML
  qwen3_moe  Qwen3-MoE: 4 experts, 2 per token

The folder holds model.safetensors (or shards with
model.safetensors.index.json, --shard_bytes), config.json,
generation_config.json with two eos ids and sampling defaults,
tokenizer.json (a byte-level BPE trained with PyPI `tokenizers` on the
shipped word problems), and tokenizer_config.json with the tokens as
AddedToken objects and a chat template that renders tools and tool calls.

The untrained model is random, so its completions are noise; so that they
end, the stop tokens are made likelier than the rest (an offset on their
logits, --stop_rate per token). Uses PyPI torch, transformers and
tokenizers; nothing in the engine imports them.
"""
import argparse
import json
import os

import torch

import byte_level_bpe

# ChatML with tools: a system turn listing the tools (JSON) when given, tool
# calls of an assistant turn as <tool_call> JSON, tool results as a user turn.
CHATML = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- 'Tools:' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": '"
    " + (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Llama 3 headers; the BOS opens the text; tools go into the system turn.
LLAMA3 = (
    "{{- bos_token }}"
    "{%- if tools or messages[0].role == 'system' %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}"
    "{%- if tools %}{{- '\\nTools:' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}{%- if message.role != 'system' %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for call in message.tool_calls %}"
    "{{- '{\"name\": \"' + call.function.name + '\", \"parameters\": ' + (call.function.arguments | tojson) + '}' }}"
    "{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + ('ipython' if message.role == 'tool' else message.role) + '<|end_header_id|>\\n\\n'"
    " + message.content | trim + '<|eot_id|>' }}"
    "{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

FAMILIES = {
    "llama3": {
        "specials": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eot_id|>", "<|eom_id|>", "<|finetune_right_pad_id|>"],
        "bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|finetune_right_pad_id|>",
        "stop": ["<|eot_id|>", "<|end_of_text|>"], "template": LLAMA3,
    },
    "qwen": {
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                     "<tool_response>", "</tool_response>", "<think>", "</think>"],
        "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>",
        "stop": ["<|im_end|>", "<|endoftext|>"], "template": CHATML,
    },
}


def texts(data):
    with open(data) as f:
        for line in f:
            row = json.loads(line)
            yield row["prompt"]
            yield row["answer"]
    yield "system user assistant tool Tools: name arguments parameters calculator expression"


def model_config(arch, vocab, ids, args):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig
    common = dict(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                  num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=args.max_positions, rms_norm_eps=1e-6,
                  bos_token_id=ids["bos"], eos_token_id=ids["stop"], pad_token_id=ids["pad"])
    if arch == "llama3":
        return LlamaConfig(**common, tie_word_embeddings=True, rope_theta=500000.0,
                           rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1000000.0)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=24, tie_word_embeddings=True, rope_theta=1000000.0)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**common, head_dim=16, moe_intermediate_size=args.hidden, num_experts=4,
                              num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                              mlp_only_layers=[], tie_word_embeddings=False, rope_theta=1000000.0)
    raise SystemExit(f"unknown --arch {arch}")


def stop_rate(model, stop, vocab, seed):
    """Mean probability, over random contexts, that the next token is a stop token."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (8, 24), generator=g)
    with torch.no_grad():
        probs = model(input_ids=ids).logits.float().softmax(-1)
    return probs[..., stop].sum(-1).mean().item()


def favour_stops(model, stop, vocab, target, seed):
    """Raises the stop tokens' logits by a constant, found by bisection, so that
    about `target` of the probability mass per token goes to them. Dimension 0
    of the residual stream is made a positive constant (every embedding has it,
    and no layer writes to it); the output rows of the stop tokens get a larger
    weight on it than the others."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = emb.data_ptr() == head.data_ptr()
    with torch.no_grad():
        emb[:, 0] = 1.0
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p[0, :] = 0.0
            elif name.endswith(("o_proj.bias", "down_proj.bias")):
                p[0] = 0.0
        lo, hi = 0.0, 40.0
        for _ in range(30):
            mid = (lo + hi) / 2
            offset = torch.zeros(vocab)
            offset[stop] = mid
            head[:, 0] = 1.0 + offset if tied else offset
            if stop_rate(model, stop, vocab, seed) < target:
                lo = mid
            else:
                hi = mid
        offset = torch.zeros(vocab)
        offset[stop] = lo
        head[:, 0] = 1.0 + offset if tied else offset


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="folder to write")
    ap.add_argument("--arch", required=True, choices=["llama3", "qwen2", "qwen3", "qwen3_moe"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--max_positions", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=400)
    ap.add_argument("--stop_rate", type=float, default=0.015,
                    help="probability per token of a stop token in random contexts")
    ap.add_argument("--shard_bytes", default="", help="e.g. 200KB: shards with an index, as large models ship")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs",
                                                   "data", "word_problems_train.jsonl"))
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    family = FAMILIES["llama3" if args.arch == "llama3" else "qwen"]
    torch.manual_seed(args.seed)
    tok = byte_level_bpe.train(texts(args.data), args.vocab, family["specials"])
    vocab = tok.get_vocab_size()
    ids = {k: (tok.token_to_id(family[k]) if family[k] else None) for k in ("bos", "eos", "pad")}
    ids["stop"] = [tok.token_to_id(t) for t in family["stop"]]

    config = model_config(args.arch, vocab, ids, args)
    model = AutoModelForCausalLM.from_config(config).eval()
    favour_stops(model, ids["stop"], vocab, args.stop_rate, args.seed)
    save = {}
    if args.shard_bytes:
        save["max_shard_size"] = args.shard_bytes
    model.save_pretrained(args.out, **save)

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=family["bos"], eos_token=family["eos"],
                                   pad_token=family["pad"], model_max_length=args.max_positions)
    fast.chat_template = family["template"]
    fast.save_pretrained(args.out)
    # The Hub's instruct models name every end of turn in generation_config.json.
    gen = GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["stop"], pad_token_id=ids["pad"],
                           do_sample=True, temperature=0.9, top_p=0.95, top_k=40)
    gen.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {args.arch}, {n / 1e6:.2f}M parameters, vocab {vocab}, stop ids {ids['stop']}, "
          f"stop probability {stop_rate(model, ids['stop'], vocab, args.seed + 1):.3f} per token")


if __name__ == "__main__":
    main()
