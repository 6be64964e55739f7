#!/usr/bin/env python3
"""Soak: the main job's GRPO stage run for a long time, watching every role.

Runs `coordinator run configs/grpo_arith_tiny.yaml` with the GRPO stage made
long enough to outlast --minutes (a constant learning rate, so the policy
keeps changing the way it does mid-run), samples each process of the mesh
(the coordinator and its role children) every --interval seconds from /proc
(resident memory, open file descriptors, threads), stops the run after
--minutes, and writes a markdown report: per process the first sample after
--warmup_minutes, the last, the peak, and a least-squares slope of RSS per
hour over the samples after the warm-up. A leak shows as a slope that does
not flatten; what the config bounds (the replay buffer's RocksDB caches, the
KV cache of max_batch sequences) shows as a plateau. The replay buffer's
RocksDB memory (block cache, memtables, table readers; its Stats RPC through
the Python client, built into a temporary folder) is sampled alongside, so
the report can set the buffer's RSS apart into what RocksDB bounds and the
rest.

  python3 bench/soak.py --minutes 60 --out bench/soak.md   (not in CI)
"""
import argparse
import datetime
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def sample(pid):
    """(rss MiB, open fds, threads) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024.0
        threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds, threads
    except (OSError, AttributeError):
        return None


def name_of(pid):
    """The role's --name / --port_file name, or the binary's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    for a in argv:
        m = re.match(r"--port_file=.*/([^/]+)\.port$", a)
        if m:
            return m.group(1)
    return os.path.basename(argv[0]) if argv else None


def install_client(dest):
    """The Python client (python/, stubs from proto/) into `dest`; None if it cannot be built."""
    src = os.path.join(dest, "src")
    os.makedirs(src)
    for d in ("python", "proto"):
        shutil.copytree(os.path.join(ROOT, d), os.path.join(src, d))
    site = os.path.join(dest, "site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-build-isolation", "--no-index", "--no-deps", "--target", site,
                        os.path.join(src, "python")], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"bench/soak.py: no store memory (the client did not build): {r.stderr[-500:]}", file=sys.stderr)
        return None
    sys.path.insert(0, site)
    import rlmesh  # noqa: E402
    return rlmesh


def slope_per_hour(points):
    """Least-squares slope of (seconds, value) points, per hour."""
    if len(points) < 3:
        return float("nan")
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0:
        return float("nan")
    return sum((t - mx) * (v - my) for t, v in points) / sxx * 3600.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--warmup_minutes", type=float, default=3.0,
                    help="samples before this are left out of the slope (SFT, caches filling)")
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--config", default="configs/grpo_arith_tiny.yaml")
    ap.add_argument("--out", default="bench/soak.md")
    ap.add_argument("--set", action="append", default=[], dest="overrides",
                    help="more coordinator --set overrides, e.g. buffer.keep_steps=100 (repeatable)")
    args = ap.parse_args()

    coordinator = os.path.join(ROOT, "bazel-bin/coordinator/coordinator")
    if not os.access(coordinator, os.X_OK):
        sys.exit("bench/soak.py: build first: bazel build //coordinator")
    run_dir = tempfile.mkdtemp(prefix="rlmesh-soak-")
    # GRPO long enough to outlast the soak; a constant rate, as mid-run.
    cmd = [coordinator, "run", os.path.join(ROOT, args.config), f"--run_dir={run_dir}",
           "--set", "stages[1].grpo.rl.steps=100000",
           "--set", "stages[1].grpo.rl.optimizer.schedule=constant"]
    for o in args.overrides:
        cmd += ["--set", o]
    rlmesh = install_client(os.path.join(run_dir, "client"))
    buffer = None
    store = []  # (t, buffer RSS MiB, {block_cache_usage, ...} MiB)
    log_path = os.path.join(run_dir, "coordinator.out")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    start = time.time()
    series = {}  # name -> [(t, rss, fds, threads)]
    try:
        while time.time() - start < args.minutes * 60:
            if proc.poll() is not None:
                sys.exit(f"bench/soak.py: the run ended early (exit {proc.returncode}); see {log_path}")
            t = time.time() - start
            for pid in [proc.pid] + children(proc.pid):
                s = sample(pid)
                name = name_of(pid)
                if s is None or name is None:
                    continue
                series.setdefault(name, []).append((t, *s))
            if rlmesh is not None and buffer is None:
                ports = glob.glob(os.path.join(run_dir, "*", "ports", "replay_buffer.port"))
                if ports:
                    with open(ports[0]) as f:
                        buffer = rlmesh.Buffer(f"127.0.0.1:{f.read().strip()}", timeout=10.0)
            if buffer is not None and "replay_buffer" in series:
                try:
                    mem = buffer.store_memory()
                    store.append((t, series["replay_buffer"][-1][1], {k: v / 2**20 for k, v in mem.items()}))
                except Exception as e:  # a busy buffer misses a sample, the soak goes on
                    print(f"bench/soak.py: store_memory: {e}", file=sys.stderr)
            time.sleep(args.interval)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    with open(log_path) as f:
        progress = [l.strip() for l in f if l.startswith("grpo ") or l.startswith("eval ")]
    steps = [int(m.group(1)) for l in progress for m in [re.search(r"step (\d+)/", l)] if m]

    warm = args.warmup_minutes * 60
    lines = [
        "# Soak: the main job's GRPO stage, every role watched",
        "",
        f"`python3 bench/soak.py --minutes {args.minutes:g}{''.join(' --set ' + o for o in args.overrides)}` on "
        f"{datetime.date.today()}, {os.cpu_count()} cores: "
        f"`{os.path.basename(args.config)}` with its GRPO stage made 100000 steps at a constant learning rate, "
        f"stopped after {args.minutes:g} minutes at GRPO step {max(steps) if steps else 0}; "
        f"samples every {args.interval:g} s from /proc; the slope is a least-squares fit over the samples "
        f"after the first {args.warmup_minutes:g} minutes.",
        "",
        "| process | samples | RSS after warm-up MiB | RSS last MiB | RSS peak MiB | RSS slope MiB/h | fds first → last | threads first → last |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in sorted(series):
        pts = series[name]
        after = [p for p in pts if p[0] >= warm] or pts
        lines.append(
            f"| {name} | {len(pts)} | {after[0][1]:.0f} | {pts[-1][1]:.0f} | {max(p[1] for p in pts):.0f} | "
            f"{slope_per_hour([(p[0], p[1]) for p in after]):+.1f} | {after[0][2]} → {pts[-1][2]} | "
            f"{after[0][3]} → {pts[-1][3]} |")
    if store:
        after = [p for p in store if p[0] >= warm] or store
        rest = [(t, rss - m["block_cache_usage"] - m["memtables"] - m["table_readers"]) for t, rss, m in after]
        lines += [
            "",
            "The replay buffer's resident set against RocksDB's own accounting of its memory (MiB, Stats):",
            "",
            "| | after warm-up | last | peak | slope MiB/h |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key in ("block_cache_usage", "memtables", "table_readers"):
            pts = [(t, m[key]) for t, _, m in after]
            lines.append(f"| {key} | {pts[0][1]:.0f} | {pts[-1][1]:.0f} | {max(p[1] for p in pts):.0f} | "
                         f"{slope_per_hour(pts):+.1f} |")
        lines.append(f"| RSS minus those three | {rest[0][1]:.0f} | {rest[-1][1]:.0f} | "
                     f"{max(p[1] for p in rest):.0f} | {slope_per_hour(rest):+.1f} |")
        lines.append("")
        lines.append(f"The block cache's capacity is {store[-1][2]['block_cache_capacity']:.0f} MiB.")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(ROOT, args.out), "w") as f:
        f.write(report)
    print(report)
    shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
