"""Why our clip + AdamW takes ~3x torch.optim.AdamW at world size 1
(bench/learner.md). The same AdamW op sequence as learner/schedule.cc's
AdamWUpdate, run (a) over one flat buffer of all parameters with
learner/data_parallel.cc's pack/unpack copies, as
DataParallel::StepReplicated does at K = 1; (b) over the flat buffer without
the copies; (c) over the flat buffer in 1 MiB chunks (every element sees the
same ops); (d) tensor by tensor in place; and torch.optim.AdamW itself.
Parameter shapes of the bench model (Llama 512 / 4 layers / vocab 2048,
13.9M floats). Eager PyTorch from Python, not our C++: the point is the
memory layout.

  python3 bench/learner_adamw_layout.py [--threads 1] [--repeats 25]
"""
import argparse
import math
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from learner_step_bench import CFG


def adamw_(p, g, m, v, step, lr=1e-5, b1=0.9, b2=0.999, eps=1e-8):
    # learner/schedule.cc AdamWUpdate, op for op (weight decay 0).
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2 ** step)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / (1 - b1 ** step))


def clip_(grads, max_norm=1.0):
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = max_norm / (norm.item() + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    params = [p.detach() for p in LlamaForCausalLM(LlamaConfig(**CFG)).parameters()]
    grads = [torch.randn_like(p) for p in params]
    n = sum(p.numel() for p in params)
    flat_p, flat_g = torch.empty(n), torch.empty(n)
    flat_m, flat_v = torch.zeros(n), torch.zeros(n)
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    step = [0]

    def flat():
        step[0] += 1
        o = 0
        for g in grads:  # PackGrads
            flat_g[o:o + g.numel()].copy_(g.reshape(-1))
            o += g.numel()
        clip_([flat_g])
        o = 0
        for p in params:  # PackParams
            flat_p[o:o + p.numel()].copy_(p.reshape(-1))
            o += p.numel()
        adamw_(flat_p, flat_g, flat_m, flat_v, step[0])
        o = 0
        for p in params:  # UnpackParams
            p.copy_(flat_p[o:o + p.numel()].view(p.shape))
            o += p.numel()

    def flat_no_pack():
        step[0] += 1
        clip_([flat_g])
        adamw_(flat_p, flat_g, flat_m, flat_v, step[0])

    def flat_chunked(chunk=1 << 18):
        # Every element sees the same ops; 1 MiB slices stay in cache across the passes.
        step[0] += 1
        clip_([flat_g])
        for o in range(0, n, chunk):
            e = min(n, o + chunk)
            adamw_(flat_p[o:e], flat_g[o:e], flat_m[o:e], flat_v[o:e], step[0])

    def per_tensor():
        step[0] += 1
        clip_(grads)
        for p, g, m, v in zip(params, grads, ms, vs):
            adamw_(p, g, m, v, step[0])

    tparams = [torch.nn.Parameter(p.clone()) for p in params]
    for tp, g in zip(tparams, grads):
        tp.grad = g.clone()
    opt = torch.optim.AdamW(tparams, lr=1e-5, weight_decay=0.0)

    def torch_adamw():
        torch.nn.utils.clip_grad_norm_(tparams, 1.0)
        opt.step()

    print(f"{n / 1e6:.1f}M parameters in {len(params)} tensors, {args.threads} thread(s); ms per step,"
          f" median (min-max) of {args.repeats}:")
    for name, fn in [("flat buffer + pack/unpack (ours at K=1)", flat), ("flat buffer, no pack/unpack", flat_no_pack),
                     ("flat buffer, AdamW in 1 MiB chunks, no pack/unpack", flat_chunked),
                     ("per tensor, same ops", per_tensor), ("torch clip_grad_norm_ + AdamW", torch_adamw)]:
        fn()
        secs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            secs.append(time.perf_counter() - t0)
        ms_ = [1e3 * s for s in secs]
        print(f"  {name}: {statistics.median(ms_):.1f} ({min(ms_):.1f}-{max(ms_):.1f})")


if __name__ == "__main__":
    main()
