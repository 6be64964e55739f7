#!/usr/bin/env python3
"""Reference renders for actor/chat_template_test.

Renders every template in TEMPLATE_DIR (*.jinja) against every case of
CONVERSATIONS (JSON) with transformers' own chat-template code, the steps
`tokenizer.apply_chat_template(..., tokenize=False)` takes: the messages are
normalised by `_normalize_chat_messages`, the special tokens are passed and
overridden by the case's kwargs, and `render_jinja_template` renders with the
Jinja environment transformers builds. The clock is fixed so that
`strftime_now` is deterministic (the C++ test uses the same instant).

Usage: render_chat_templates.py TEMPLATE_DIR CONVERSATIONS OUT_JSON
Writes {"results": [{"template", "case", "text" | "error"}]}.
"""

import datetime
import json
import os
import sys

import transformers.utils.chat_template_utils as ctu

# Also in chat_template_test.cc (as UTC there; here the naive local time
# that datetime.now() returns).
FIXED_NOW = datetime.datetime(2024, 7, 26, 15, 4, 5, 123456)


class _FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


def render_case(source, spec, case):
    messages = ctu._normalize_chat_messages(case["messages"])
    kwargs = dict(spec["special_tokens"]) if case.get("special_tokens", True) else {}
    kwargs.update(case.get("kwargs", {}))
    tools = spec["tools"] if case.get("tools") else None
    rendered, _ = ctu.render_jinja_template(
        conversations=[messages],
        tools=tools,
        documents=None,
        chat_template=source,
        add_generation_prompt=case.get("add_generation_prompt", False),
        **kwargs,
    )
    return rendered[0]


def main():
    template_dir, conversations_path, out_path = sys.argv[1:4]
    # strftime_now() calls the module's `datetime.now()` at render time.
    ctu.datetime = _FixedDatetime
    with open(conversations_path, encoding="utf-8") as f:
        spec = json.load(f)
    results = []
    for name in sorted(os.listdir(template_dir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(template_dir, name), encoding="utf-8", newline="") as f:
            source = f.read()
        for case in spec["cases"]:
            entry = {"template": name, "case": case["name"]}
            try:
                entry["text"] = render_case(source, spec, case)
            except Exception as e:  # raise_exception's TemplateError, type errors
                entry["error"] = str(e)
            results.append(entry)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"results": results}, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
