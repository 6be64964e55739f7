"""Writes the markdown report of scripts/device_check.sh from its work folder.

    python3 bench/gpu_report.py WORK_DIR DRY_RUN(0|1) > gpu.md

WORK_DIR holds machine.txt, libraries.txt, gpus.txt (the device count)
and, per check, NAME.log and NAME.rc; gpu_bench.log has one JSON object per
line. Each figure is set against its GPU target, as a ratio to a reference
measured in the same run on the same GPU.

The colocated GRPO run's step metrics are asserted, not just printed: every
step's weights went over CUDA IPC (no fallback), its decode replayed CUDA
graphs, and the bf16 rollout's log-prob gap to the fp32 learner is
positive and small. Exits 3 when an assertion fails (after writing the
report), 0 otherwise.
"""
import json
import os
import sys

CHECKS = ["device_test", "memory_gpu_test", "nccl_gpu_test", "data_parallel_gpu_test", "fixed_decode_gpu_test",
          "weight_sync_gpu_test", "gpu_bench", "weight_sync_bench", "e2e_colocated"]
BENCHES = ("gpu_bench", "weight_sync_bench", "e2e_colocated")  # reported by exit code, not a Catch2 summary


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def catch2_summary(log):
    for line in reversed(log.splitlines()):
        if line.startswith(("All tests passed", "test cases:")):
            return line.strip()
    return "(no Catch2 summary)"


def main():
    work, dry = sys.argv[1], sys.argv[2] == "1"
    out = []
    out.append("# GPU checks (scripts/device_check.sh)\n")
    if dry:
        out.append("**Dry run on a machine without a GPU**: every GPU check below is expected to fail, naming the "
                   "missing device. No figure here is a GPU measurement.\n")
    out.append("## Machine\n\n```\n" + read(os.path.join(work, "machine.txt")).strip() + "\n```\n")
    libs = read(os.path.join(work, "libraries.txt")).strip()
    out.append("Libraries not from the bundle, torch or glibc: " + ("none" if not libs else "\n```\n" + libs + "\n```") + "\n")
    out.append("## Checks\n\n| check | exit | result |\n|---|---|---|")
    for c in CHECKS:
        rc = read(os.path.join(work, c + ".rc"), "?").strip()
        log = read(os.path.join(work, c + ".log"))
        if c in BENCHES:
            result = "timed out" if rc == "124" else ("ok" if rc == "0" else (log.strip().splitlines() or ["?"])[-1])
        else:
            result = catch2_summary(log)
        out.append(f"| {c} | {rc} | {result[:200]} |")
    out.append("")
    figures = {}
    for line in read(os.path.join(work, "gpu_bench.log")).splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            figures.setdefault(d["what"], []).append(d)
    if figures:
        out.append("## Figures (medians of the repeats; min..max in brackets)\n")
        out.append("| figure | value | target | met |\n|---|---|---|---|")
        def span(d):
            return f"[{d['seconds_min']:.4g}..{d['seconds_max']:.4g} s]"
        for d in figures.get("matmul_bf16", []):
            out.append(f"| bf16 matmul {d['n']}³ (reference) | {d['tflops']:.1f} TFLOP/s {span(d)} | - | - |")
        for d in figures.get("copy_d2d", []):
            out.append(f"| device copy 1 GiB (reference) | {d['gb_per_s']:.0f} GB/s copied, "
                       f"{d['read_plus_write_gb_per_s']:.0f} GB/s read+write {span(d)} | - | - |")
        for d in figures.get("parity_logits", []):
            tol = 0.05 * d["logit_abs_max"]
            out.append(f"| fp32 GPU vs fp32 CPU logits, max abs | {d['fp32_gpu_vs_cpu_max_abs']:.3g} | ≤ 1e-3 | "
                       f"{'yes' if d['fp32_gpu_vs_cpu_max_abs'] <= 1e-3 else 'no'} |")
            out.append(f"| bf16 GPU vs fp32 CPU logits, max abs (logits up to {d['logit_abs_max']:.3g}) | "
                       f"{d['bf16_gpu_vs_fp32_cpu_max_abs']:.3g}; argmax agreement {d['bf16_argmax_agreement']:.3f} | "
                       f"≤ 5% of the largest logit ({tol:.3g}) | {'yes' if d['bf16_gpu_vs_fp32_cpu_max_abs'] <= tol else 'no'} |")
        for d in figures.get("train_step", []):
            out.append(f"| learner step, {d['non_embedding_params'] / 1e6:.0f}M non-embedding params, "
                       f"{int(d['tokens'])} tokens | {d['tokens_per_s']:.0f} tok/s, {d['tflops']:.1f} TFLOP/s, "
                       f"MFU {100 * d['mfu_of_measured_matmul']:.1f}% of the measured matmul {span(d)} | ≥ 30% | "
                       f"{'yes' if d['mfu_of_measured_matmul'] >= 0.30 else 'no'} |")
        decode = figures.get("decode_bf16", [])
        eager = {d["batch"]: d for d in decode if not d.get("cuda_graphs")}
        for d in decode:
            graphs = d.get("cuda_graphs", False)
            how = (f"with CUDA graphs ({d.get('graph_replays', 0)} replays in the last repeat; "
                   f"{d['tokens_per_s'] / eager[d['batch']]['tokens_per_s']:.2f}× without)"
                   if graphs and d["batch"] in eager else "without CUDA graphs")
            if d["batch"] == 1:
                frac = d["fraction_of_roofline_per_sequence"]
                out.append(f"| decode batch 1, {d['weight_bytes'] / 1e6:.0f} MB of weights, {how} | "
                           f"{d['tokens_per_s']:.0f} tok/s = {100 * frac:.1f}% of the roofline "
                           f"{d['batch1_roofline_tokens_per_s']:.0f} tok/s {span(d)} | ≥ 50% | "
                           f"{'yes' if frac >= 0.5 else 'no'} |")
            else:
                out.append(f"| decode batch {d['batch']}, {how} | {d['tokens_per_s']:.0f} tok/s {span(d)} | ≥ 2× "
                           f"transformers generate() (not carried: no transformers on the GPU machine) | not measured |")
        out.append("")
    handoff = [json.loads(l) for l in read(os.path.join(work, "weight_sync_bench.log")).splitlines()
               if l.strip().startswith("{")]
    for d in handoff:
        med = lambda v: sorted(v)[len(v) // 2]
        ratio = med(d["copy_s"]) / med(d["handoff_s"])
        out.append("## CUDA IPC hand-off between two processes on one GPU\n")
        out.append("| figure | value | target | met |\n|---|---|---|---|")
        out.append(f"| {d['bytes'] / 2**20:.0f} MiB, publisher to receiver (Publish start to the receiver's return) | "
                   f"{med(d['handoff_s']) * 1e3:.2f} ms [{min(d['handoff_s']) * 1e3:.2f}..{max(d['handoff_s']) * 1e3:.2f}] "
                   f"= {100 * ratio:.0f}% of a device copy of the same tensors ({med(d['copy_s']) * 1e3:.2f} ms) | "
                   f"≥ 50% | {'yes' if ratio >= 0.5 else 'no'} |")
        out.append(f"| the publisher's share (Publish returned) | {med(d['publish_s']) * 1e3:.2f} ms | - | - |\n")
    steps = [json.loads(l) for l in read(os.path.join(work, "e2e_metrics.jsonl")).splitlines() if l.strip()]
    steps = [d for d in steps if d.get("stage") == "grpo" and d.get("event") == "step"]
    if len(steps) >= 2:
        span_s = steps[-1]["time"] - steps[0]["time"]
        out.append("## GRPO colocated on one GPU (111M-parameter policy, learner + 1 rollout worker, bf16)\n")
        out.append(f"{len(steps)} steps; {(len(steps) - 1) / span_s:.2f} steps/s from the first step's end to the "
                   f"last's. Phase medians:\n")
        out.append("| phase | seconds, median | share of the step |\n|---|---|---|")
        med = lambda v: sorted(v)[len(v) // 2]
        step_s = span_s / (len(steps) - 1)
        for key in ("seconds_generate", "seconds_sleep", "seconds_sync", "seconds_train"):
            v = [d[key] for d in steps if key in d]
            if v:
                out.append(f"| {key[8:]} | {med(v):.3f} | {100 * med(v) / step_s:.0f}% |")
        out.append("")
    failed = e2e_assertions(steps, out)
    gpus = read(os.path.join(work, "gpus.txt"), "0").strip()
    if gpus in ("0", "1"):
        out.append("Cases that need two GPUs (NCCL weight sync and data parallelism between two ranks, the "
                   f"two-rank NCCL group): **not run: {'one GPU' if gpus == '1' else 'no GPU'}**.\n")
    out.append("## Logs (last lines)\n")
    for c in CHECKS:
        tail = "\n".join(read(os.path.join(work, c + ".log")).splitlines()[-15:])
        out.append(f"### {c}\n\n```\n{tail}\n```\n")
    print("\n".join(out))
    return 3 if failed else 0


def e2e_assertions(steps, out):
    """Appends the colocated run's assertions to `out`; returns how many failed."""
    med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
    gaps = [d.get("mismatch_abs_diff", 0.0) for d in steps]
    rows = [
        ("GRPO steps ran", f"{len(steps)}", len(steps) >= 2),
        ("every step's weights went over CUDA IPC (`weight_sync`)",
         ", ".join(sorted({str(d.get("weight_sync")) for d in steps})) or "none",
         bool(steps) and all(d.get("weight_sync") == "cuda_ipc" for d in steps)),
        ("every step's decode replayed CUDA graphs (`cuda_graph_replays`)",
         f"median {med([d.get('cuda_graph_replays', 0) for d in steps])}",
         bool(steps) and all(d.get("cuda_graph_replays", 0) > 0 for d in steps)),
        ("bf16 rollout vs fp32 learner log-prob gap (`mismatch_abs_diff`) in (0, 0.5)",
         f"median {med(gaps):.3g}", bool(steps) and all(0 < g < 0.5 for g in gaps)),
    ]
    out.append("## Asserted in the colocated run\n")
    out.append("| assertion | seen | holds |\n|---|---|---|")
    for what, seen, ok in rows:
        out.append(f"| {what} | {seen} | {'yes' if ok else '**no**'} |")
    out.append("")
    return sum(1 for _, _, ok in rows if not ok)


if __name__ == "__main__":
    sys.exit(main())
