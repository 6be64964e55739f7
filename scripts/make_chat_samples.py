#!/usr/bin/env python3
"""Writes the chat and corpus samples of configs/data/ from the shipped word
problems (configs/data/word_problems_{train,eval}.jsonl):

- word_problems_chat_train.jsonl: the 200 train problems as `messages`
  conversations; problems 160-199 are paired into 20 two-turn conversations
  (both assistant turns trained on), the rest are single-turn.
- word_problems_chat_eval.jsonl: the 40 held-out problems, one single-turn
  conversation each (the reference answer is the assistant turn).
- pretrain_sample.jsonl: a small corpus for continued pre-training, 40
  documents of five worked problems each, written as prose.

Deterministic; run once, the output is committed as data.
Usage: scripts/make_chat_samples.py [DATA_DIR]
"""
import json
import os
import sys


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def turn(p):
    return [{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": p["answer"]}]


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else "configs/data"
    train = read(os.path.join(data, "word_problems_train.jsonl"))
    held = read(os.path.join(data, "word_problems_eval.jsonl"))
    with open(os.path.join(data, "word_problems_chat_train.jsonl"), "w", encoding="utf-8") as f:
        for p in train[:160]:
            f.write(json.dumps({"id": p["id"], "messages": turn(p)}) + "\n")
        for i in range(160, 200, 2):
            a, b = train[i], train[i + 1]
            f.write(json.dumps({"id": a["id"] + "+" + b["id"], "messages": turn(a) + turn(b)}) + "\n")
    with open(os.path.join(data, "word_problems_chat_eval.jsonl"), "w", encoding="utf-8") as f:
        for p in held:
            f.write(json.dumps({"id": p["id"], "messages": turn(p)}) + "\n")
    with open(os.path.join(data, "pretrain_sample.jsonl"), "w", encoding="utf-8") as f:
        for d in range(40):
            parts = []
            for p in train[5 * d:5 * d + 5]:
                work, result = p["answer"].split(" #### ")
                parts.append(f"{p['prompt']} We work it out: {work}, so the answer is {result}.")
            f.write(json.dumps({"id": f"doc/{d}", "text": " ".join(parts)}) + "\n")


if __name__ == "__main__":
    main()
