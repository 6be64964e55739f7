"""Learner RL training step: rlmesh Trainer::TrainStep (C++) vs the same step
in PyTorch eager (transformers LlamaForCausalLM), same weights, same batch,
same machine, interleaved repeat by repeat. Prints a markdown section (and
writes it to --out) for bench/learner.md.

  bazel build //bench:learner_step_bench && python3 bench/learner_step_bench.py [--threads 1,2] [--repeats 5]

One step on both sides (GRPO, token-mean, one optimizer step):
  1. no-grad forward -> per-token log-probs of the targets ("old" log-probs;
     our learner always recomputes them before the update),
  2. forward -> log-probs (+ entropy, detached, as a metric),
  3. clipped surrogate (clip 0.2) x truncated importance weight
     exp(old - behaviour) capped at 2, token-mean over the loss mask,
     with group-normalised GRPO advantages,
  4. backward, global-norm clip 1.0, AdamW (lr 1e-5, betas 0.9/0.999,
     eps 1e-8, weight decay 0).
Our side times the whole TrainStep call (proto -> tensors included); the
eager side times steps 1-4 from ready-made tensors.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CFG = dict(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
           num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6)
GROUPS, GROUP_SIZE, PROMPT, RESPONSE = 2, 4, 32, 96


def synthetic_batch(vocab):
    """The batch SyntheticGroups() in learner_step_bench.cc builds."""
    B, T = GROUPS * GROUP_SIZE, PROMPT + RESPONSE
    ids = torch.zeros(B, T, dtype=torch.long)
    behaviour = torch.zeros(B, T)
    mask = torch.zeros(B, T)
    rewards = torch.zeros(GROUPS, GROUP_SIZE, dtype=torch.float64)
    for g in range(GROUPS):
        for i in range(GROUP_SIZE):
            r = g * GROUP_SIZE + i
            for pos in range(T):
                ids[r, pos] = (1 + 37 * r + 101 * pos + (pos * pos) % 17) % vocab
            for j in range(RESPONSE):
                # Position t scores token t+1: response token j sits at t = PROMPT + j - 1.
                t = PROMPT + j - 1
                behaviour[r, t] = -7.6 - 0.01 * (j % 5)
                mask[r, t] = 0.0 if (r % 2 == 1 and j >= RESPONSE - 4) else 1.0
            rewards[g, i] = i % 3
    targets = torch.cat([ids[:, 1:], torch.full((B, 1), -1, dtype=torch.long)], 1)
    adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, unbiased=True, keepdim=True) + 1e-6)
    adv = adv.reshape(B, 1).float() * mask
    return ids, targets, behaviour, mask, adv


def token_logprobs(model, ids, targets):
    logits = model(input_ids=ids).logits.float()
    logp_all = torch.log_softmax(logits, -1)
    valid = targets.ge(0)
    logp = logp_all.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) * valid
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def eager_step(model, opt, batch, phases=None):
    """One step; `phases` (a list) gets the seconds of: no-grad pass, forward + loss, backward, clip + AdamW."""
    ids, targets, behaviour, mask, adv = batch
    t0 = time.perf_counter()
    with torch.no_grad():
        old_logp, _ = token_logprobs(model, ids, targets)
    t1 = time.perf_counter()
    logp, entropy = token_logprobs(model, ids, targets)
    on = mask.ne(0)
    ratio = torch.exp(logp - old_logp)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    pg = pg * torch.exp(old_logp - behaviour).clamp_max(2.0)
    loss = (pg * on).sum() / on.sum()
    t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=False)
    if phases is not None:
        phases.append((t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3))
    return loss.item(), grad_norm.item(), ((entropy * on).sum() / on.sum()).item()


def eager_runs(model, init_state, batch, warmup, steps):
    model.load_state_dict(init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    tokens = batch[0].numel()
    out = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        eager_step(model, opt, batch)
        secs = time.perf_counter() - t0
        if s >= warmup:
            out.append(secs)
    return tokens, out


def ours_runs(binary, model_dir, threads, warmup, steps, extra=()):
    cmd = [binary, f"--model_dir={model_dir}", f"--threads={threads}", f"--warmup={warmup}", f"--steps={steps}",
           f"--groups={GROUPS}", f"--group_size={GROUP_SIZE}", f"--prompt_len={PROMPT}",
           f"--response_len={RESPONSE}", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit("learner_step_bench failed: " + proc.stderr[-4000:])
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return rows


def matmul_rate(n=24):
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(2):
        a @ b
    secs = []
    for _ in range(n):
        t0 = time.perf_counter()
        a @ b
        secs.append(time.perf_counter() - t0)
    return 2 * 1024 ** 3 / statistics.median(secs)


def med(v):
    return statistics.median(v), min(v), max(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per repeat (after 1 warm-up), each side")
    ap.add_argument("--binary", default="bazel-bin/bench/learner_step_bench")
    ap.add_argument("--out", default="", help="also write the markdown section here")
    ap.add_argument("--raw", default="", help="write every per-step measurement as JSON here")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CFG)).train()
    n_params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    batch = synthetic_batch(CFG["vocab_size"])
    tokens = batch[0].numel()
    load_before = os.getloadavg()
    raw = []
    lines = [
        "## Learner RL step (GRPO) vs PyTorch eager",
        "",
        f"`bazel build //bench:learner_step_bench && python3 bench/learner_step_bench.py --threads {args.threads}"
        f" --repeats {args.repeats} --steps {args.steps}` (sources: `bench/learner_step_bench.cc`,"
        " `bench/learner_step_bench.py`).",
        "",
        f"Model: Llama, hidden {CFG['hidden_size']}, {CFG['num_hidden_layers']} layers,"
        f" {CFG['num_attention_heads']} heads / {CFG['num_key_value_heads']} KV heads, MLP"
        f" {CFG['intermediate_size']}, vocab {CFG['vocab_size']}, untied, fp32, CPU;"
        f" {n_params / 1e6:.1f}M non-embedding parameters. Batch: {GROUPS} groups x {GROUP_SIZE} samples,"
        f" prompt {PROMPT} + response {RESPONSE} tokens = {tokens} tokens per step (fixed lengths, no padding).",
        "",
    ]
    per_thread = {}
    for threads in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(threads)
        ours, ref, ours_fb, ours_opt = [], [], [], []
        with tempfile.TemporaryDirectory() as d:
            model.load_state_dict(init_state)
            model.save_pretrained(d)
            # Interleave the two sides repeat by repeat so that both see the
            # same background load on this shared machine.
            for rep in range(args.repeats):
                rows = ours_runs(args.binary, d, threads, 1, args.steps)
                assert all(int(r["tokens"]) == tokens for r in rows), rows
                secs = [r["seconds"] for r in rows]
                ours.append(tokens * len(secs) / sum(secs))
                ours_fb.append(statistics.mean(r["seconds_forward_backward"] for r in rows))
                ours_opt.append(statistics.mean(r["seconds_optimizer"] for r in rows))
                _, esecs = eager_runs(model, init_state, batch, 1, args.steps)
                ref.append(tokens * len(esecs) / sum(esecs))
                raw.append(dict(threads=threads, repeat=rep, ours=rows, eager_seconds=esecs,
                                load=os.getloadavg()[0]))
        rate = matmul_rate()
        per_thread[threads] = (med(ours), med(ref), rate, statistics.median(ours_fb), statistics.median(ours_opt))
    load_after = os.getloadavg()

    lines += [
        "| threads | rlmesh tok/s median (min-max) | eager tok/s median (min-max) | ratio | matmul GFLOP/s |"
        " rlmesh model FLOP/s, 6N / 8N (% of matmul) | eager 6N / 8N (%) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for threads, (o, r, rate, fb, opt) in per_thread.items():
        f6o, f8o, f6r, f8r = 6 * n_params * o[0], 8 * n_params * o[0], 6 * n_params * r[0], 8 * n_params * r[0]
        lines.append(
            f"| {threads} | {o[0]:.0f} ({o[1]:.0f}-{o[2]:.0f}) | {r[0]:.0f} ({r[1]:.0f}-{r[2]:.0f}) |"
            f" {o[0] / r[0]:.2f}x | {rate / 1e9:.0f} | {f6o / 1e9:.0f} / {f8o / 1e9:.0f} G"
            f" ({100 * f6o / rate:.0f}% / {100 * f8o / rate:.0f}%) | {f6r / 1e9:.0f} / {f8r / 1e9:.0f} G"
            f" ({100 * f6r / rate:.0f}% / {100 * f8r / rate:.0f}%) |")
    lines += [""]
    for threads, (o, r, rate, fb, opt) in per_thread.items():
        lines.append(f"- {threads} thread(s): our step split (trainer's own timers, median over repeats):"
                     f" old-log-prob pass + forward + backward {fb:.3f} s, clip + AdamW {opt:.3f} s"
                     f" (step {tokens / o[0]:.3f} s).")
    lines += [
        "",
        f"Load average (1 min) before/after: {load_before[0]:.1f} / {load_after[0]:.1f} on {os.cpu_count()} cores.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
