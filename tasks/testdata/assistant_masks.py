"""Reference assistant masks: transformers' apply_chat_template with
return_assistant_tokens_mask on a template with {% generation %} markers.

usage: assistant_masks.py TOKENIZER_DIR TEMPLATE CONVERSATIONS_JSONL OUT_JSON

Writes [{"text", "input_ids", "assistant_masks"}, ...], one per line of the
conversations file ({"messages": [...], "tools": [...]?}).
"""
import json
import sys

from transformers import AutoTokenizer


def main():
    tok_dir, template_path, conv_path, out_path = sys.argv[1:5]
    tok = AutoTokenizer.from_pretrained(tok_dir)
    with open(template_path, encoding="utf-8") as f:
        template = f.read()
    out = []
    with open(conv_path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            kwargs = dict(chat_template=template, tools=rec.get("tools"))
            text = tok.apply_chat_template(rec["messages"], tokenize=False, **kwargs)
            enc = tok.apply_chat_template(rec["messages"], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True, **kwargs)
            ids = list(enc["input_ids"])
            # The same ids as tokenizing the rendered text.
            assert ids == tok(text, add_special_tokens=False)["input_ids"], "apply_chat_template ids differ"
            out.append({"text": text, "input_ids": ids, "assistant_masks": list(enc["assistant_masks"])})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
