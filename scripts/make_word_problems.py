#!/usr/bin/env python3
"""Writes the small GSM8K-style word-problem sample shipped in configs/data/.

Each line: {"id", "prompt", "answer"} where the answer ends in "#### <n>", the
final-answer convention the numeric_answer verifier reads. Deterministic.
Usage: scripts/make_word_problems.py [OUT_DIR]
"""
import json
import random
import sys

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana"]
THINGS = ["apples", "books", "coins", "pens", "shells", "stamps"]


def problem(rng):
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    kind = rng.choice(["buy", "give", "twice"])
    if kind == "buy":
        q = f"{name} has {a} {thing} and gets {b} more. How many {thing} now?"
        steps, n = f"{a}+{b}={a + b}", a + b
    elif kind == "give":
        a, b = max(a, b), min(a, b)
        q = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?"
        steps, n = f"{a}-{b}={a - b}", a - b
    else:
        q = f"{name} has {a} {thing}. A friend has twice as many. How many does the friend have?"
        steps, n = f"2*{a}={2 * a}", 2 * a
    return q, f"{steps} #### {n}"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "configs/data"
    rng = random.Random(2026)
    seen = set()
    rows = []
    while len(rows) < 240:
        q, a = problem(rng)
        if q in seen:
            continue
        seen.add(q)
        rows.append((q, a))
    for split, part in (("train", rows[:200]), ("eval", rows[200:])):
        with open(f"{out}/word_problems_{split}.jsonl", "w") as f:
            for i, (q, a) in enumerate(part):
                f.write(json.dumps({"id": f"{split}/{i}", "prompt": q, "answer": a}) + "\n")


if __name__ == "__main__":
    main()
