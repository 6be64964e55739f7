#!/usr/bin/env python3
"""rlmesh GRPO against TRL's GRPOTrainer, side by side on this machine.

  bazel build //coordinator //learner //replay_buffer //reward_server //rollout:rollout_worker
  python3 bench/grpo_vs_trl.py --workload a --steps 100 --repeats 3 --out /tmp/a.json --markdown
  python3 bench/grpo_vs_trl.py --workload b --steps 3 --repeats 3 --out /tmp/b.json --markdown
  (--baseline_bin_dir <another checkout>/bazel-bin adds that build's rlmesh as a third side)

Workload (b), long long-tailed completions: a random Llama (hidden 512, 8
layers) written by transformers, 16 prompts x 8 samples, up to 256 new
tokens, the `length` verifier's reward, lr 1e-6 (the lengths stay those of
the random model for the timed steps); no accuracy, only step times. A TRL
run of (b) takes about 8.5 minutes here.

Workload (a), the main job's shape: the tiny Llama of configs/grpo_arith_tiny.yaml
SFT-trained by rlmesh (its stop rule, 40% held-out) on two-digit addition,
then GRPO from that one checkpoint on both sides: 64 prompts x 8 samples,
temperature 1, up to 5 new tokens, reward 1 when the last number of the
completion is the sum, token-mean loss, clip 0.2 / 0.28, no KL, AdamW lr 3e-4
with 10 warmup steps and cosine decay, grad clip 1, one pass per batch.
The problems are one JSONL file both sides read (task.kind jsonl), written
here from a fixed seed; 300 held-out problems are never trained on.

Each repeat runs both sides once with GRPO seed = repeat number, the order
reversed every other repeat (A/B alternated). A side's step time is the wall
time between consecutive steps (generation, reward, training, weight sync:
all of it), the first interval dropped. Both final models are scored by the
same greedy evaluation (transformers generate, the numeric verifier's rule);
rlmesh's own evaluation is recorded beside it as a check.

TRL runs from its own virtual environment (created on first use under
~/.cache/rlmesh/trl-venv, system site packages for torch and transformers),
never from the engine. Threads: rlmesh's launcher gives the learner both
cores and each of its two rollout workers one; TRL's one process gets
torch.set_num_threads(2).
"""
import argparse
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.expanduser("~/.cache/rlmesh/trl-venv")
TRL_VERSION = "1.16.0"
WORKER = os.path.join(ROOT, "bench", "grpo_vs_trl_trl.py")


def venv_python():
    py = os.path.join(VENV, "bin", "python")
    ok = os.path.exists(py) and subprocess.run(
        [py, "-c", f"import trl,sys; sys.exit(trl.__version__ != '{TRL_VERSION}')"]).returncode == 0
    if not ok:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", f"trl=={TRL_VERSION}"], check=True)
    return py


def write_task(workdir, n_train=20000, n_eval=300, seed=0):
    rng = random.Random(seed)
    held = []
    seen = set()
    while len(held) < n_eval:
        p = (rng.randrange(100), rng.randrange(100))
        if p not in seen:
            seen.add(p)
            held.append(p)
    train = []
    while len(train) < n_train:
        p = (rng.randrange(100), rng.randrange(100))
        if p not in seen:
            train.append(p)
    paths = {}
    for name, rows in (("train", train), ("eval", held)):
        paths[name] = os.path.join(workdir, name + ".jsonl")
        with open(paths[name], "w") as f:
            for a, b in rows:
                f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    return paths


def coordinator_run(cfg, workdir, name, bin_dir=None):
    """`coordinator run` of `cfg` with the coordinator and role binaries of
    bin_dir (a bazel-bin folder; this checkout's by default)."""
    bin_dir = bin_dir or os.path.join(ROOT, "bazel-bin")
    path = os.path.join(workdir, name + ".yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    run_root = os.path.join(workdir, name)
    cmd = [os.path.join(bin_dir, "coordinator/coordinator"), "run", path, f"--run_dir={run_root}",
           f"--bin_dir={bin_dir}"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"coordinator run {path} failed")
    (exp_dir,) = [os.path.join(run_root, d) for d in os.listdir(run_root) if os.path.isdir(os.path.join(run_root, d))]
    rows = [json.loads(line) for line in open(os.path.join(exp_dir, "metrics.jsonl"))]
    return exp_dir, rows, wall


def newest_checkpoint(exp_dir, stage_folder):
    d = os.path.join(exp_dir, "checkpoints", stage_folder)
    return os.path.join(d, sorted(os.listdir(d))[-1])


def worker(py, *args):
    subprocess.run([py, WORKER, *args], check=True, cwd=ROOT)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=["a", "b"], default="a")
    ap.add_argument("--steps", type=int, default=0, help="GRPO steps per run; default 100 (a), 3 (b)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sft_seed", type=int, default=1234)
    ap.add_argument("--out", default="")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--max_staleness", type=int, default=0,
                    help="rlmesh's rl.max_staleness (1: generation of step n+1 overlaps training of step n)")
    ap.add_argument("--baseline_bin_dir", default="",
                    help="a third side, 'baseline': rlmesh again with the binaries of this bazel-bin folder (another "
                         "commit's build), alternated with the other two, to A/B an engine change end to end")
    a = ap.parse_args()
    steps_n = a.steps or (100 if a.workload == "a" else 3)

    py = venv_python()
    workdir = a.workdir or tempfile.mkdtemp(prefix="grpo_vs_trl-")
    os.makedirs(workdir, exist_ok=True)
    task = write_task(workdir)
    main_cfg = yaml.safe_load(open(os.path.join(ROOT, "configs", "grpo_arith_tiny.yaml")))
    jsonl_task = {"kind": "jsonl", "train_path": task["train"], "eval_path": task["eval"]}

    # The shared start. (a): rlmesh SFT (the main job's first stage) on the
    # JSONL task. (b): a random Llama (hidden 512, 8 layers) written by
    # transformers, with the char tokenizer of a one-step rlmesh SFT run.
    sft = copy.deepcopy(main_cfg)
    sft["name"] = "base"
    sft["seed"] = a.sft_seed
    sft["task"] = jsonl_task
    sft["stages"] = [main_cfg["stages"][0]]
    if a.workload == "b":
        sft["stages"][0]["sft"].update({"steps": 1})
        sft["stages"][0]["sft"].pop("until", None)
    exp_dir, rows, _ = coordinator_run(sft, workdir, "sft")
    base = newest_checkpoint(exp_dir, "0-sft")
    if a.workload == "b":
        folder = os.path.join(workdir, "random-llama")
        worker(py, "init", "--model", base, "--out", folder, "--result", os.path.join(workdir, "init.json"))
        base, base_acc = folder, None
    else:
        worker(py, "eval", "--model", base, "--eval", task["eval"], "--result", os.path.join(workdir, "base_eval.json"))
        base_acc = json.load(open(os.path.join(workdir, "base_eval.json")))["accuracy"]
        print(f"base {base}: held-out {100 * base_acc:.1f}%", flush=True)

    grpo_stage = copy.deepcopy(main_cfg["stages"][1])
    rl = grpo_stage["grpo"]["rl"]
    rl["steps"] = steps_n
    rl["max_staleness"] = a.max_staleness
    max_new = main_cfg["rollout"]["sampling"]["max_new_tokens"]
    length_args = []
    if a.workload == "b":
        # 16 prompts x 8, up to 256 new tokens; a random model's lengths are
        # long-tailed (stop at <eos> with probability ~1/vocab per token, so
        # ~7% reach the cap); the reward is rlmesh's `length` verifier.
        rl["prompts_per_step"] = 16
        max_new = 256
        # A small learning rate keeps the random model's length distribution
        # for the few timed steps on both sides (at 3e-4 rlmesh's lengths fell
        # from 100 to 10 tokens in 3 steps while TRL's were still at 77, so
        # the two sides timed different workloads).
        rl["optimizer"]["lr"] = 1e-6
        length_args = ["--length_max_tokens", "64", "--length_penalty", "0.01"]
    prompts, samples = rl["prompts_per_step"], rl["samples_per_prompt"]
    # (a)'s first interval carries warm-up; (b)'s steps are long enough
    # (tens of seconds) that every interval counts.
    drop = 1 if a.workload == "a" else 0
    records = []
    for r in range(a.repeats):
        seed = r + 1
        order = ["rlmesh", "trl"] + (["baseline"] if a.baseline_bin_dir else [])
        order = order[r % len(order):] + order[:r % len(order)]  # each side first in turn (A/B alternated)
        for side in order:
            res = os.path.join(workdir, f"{side}-s{seed}.json")
            t0 = time.time()
            if side in ("rlmesh", "baseline"):
                cfg = copy.deepcopy(main_cfg)
                cfg["name"] = f"grpo-s{seed}"
                cfg["seed"] = seed
                cfg["task"] = jsonl_task
                cfg["model"] = {"init": "checkpoint", "path": base, "tokenizer": "char"}
                cfg["stages"] = [grpo_stage]
                cfg["eval"] = {"every": steps_n}
                cfg["checkpoint"] = {"every": steps_n, "keep": 1}
                if a.workload == "b":
                    cfg["rollout"]["sampling"]["max_new_tokens"] = max_new
                    cfg["model"]["max_positions"] = 512  # the folder's; the config checks max_new_tokens against it
                    cfg["reward"] = {"verifiers": [{"name": "length", "max_tokens": 64, "penalty_per_token": 0.01}]}
                    cfg["eval"] = {"every": 0, "prompts": 8}
                exp_dir, rows, wall = coordinator_run(cfg, workdir, f"{side}-s{seed}",
                                                      a.baseline_bin_dir if side == "baseline" else None)
                step_rows = [x for x in rows if x.get("event") == "step"]
                times = [x["time"] for x in step_rows]
                steps = [t1 - t0_ for t0_, t1 in zip(times, times[1:])][drop:]
                final = newest_checkpoint(exp_dir, "0-grpo")
                own = [x["accuracy"] for x in rows if x.get("event") == "eval" and x.get("stage") == "grpo"]
                extra = {"own_eval": own[-1] if own else None,
                         "seconds_train_median": statistics.median(x["seconds_train"] for x in step_rows),
                         "seconds_generate_median": statistics.median(x["seconds_generate"] for x in step_rows),
                         "response_length_first_last": [step_rows[0]["response_length_mean"],
                                                        step_rows[-1]["response_length_mean"]]}
            else:
                worker(py, "train", "--model", base, "--train", task["train"], "--out",
                       os.path.join(workdir, f"trl-s{seed}"), "--result", res, "--steps", str(steps_n),
                       "--seed", str(seed), "--prompts", str(prompts), "--samples", str(samples),
                       "--max_new_tokens", str(max_new), "--lr", str(rl["optimizer"]["lr"]),
                       "--warmup", str(rl["optimizer"]["warmup_steps"]), *length_args)
                out = json.load(open(res))
                steps, final, wall = out["step_seconds"][drop:], out["final"], time.time() - t0
                extra = {"response_length_log": out.get("length_log")}
            acc = None
            if a.workload == "a":
                ev = os.path.join(workdir, f"{side}-s{seed}-eval.json")
                worker(py, "eval", "--model", final, "--eval", task["eval"], "--result", ev)
                acc = json.load(open(ev))["accuracy"]
            rec = {"workload": a.workload, "side": side, "seed": seed, "repeat": r, "steps": steps_n,
                   "step_s_median": statistics.median(steps), "step_s_min": min(steps), "step_s_max": max(steps),
                   "step_s": steps, "accuracy": acc, "base_accuracy": base_acc, "wall_s": round(wall, 1), **extra}
            records.append(rec)
            print(json.dumps(rec), flush=True)
    if a.out:
        json.dump({"workload": a.workload, "base": base, "base_accuracy": base_acc, "records": records},
                  open(a.out, "w"), indent=1)
    if a.markdown:
        print(markdown(records, base_acc, steps_n))


def markdown(records, base_acc, steps):
    def side(s):
        return [r for r in records if r["side"] == s]

    head = f"held-out after {steps} steps (base {100 * base_acc:.1f}%)" if base_acc is not None else "-"
    lines = ["| side | repeats | step s, median of repeats (min-max of per-repeat medians) | fastest step s | "
             f"{head} |", "| --- | --- | --- | --- | --- |"]
    for s in ("rlmesh", "trl", "baseline"):
        rs = side(s)
        if not rs:
            continue
        med = [r["step_s_median"] for r in rs]
        acc_txt = "-"
        if base_acc is not None:
            acc = [100 * r["accuracy"] for r in rs]
            sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
            acc_txt = f"{statistics.mean(acc):.1f} +- {sd:.1f} ({', '.join(f'{x:.1f}' for x in acc)})"
        lines.append(f"| {s} | {len(rs)} | {statistics.median(med):.3f} ({min(med):.3f}-{max(med):.3f}) | "
                     f"{min(r['step_s_min'] for r in rs):.3f} | {acc_txt} |")
    pairs = [(a, b) for a in side("rlmesh") for b in side("trl") if a["repeat"] == b["repeat"]]
    ratios = [a["step_s_median"] / b["step_s_median"] for a, b in pairs]
    lines.append("")
    lines.append(f"rlmesh / TRL step time per repeat: {', '.join(f'{x:.2f}' for x in ratios)}; "
                 f"median {statistics.median(ratios):.2f} (TRL is {1 / statistics.median(ratios):.2f}x slower)")
    if side("baseline"):
        for other in ("trl", "rlmesh"):
            pairs = [(a, b) for a in side("baseline") for b in side(other) if a["repeat"] == b["repeat"]]
            ratios = [a["step_s_median"] / b["step_s_median"] for a, b in pairs]
            lines.append(f"baseline / {other} step time per repeat: {', '.join(f'{x:.2f}' for x in ratios)}; "
                         f"median {statistics.median(ratios):.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
