#!/usr/bin/env python3
"""Writes configs/data/chat_tokenizer/: a small byte-level BPE tokenizer
(Qwen2-style pre-tokenizer, digits one by one, NFC) trained with PyPI
`tokenizers` on the shipped word problems, and a tokenizer_config.json whose
chat_template is a ChatML template of our own. Deterministic; run once, the
output is committed as data (the engine never imports Python).
Usage: scripts/make_chat_tokenizer.py [OUT_DIR]
"""
import json
import os
import sys

import byte_level_bpe

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML: every turn framed by <|im_start|>role ... <|im_end|>; a default
# system turn when the conversation has none; the assistant's header last
# when a reply is wanted.
TEMPLATE = (
    "{%- if messages[0].role != 'system' %}"
    "{{- '<|im_start|>system\\nSolve the problem. End with #### and the number.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def texts(root):
    for name in ("word_problems_train.jsonl",):
        with open(os.path.join(root, name)) as f:
            for line in f:
                row = json.loads(line)
                yield row["prompt"]
                yield row["answer"]
    yield "Solve the problem. End with #### and the number."
    yield "system user assistant"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    data = os.path.join(here, "..", "configs", "data")
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(data, "chat_tokenizer")
    os.makedirs(out, exist_ok=True)
    tok = byte_level_bpe.train(texts(data), 400, SPECIALS)
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 256,
        "clean_up_tokenization_spaces": False,
        "chat_template": TEMPLATE,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    print(f"{out}: vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
