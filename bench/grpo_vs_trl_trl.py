#!/usr/bin/env python3
"""The TRL side of bench/grpo_vs_trl.py, run inside the benchmark's own
virtual environment (TRL is never a dependency of rlmesh itself).

  train: TRL GRPOTrainer from a Hugging Face folder on a JSONL task with
         the settings the driver passes; writes per-step wall times and the
         final model.
  eval:  greedy held-out accuracy of a Hugging Face folder, scored like
         rlmesh's numeric_answer verifier (the last number in the text).
"""
import argparse
import json
import os
import re
import time

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def length_penalty(n_tokens, max_tokens, per_token):
    # rlmesh's `length` verifier: -per_token for each token beyond max_tokens.
    return -per_token * max(0, n_tokens - max_tokens)


def score(completion, answer):
    got = NUMBER.findall(completion)
    want = NUMBER.findall(answer)
    return 1.0 if got and want and abs(float(got[-1]) - float(want[-1])) <= 1e-6 else 0.0


def load_tokenizer(folder):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"), bos_token="<bos>",
                                   eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train(a):
    import torch
    torch.set_num_threads(a.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = load_tokenizer(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    # rlmesh prompts are <bos> + the characters; the char tokenizer has no
    # post-processor and TRL tokenizes prompts without special tokens, so
    # the <bos> goes in as text (an added token: one id).
    rows = read_jsonl(a.train)
    ds = Dataset.from_list([{"prompt": "<bos>" + r["prompt"], "answer": r["answer"]} for r in rows])

    def reward(prompts, completions, answer, completion_ids=None, **kwargs):
        if a.length_max_tokens > 0:
            return [length_penalty(len(ids), a.length_max_tokens, a.length_penalty) for ids in completion_ids]
        return [score(c, x) for c, x in zip(completions, answer)]

    cfg = GRPOConfig(
        output_dir=a.out, max_steps=a.steps, seed=a.seed, use_cpu=True, report_to="none", save_strategy="no",
        logging_steps=10, disable_tqdm=True, dataloader_num_workers=0,
        per_device_train_batch_size=a.prompts * a.samples, gradient_accumulation_steps=1,
        num_generations=a.samples, max_completion_length=a.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=a.lr, lr_scheduler_type="cosine", warmup_steps=a.warmup, max_grad_norm=1.0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group", num_iterations=1,
        # TRL's own defaults are bf16 autocast and activation checkpointing;
        # rlmesh trains in fp32 without recomputation, so both sides do.
        bf16=False, gradient_checkpointing=False)

    times = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=ds, processing_class=tok,
                          callbacks=[Clock()])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    final = os.path.join(a.out, "final")
    trainer.save_model(final)
    tok.save_pretrained(final)
    steps = [t1 - t0_ for t0_, t1 in zip(times, times[1:])]
    rewards = [h.get("reward") for h in trainer.state.log_history if "reward" in h]
    lengths = [h.get("completions/mean_length") for h in trainer.state.log_history if "completions/mean_length" in h]
    json.dump({"step_seconds": steps, "wall_s": wall, "final": final, "reward_log": rewards, "length_log": lengths,
               "torch_threads": torch.get_num_threads()}, open(a.result, "w"))


def init(a):
    # A randomly initialised Llama (workload b) that both sides start from.
    import shutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    tok = load_tokenizer(a.model)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=a.hidden, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=a.max_positions, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(a.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.model, f), os.path.join(a.out, f))
    json.dump({"folder": a.out, "vocab": len(tok)}, open(a.result, "w"))


def evaluate(a):
    import torch
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM
    tok = load_tokenizer(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    rows = read_jsonl(a.eval)
    right = 0
    with torch.no_grad():
        for i in range(0, len(rows), 100):
            chunk = rows[i:i + 100]
            enc = [[tok.bos_token_id] + tok.encode(r["prompt"], add_special_tokens=False) for r in chunk]
            width = max(len(e) for e in enc)
            ids = torch.tensor([[tok.pad_token_id] * (width - len(e)) + e for e in enc])
            mask = (torch.arange(width).unsqueeze(0) >= torch.tensor([width - len(e) for e in enc]).unsqueeze(1))
            out = model.generate(input_ids=ids, attention_mask=mask.long(), do_sample=False,
                                 max_new_tokens=a.max_new_tokens, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
            for r, row in zip(out[:, width:], chunk):
                right += score(tok.decode(r, skip_special_tokens=True), row["answer"])
    json.dump({"accuracy": right / len(rows), "prompts": len(rows)}, open(a.result, "w"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "eval", "init"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--train", default="")
    ap.add_argument("--eval", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--result", required=True)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--length_max_tokens", type=int, default=0, help="> 0: the length reward instead of numeric")
    ap.add_argument("--length_penalty", type=float, default=0.01)
    for k, v in (("hidden", 512), ("intermediate", 1408), ("layers", 8), ("heads", 8), ("kv_heads", 4),
                 ("max_positions", 512)):
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    {"train": train, "eval": evaluate, "init": init}[a.mode](a)


if __name__ == "__main__":
    main()
