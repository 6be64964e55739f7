#!/usr/bin/env python3
"""A `command` verifier: 1 when the completion states the reference answer, else 0.

The reward server runs it once per completion, writes one JSON line to its
stdin, {"completion": ..., "prompt": ..., "reference_answer": ...}, and reads
the score, one number, from its stdout. Exit non-zero to fail the item.
"""
import json, re, sys

item = json.loads(sys.stdin.readline())
answer = item["reference_answer"].strip()
# The answer as a whole token: "42" is in "it is 42." but not in "142".
found = answer and re.search(r"(?<![\w.])" + re.escape(answer) + r"(?!\w|\.\d)", item["completion"])
print(1.0 if found else 0.0)
