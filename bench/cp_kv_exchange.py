"""How context parallelism should move keys and values between its ranks on
the CPU: by c10d's Gloo collectives (an all-gather of the keys and of the
values per layer and pass; in the backward an all-reduce of the whole
sequence's key and value gradients, or a reduce-scatter) or by a ring of
point-to-point sends (C - 1 rounds, each passing the share received last to
rank + 1: the same all-gather and reduce-scatter, without the collectives'
flattening copies). bench/context_parallel.md reports it.

C processes over Gloo on loopback (torch.distributed, the c10d Gloo backend
the learner runs), one intra-op thread each. Per layer each rank holds its
zig-zag share of one row's keys and values, [1, kv_heads, T / C, head_dim]
fp32 each, and the exchanges are timed without the attention's compute:

  forward   collective: all-gather K, all-gather V
            ring:       a ring all-gather of K and V together
  backward  all-reduce: the forward's all-gather, then all-reduce the whole
                        sequence's dK and dV (each rank keeps its share)
            reduce-scatter: the all-gather, then c10d's reduce-scatter
            ring:       the ring all-gather, then a ring reduce-scatter

Every scheme ends with each rank holding the whole sequence's K and V (and
in the backward its share of the summed gradients), so they hold the same
bytes; a ring attention that computes on each share as it arrives would hold
two shares instead, which is not measured here.

The schemes alternate within every repeat (reversed on odd repeats); the
report gives medians and min-max over repeats of the slowest rank's mean over
`--iters` layers.

    python3 bench/cp_kv_exchange.py --ranks 2 4 --tokens 4096 16384 --repeats 5 --markdown
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# (name, kv_heads, head_dim): the context-parallel bench's Llama (hidden 256,
# 4 KV heads of 32) and a Qwen3-8B layer (8 KV heads of 128).
MODELS = [("cp bench Llama (4 x 32)", 4, 32), ("Qwen3-8B layer (8 x 128)", 8, 128)]
SCHEMES = [("forward", "collective"), ("forward", "ring"), ("backward", "all-reduce"),
           ("backward", "reduce-scatter"), ("backward", "ring")]


def ring_gather(shares, rank, world):
    """Every rank's `shares` (a list of tensors), by rank: C - 1 rounds, each
    sending to rank + 1 what came from rank - 1 the round before."""
    out = {rank: shares}
    held = shares
    for i in range(world - 1):
        got = [torch.empty_like(t) for t in held]
        reqs = [dist.isend(t, (rank + 1) % world) for t in held] + [dist.irecv(g, (rank - 1) % world) for g in got]
        for r in reqs:
            r.wait()
        out[(rank - 1 - i) % world] = got
        held = got
    return out


def ring_reduce_scatter(blocks, rank, world):
    """blocks[j]: this rank's addend of rank j's share; returns the sum of
    everyone's addends of this rank's share. Round i sends the partial sum of
    share (rank - i - 1) % C on to rank + 1."""
    partial = blocks[(rank - 1) % world].clone()
    for i in range(world - 1):
        got = torch.empty_like(partial)
        reqs = [dist.isend(partial, (rank + 1) % world), dist.irecv(got, (rank - 1) % world)]
        for r in reqs:
            r.wait()
        partial = got + blocks[(rank - 2 - i) % world]
    return partial


def run(kind, scheme, k, v, rank, world):
    if scheme == "ring":
        gathered = ring_gather([k, v], rank, world)
        whole_k = torch.cat([gathered[r][0] for r in range(world)], 2)
        whole_v = torch.cat([gathered[r][1] for r in range(world)], 2)
    else:
        ks = [torch.empty_like(k) for _ in range(world)]
        vs = [torch.empty_like(v) for _ in range(world)]
        dist.all_gather(ks, k)
        dist.all_gather(vs, v)
        whole_k, whole_v = torch.cat(ks, 2), torch.cat(vs, 2)
    if kind == "forward":
        return
    for whole in (whole_k, whole_v):
        if scheme == "all-reduce":
            dist.all_reduce(whole)
        elif scheme == "reduce-scatter":
            # Sequence-major, so that rank r's share is one run.
            flat = whole.transpose(0, 2).contiguous().view(-1)
            mine = torch.empty(flat.numel() // world)
            dist.reduce_scatter_tensor(mine, flat)
        else:
            ring_reduce_scatter(list(whole.chunk(world, 2)), rank, world)


def worker(rank, world, store_path, args, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    results = {}
    runs = [(t, m) for t in args.tokens for m in range(len(MODELS))]
    for rep in range(args.repeats):
        for tokens, mi in runs:
            _, kv, d = MODELS[mi]
            k = torch.randn(1, kv, tokens // world, d)
            v = torch.randn_like(k)
            order = list(SCHEMES)
            if rep % 2:
                order.reverse()
            for kind, scheme in order:
                run(kind, scheme, k, v, rank, world)  # warm-up
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    run(kind, scheme, k, v, rank, world)
                dt = (time.perf_counter() - t0) / args.iters
                results.setdefault((tokens, mi, kind, scheme), []).append(dt)
    queue.put((rank, results))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=4, help="layers timed per measurement")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    for t in args.tokens:
        for c in args.ranks:
            if t % c:
                sys.exit(f"--tokens {t} is not divisible by --ranks {c}")
    ctx = mp.get_context("spawn")
    rows = []
    for world in args.ranks:
        with tempfile.TemporaryDirectory() as d:
            queue = ctx.Queue()
            procs = [ctx.Process(target=worker, args=(r, world, os.path.join(d, "store"), args, queue))
                     for r in range(world)]
            for p in procs:
                p.start()
            per_rank = dict(queue.get(timeout=3600) for _ in procs)
            for p in procs:
                p.join()
                if p.exitcode != 0:
                    sys.exit(f"a rank of {world} failed ({p.exitcode})")
        for key in per_rank[0]:
            # Each repeat's slowest rank.
            times = [max(per_rank[r][key][i] for r in range(world)) for i in range(args.repeats)]
            tokens, mi, kind, scheme = key
            rows.append((world, tokens, MODELS[mi][0], kind, scheme, statistics.median(times) * 1e3,
                         min(times) * 1e3, max(times) * 1e3))
    rows.sort()
    for r in rows:
        print(dict(zip(["ranks", "tokens", "model", "pass", "scheme", "ms", "ms_min", "ms_max"], r)))
    if args.markdown:
        print("| C | tokens | layer (KV heads x dim) | pass | exchange | ms per layer, median (min-max) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for c, t, m, kind, s, ms, lo, hi in rows:
            print(f"| {c} | {t} | {m} | {kind} | {s} | {ms:.2f} ({lo:.2f}-{hi:.2f}) |")


if __name__ == "__main__":
    main()
