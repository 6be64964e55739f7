#!/usr/bin/env python3
"""A GRPO learner step with each group's prompt run once (TrainerOptions.
share_prompts, the default) against the same step with every sample's own
copy of it, A/B alternated in one script run, at three shapes.

  bazel build //bench:learner_step_bench
  python3 bench/shared_prompts.py --repeats 3 --out /tmp/shared.json --markdown

Both sides are the same binary (`learner_step_bench --share_prompts=true|
false`), the same random weights (a Llama written by transformers, seed 0),
the same synthetic batch with one prompt per group (`--group_prompts`), two
intra-op threads. A run takes `--warmup` untimed steps, then `--steps` timed
ones; its figure is the median of those. Each repeat runs both sides, the
order reversed every other repeat. The first timed step's loss of each side
is printed beside the times: sharing changes only the summation order.

Shapes:
  a     the main job's: hidden 128, 3 layers, 64 groups x 8, prompt 8,
        response 4 (bench/grpo_vs_trl.md workload a);
  b     workload b's model (hidden 512, 8 layers), 4 groups x 8, prompt 6,
        long-tailed responses of mean 100, up to 256: the cost rule keeps
        the rows apart (the prompt is short and the group's row long);
  long  the same model, 2 groups x 8, prompt 200, long-tailed responses of
        mean 50, up to 128: long prompts, as in RLHF on real prompts;
  long8 the same with 8 groups: several micro-batches (8192 padded tokens
        each), so the rows are sorted by length and each group's rows kept
        in one micro-batch.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "bazel-bin", "bench", "learner_step_bench")

MODELS = {
    "tiny": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=32),
    "medium": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=4, max_position_embeddings=512),
}
SHAPES = {
    "a": ("tiny", dict(groups=64, group_size=8, prompt_len=8, response_len=4), 5),
    "b": ("medium", dict(groups=4, group_size=8, prompt_len=6, response_len=256, long_tail_mean=100), 2),
    "long": ("medium", dict(groups=2, group_size=8, prompt_len=200, response_len=128, long_tail_mean=50), 2),
    "long8": ("medium", dict(groups=8, group_size=8, prompt_len=200, response_len=128, long_tail_mean=50), 1),
}


def write_model(folder, shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    # The char tokenizer's vocabulary (100 ids, the main job's model).
    cfg = LlamaConfig(vocab_size=100, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                      rms_norm_eps=1e-6, **MODELS[shape])
    LlamaForCausalLM(cfg).save_pretrained(folder)


def run(folder, args, share, steps, warmup, threads, binary=BIN):
    cmd = [binary, f"--model_dir={folder}", "--tokenizer=char", f"--threads={threads}", f"--steps={steps}",
           f"--warmup={warmup}", "--lr=1e-6", "--group_prompts", f"--share_prompts={'true' if share else 'false'}"]
    cmd += [f"--{k}={v}" for k, v in args.items()]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit(f"{' '.join(cmd)} failed")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"seconds"')]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", default="a,b,long,long8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        raise SystemExit(f"{BIN} missing: bazel build //bench:learner_step_bench")
    work = tempfile.mkdtemp(prefix="shared_prompts_")
    folders = {}
    results = []
    for name in a.shapes.split(","):
        model, args, steps = SHAPES[name]
        if model not in folders:
            folders[model] = os.path.join(work, model)
            write_model(folders[model], model)
        for r in range(a.repeats):
            order = [True, False] if r % 2 == 0 else [False, True]
            for share in order:
                rows = run(folders[model], args, share, steps, a.warmup, a.threads)
                rec = {"shape": name, "repeat": r, "share": share,
                       "seconds": statistics.median(x["seconds"] for x in rows),
                       "first_loss": rows[0]["loss"], "shared_prompt_frac": rows[0]["shared_prompt_frac"],
                       "pad_frac": rows[0]["pad_frac"], "tokens": rows[0]["tokens"]}
                results.append(rec)
                print(json.dumps(rec), flush=True)
    if a.out:
        json.dump(results, open(a.out, "w"), indent=1)
    if a.markdown:
        print("| shape | shared rows | step s, shared: median (min-max) | step s, each its own: median (min-max) "
              "| own / shared per repeat | first loss, shared / own |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name in a.shapes.split(","):
            on = [x for x in results if x["shape"] == name and x["share"]]
            off = [x for x in results if x["shape"] == name and not x["share"]]
            s_on = [x["seconds"] for x in on]
            s_off = [x["seconds"] for x in off]
            ratios = [f'{b["seconds"] / x["seconds"]:.2f}' for x, b in zip(on, off)]
            print(f"| {name} | {on[0]['shared_prompt_frac']:.2f} | {statistics.median(s_on):.3f} "
                  f"({min(s_on):.3f}-{max(s_on):.3f}) | {statistics.median(s_off):.3f} "
                  f"({min(s_off):.3f}-{max(s_off):.3f}) | {', '.join(ratios)} "
                  f"| {on[0]['first_loss']:.6g} / {off[0]['first_loss']:.6g} |")


if __name__ == "__main__":
    main()
