"""Context parallelism's activation memory per rank against one process with
the whole row (bench/context_parallel.md).

For each row length, one process (`--world=1`) and the C ranks of a
context-parallel step (`--world=C`, separate processes over a file store)
for each way of moving the keys and values (`--exchanges`: the default ring
and c10d's collectives) each run bench/context_parallel_bench; the layouts
alternate within every repeat, reversed on odd repeats. The report gives,
per length and exchange, the median activation MiB of one process and of the
largest rank, their ratio against 1/C, and the step times (the slowest
rank's).

    bazel build -c opt //bench:context_parallel_bench
    python3 bench/context_parallel.py --tokens 4096 16384 --ranks 2 --repeats 3
    python3 bench/context_parallel.py --tokens 4096 16384 --exchanges ring --packed_docs 1024
    python3 bench/context_parallel.py --tokens 4096 16384 --exchanges ring --checkpoint
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bazel-bin", "bench", "context_parallel_bench")
LINE = re.compile(r"activation_mib=([0-9.]+) step_seconds=([0-9.]+)")


def run(world, tokens, extra):
    """[(activation MiB, seconds)] of every rank of one step."""
    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        procs = [subprocess.Popen([BIN, f"--world={world}", f"--rank={r}", f"--store={store}", f"--tokens={tokens}"]
                                  + extra, stdout=subprocess.PIPE, text=True) for r in range(world)]
        out = []
        for p in procs:
            text, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                sys.exit(f"context_parallel_bench --world={world} failed ({p.returncode})")
            m = LINE.search(text)
            out.append((float(m.group(1)), float(m.group(2))))
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--exchanges", nargs="+", default=["ring", "collectives"], choices=["ring", "collectives"])
    ap.add_argument("--packed_docs", type=int, default=0,
                    help="> 0: the row packs documents of this many tokens, masked by segment")
    ap.add_argument("--checkpoint", action="store_true",
                    help="also run every layout with every layer activation-checkpointed, alternated with the "
                         "plain runs")
    ap.add_argument("extra", nargs="*", help="flags passed on to the binary (after --)")
    a = ap.parse_args()
    if a.packed_docs > 0:
        a.extra = a.extra + [f"--packed_docs={a.packed_docs}"]
    modes = [False, True] if a.checkpoint else [False]
    rows = []
    for tokens in a.tokens:
        # (exchange, checkpointed); exchange None: one process.
        layouts = [(ex, ck) for ck in modes for ex in [None] + a.exchanges]
        mib = {k: [] for k in layouts}
        sec = {k: [] for k in layouts}
        for rep in range(a.repeats):
            for ex, ck in (layouts if rep % 2 == 0 else layouts[::-1]):
                flags = a.extra + (["--checkpoint"] if ck else [])
                if ex is None:
                    ranks = run(1, tokens, flags)
                else:
                    ranks = run(a.ranks, tokens, flags + [f"--kv_exchange={ex}"])
                mib[(ex, ck)].append(max(m for m, _ in ranks))
                sec[(ex, ck)].append(max(s for _, s in ranks))
        for ck in modes:
            one = (None, ck)
            m1 = statistics.median(mib[one])
            for ex in a.exchanges:
                k = (ex, ck)
                mc = statistics.median(mib[k])
                rows.append((tokens, ex, ck, m1, min(mib[one]), max(mib[one]), mc, min(mib[k]), max(mib[k]), mc / m1,
                             statistics.median(sec[one]), statistics.median(sec[k]), min(sec[k]), max(sec[k])))
    row = f"documents of {a.packed_docs} tokens packed" if a.packed_docs > 0 else "one sequence"
    print(f"C = {a.ranks}, {a.repeats} repeats, medians (min-max), each row {row}")
    print("| tokens | exchange | checkpointed | one process MiB | largest rank MiB | rank / one process "
          "(target <= 1/C + 0.10) | one process s | context-parallel s |")
    print("|---|---|---|---|---|---|---|---|")
    for t, ex, ck, m1, l1, h1, mc, lc, hc, r, s1, sc, slo, shi in rows:
        print(f"| {t} | {ex} | {'yes' if ck else 'no'} | {m1:.0f} ({l1:.0f}-{h1:.0f}) | {mc:.0f} ({lc:.0f}-{hc:.0f}) "
              f"| {r:.3f} (<= {1 / a.ranks + 0.10:.2f}) | {s1:.2f} | {sc:.2f} ({slo:.2f}-{shi:.2f}) |")

if __name__ == "__main__":
    main()
