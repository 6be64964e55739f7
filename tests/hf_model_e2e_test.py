"""A user's own Hugging Face model folder, end to end, for each family the
engine loads (Llama-3.2 style, Qwen2.5, Qwen3, Qwen3-MoE):

1. scripts/make_hf_model.py writes a random folder as the Hub ships one
   (sharded for Qwen2.5), with a BPE tokenizer trained by PyPI `tokenizers`,
   a tool-calling chat template and a generation_config.json with two eos ids
   and sampling defaults;
2. `coordinator run configs/grpo_hf_model.yaml --set model.path=FOLDER` runs
   two GRPO steps over the shipped messages dataset; the run must say where
   its stop ids and sampling defaults came from;
3. `coordinator eval` on the run's final folder (two workers) must give the
   run's own final held-out numbers, and write every sample;
4. transformers opens the output folder: AutoTokenizer's apply_chat_template
   renders the same prompts (text and ids), the greedy completions' log-probs
   (log-softmax of the logits) match ours within 1e-4, and
   generation_config.json names both stop ids;
5. every completion stops at the first stop id it samples or runs to
   max_new_tokens, and both stop ids end some completion.

Usage: hf_model_e2e_test.py ROOT WORKDIR (ROOT: the runfiles tree).
"""
import glob
import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

MAX_NEW = 24
ARCHS = ["llama3", "qwen2", "qwen3", "qwen3_moe"]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL", what, flush=True)


def run(cmd, log):
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=600)
    text = open(log).read()
    if p.returncode != 0:
        print(text[-6000:])
        raise SystemExit(f"{cmd[:3]} exited {p.returncode}")
    return text


def final_eval(run_dir):
    last = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("event") == "eval":
                last = j
    return last


def one(root, work, arch):
    print(f"--- {arch}", flush=True)
    folder = os.path.join(work, arch, "hub")
    extra = ["--shard_bytes", "150KB"] if arch == "qwen2" else []
    subprocess.run([sys.executable, os.path.join(root, "scripts/make_hf_model.py"), folder, "--arch", arch] + extra,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if arch == "qwen2":
        check(os.path.exists(os.path.join(folder, "model.safetensors.index.json")), f"{arch}: folder is not sharded")
    gen_in = json.load(open(os.path.join(folder, "generation_config.json")))
    stop_ids = gen_in["eos_token_id"]
    assert isinstance(stop_ids, list) and len(stop_ids) == 2, stop_ids

    coordinator = os.path.join(root, "coordinator/coordinator")
    config = os.path.join(root, "configs/grpo_hf_model.yaml")
    data = os.path.join(root, "configs/data")
    common = ["--bin_dir=" + root,
              "--set", f"task.train_path={data}/word_problems_chat_train.jsonl",
              "--set", f"task.eval_path={data}/word_problems_chat_eval.jsonl",
              "--set", f"rollout.sampling.max_new_tokens={MAX_NEW}",
              "--set", "eval.prompts=8",
              "--set", "eval.pass_at=[1, 4]"]
    runs = os.path.join(work, arch, "runs")
    out = run([coordinator, "run", config, "--run_dir=" + runs, "--set", "model.path=" + folder,
               "--set", "stages[0].grpo.rl.steps=2", "--set", "stages[0].grpo.rl.prompts_per_step=4",
               "--set", "stages[0].grpo.rl.samples_per_prompt=4", "--set", "stages[0].grpo.rl.optimizer.lr=1e-3",
               "--set", "eval.every=0", "--set", "checkpoint.every=0",
               # A reward that varies between samples (shorter is better), so
               # that the two steps change the weights.
               "--set", "reward.verifiers=[{name: numeric_answer}, {name: length, max_tokens: 1, "
                        "penalty_per_token: 0.1}]"] + common,
              os.path.join(work, arch, "run.log"))
    check(f"model: stop ids [{stop_ids[0]}, {stop_ids[1]}] from" in out, f"{arch}: run does not print its stop ids")
    check(f"rollout.sampling.temperature 0.9 from {folder}/generation_config.json" in out,
          f"{arch}: run does not say the temperature came from generation_config.json")
    check(f"rollout.sampling.top_k 40 from {folder}/generation_config.json" in out,
          f"{arch}: run does not say top_k came from generation_config.json")
    run_dir = [d for d in glob.glob(os.path.join(runs, "*")) if os.path.isdir(d)][0]
    marker = json.load(open(os.path.join(run_dir, "stage-0.done.json")))
    trained = marker["checkpoint"]
    in_run = final_eval(run_dir)

    samples_path = os.path.join(work, arch, "samples.jsonl")
    out = run([coordinator, "eval", config, "--run_dir=" + runs, "--model", trained, "--workers", "2",
               "--out", samples_path] + common, os.path.join(work, arch, "eval.log"))
    check("greedy accuracy" in out and "pass@4" in out, f"{arch}: eval prints no summary table")
    ev = final_eval([d for d in glob.glob(os.path.join(runs, "*-eval-*"))][0])
    for key in ("accuracy", "pass@1", "pass@4"):
        check(ev[key] == in_run[key], f"{arch}: eval {key} {ev[key]} != the run's final {in_run[key]}")
    samples = [json.loads(line) for line in open(samples_path)]
    # The same completions, token for token, as the run's own final
    # evaluation of that folder (two workers here, one there).
    run_samples = [json.loads(line) for line in open(os.path.join(run_dir, "eval", "0-grpo.jsonl"))]
    key = lambda s: (s["kind"], s["prompt_id"], s["sample"])
    ours = {key(s): s["response_token_ids"] for s in samples}
    theirs = {key(s): s["response_token_ids"] for s in run_samples}
    check(ours == theirs, f"{arch}: eval's completions differ from the run's final evaluation")
    check(sum(len(v) for v in ours.values()) > 2 * len(ours), f"{arch}: completions too short to compare")
    # ... and the weights did change: the initial evaluation sampled others.
    init_samples = [json.loads(line) for line in open(os.path.join(run_dir, "eval", "init.jsonl"))]
    check({key(s): s["response_token_ids"] for s in init_samples} != theirs,
          f"{arch}: two GRPO steps left every completion as it was")
    check(len([s for s in samples if s["kind"] == "greedy"]) == 8, f"{arch}: not 8 greedy samples")
    check(len([s for s in samples if s["kind"] == "sampled"]) == 32, f"{arch}: not 32 sampled samples")

    # The stop rule, on every sample.
    enders = set()
    for s in samples:
        ids = s["response_token_ids"]
        early = [i for i in ids[:-1] if i in stop_ids]
        check(not early, f"{arch}: a completion went on past stop id {early[:1]}")
        if s["finish_reason"] == "stop":
            check(ids and ids[-1] in stop_ids, f"{arch}: finish stop without a stop id at the end: {ids[-3:]}")
            enders.add(ids[-1])
        else:
            check(s["finish_reason"] == "length" and len(ids) == MAX_NEW and ids[-1] not in stop_ids,
                  f"{arch}: finish {s['finish_reason']} after {len(ids)} tokens")
    check(enders == set(stop_ids), f"{arch}: completions ended at {sorted(enders)}, not at both {stop_ids}")

    # transformers on the output folder.
    tok = AutoTokenizer.from_pretrained(trained)
    model = AutoModelForCausalLM.from_pretrained(trained, dtype=torch.float32).eval()
    gen = GenerationConfig.from_pretrained(trained)
    check(sorted(gen.eos_token_id) == sorted(stop_ids), f"{arch}: output eos_token_id {gen.eos_token_id}")
    check(gen.temperature == 0.9 and gen.top_k == 40, f"{arch}: output generation_config lost its sampling defaults")
    rows = [json.loads(line) for line in open(os.path.join(data, "word_problems_chat_eval.jsonl"))]
    by_id = {r.get("id"): r for r in rows}
    worst = 0.0
    for s in [s for s in samples if s["kind"] == "greedy"]:
        row = by_id[s["prompt_id"]]
        messages = row["messages"]
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        text = tok.apply_chat_template(messages[:last_user + 1], tokenize=False, add_generation_prompt=True,
                                       enable_thinking=False)
        check(text == s["prompt"], f"{arch}: apply_chat_template {text!r} != ours {s['prompt']!r}")
        ids = tok(text, add_special_tokens=False)["input_ids"]
        check(ids == s["prompt_token_ids"], f"{arch}: prompt ids differ for {s['prompt_id']}")
        full = torch.tensor([s["prompt_token_ids"] + s["response_token_ids"]])
        with torch.no_grad():
            logits = model(input_ids=full).logits.float()[0]
        n = len(s["prompt_token_ids"])
        lp = logits[n - 1:-1].log_softmax(-1)
        ref = lp[torch.arange(len(s["response_token_ids"])), torch.tensor(s["response_token_ids"])]
        worst = max(worst, (ref - torch.tensor(s["logprobs"])).abs().max().item())
    check(worst < 1e-4, f"{arch}: greedy log-probs differ from transformers by {worst:.3g}")
    print(f"{arch} checked: stop ids {stop_ids}; eval = run ({in_run['accuracy']:.3f}, "
          f"pass@4 {in_run['pass@4']:.3f}); max |log-prob - transformers| {worst:.2g}", flush=True)


def refusals(root, work):
    """coordinator eval refuses what it cannot evaluate, naming the flag."""
    coordinator = os.path.join(root, "coordinator/coordinator")
    config = os.path.join(root, "configs/grpo_hf_model.yaml")
    for args, expected in (([], "--model: required"),
                           (["--model", os.path.join(work, "nowhere")], "config.json does not exist"),
                           (["--model", os.path.join(work, "llama3", "hub"), "--data", os.path.join(work, "no.jsonl")],
                            "--data: ")):
        p = subprocess.run([coordinator, "eval", config, "--bin_dir=" + root] + args, capture_output=True, text=True,
                           timeout=60)
        check(p.returncode != 0 and expected in p.stderr + p.stdout,
              f"eval {args}: exit {p.returncode}, {(p.stderr + p.stdout)[-300:]!r} lacks {expected!r}")


def main():
    root, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    archs = sys.argv[3:] or ARCHS
    for arch in archs:
        one(root, work, arch)
    refusals(root, work)
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print(f"hf_model_e2e: {len(archs)} families passed")


if __name__ == "__main__":
    main()
