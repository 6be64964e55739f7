#!/usr/bin/env python3
"""Decode's matrix products on this CPU: MKL (what torch's `linear`, and so
both rlmesh's and transformers' decode, use) against oneDNN's linear on
pre-converted tensors. A second GEMM library that were faster here would move
the GEMM ceiling of bench/actor.md; this measures whether one is.

Shapes: the bench/actor.md model's decode projections (hidden 512, MLP 1408,
vocab 2048) at 16 and 64 rows. One thread, A/B alternated per repeat, median
and min-max of the per-repeat ratio.

  python3 bench/gemm_backends.py [--repeats 7] [--calls 50]
"""
import argparse
import statistics
import time

import torch


def per_call(f, calls):
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("| rows | in → out | MKL ms (median) | GFLOP/s | oneDNN ms (median) | MKL / oneDNN time, median (min-max) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for rows in (16, 64):
        for k, n in ((512, 1408), (1408, 512), (512, 2048)):
            x, w = torch.randn(rows, k), torch.randn(n, k)
            xm, wm = x.to_mkldnn(), w.to_mkldnn()
            mkl = lambda: torch.nn.functional.linear(x, w)
            onednn = lambda: torch._C._nn.mkldnn_linear(xm, wm, None)
            # Same numbers (to fp32 rounding): the comparison is of one product.
            diff = (mkl() - onednn().to_dense()).abs().max().item()
            assert diff < 1e-3 * k ** 0.5, f"oneDNN differs by {diff}"
            for f in (mkl, onednn):
                per_call(f, args.calls)  # warm-up
            a, b = [], []
            for r in range(args.repeats):
                pair = [(mkl, a), (onednn, b)] if r % 2 == 0 else [(onednn, b), (mkl, a)]
                for f, out in pair:
                    out.append(per_call(f, args.calls))
            ratios = [x_ / y_ for x_, y_ in zip(a, b)]
            ma = statistics.median(a)
            print(f"| {rows} | {k} → {n} | {ma * 1e3:.3f} | {2 * rows * k * n / ma / 1e9:.0f} | "
                  f"{statistics.median(b) * 1e3:.3f} | {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
