"""One file's compile time and peak memory with gcc (the build's compiler)
and with clang, alternated, using the exact command Bazel runs for it.

    python3 bench/compiler_files.py [--rounds N] FILE [FILE ...]

FILE is a workspace path (learner/rl_step.cc). For each file the script
builds its target (so generated headers exist), takes the compile command
from `bazel aquery`, and runs it in the execution root as is and with
clang++ in gcc's place (without gcc's -fno-canonical-system-headers), gcc
first in odd rounds and clang first in even ones. The object goes to a
temporary file, so Bazel's outputs are untouched. Run it on an otherwise
idle machine and compare the pairs, not the columns: the VM's speed drifts.
Results: bench/compiler.md.
"""
import argparse
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bazel(*args):
    return subprocess.run(["bazel", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def gcc_command(path):
    """The arguments Bazel compiles `path` with, writing to a temporary object."""
    label = bazel("query", path).strip()
    package = label.split(":")[0]
    target = bazel("query", f"attr(srcs, '{label}', {package}:all)").split()[0]
    bazel("build", target)
    actions = json.loads(bazel("aquery", f'mnemonic("CppCompile", {target})', "--output=jsonproto"))["actions"]
    for action in actions:
        args = action["arguments"]
        if args[args.index("-c") + 1] != path or "-fPIC" in args:
            continue
        out, skip = [], False
        for a in args:
            if skip:
                skip = False
            elif a == "-MF":
                skip = True
            elif a != "-MD":
                out.append(a)
        return out
    raise SystemExit(f"{path}: no compile action found in {target}")


def run(args, obj, exec_root):
    """Seconds and peak resident MB of one compile (GNU time's %e and %M)."""
    args = list(args)
    args[args.index("-o") + 1] = obj
    with tempfile.NamedTemporaryFile(mode="r") as report:
        subprocess.run(["/usr/bin/time", "-o", report.name, "-f", "%e %M", *args], cwd=exec_root, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds, kb = report.read().split()[-2:]
    return float(seconds), int(kb) / 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    exec_root = bazel("info", "execution_root").strip()
    fd, obj = tempfile.mkstemp(suffix=".o")
    os.close(fd)
    print("| file | round | gcc (s) | clang (s) | clang / gcc | gcc peak (MB) | clang peak (MB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for path in a.files:
        gcc = gcc_command(path)
        if os.path.basename(gcc[0]) != "gcc":
            raise SystemExit(f"{path}: the build's compiler is {gcc[0]}, not gcc")
        clang = ["clang++"] + [x for x in gcc[1:] if x != "-fno-canonical-system-headers"]
        for r in range(1, a.rounds + 1):
            order = [("gcc", gcc), ("clang", clang)]
            if r % 2 == 0:
                order.reverse()
            got = {name: run(args, obj, exec_root) for name, args in order}
            (gs, gm), (cs, cm) = got["gcc"], got["clang"]
            print(f"| `{path}` | {r} | {gs:.1f} | {cs:.1f} | {cs / gs:.2f} | {gm:.0f} | {cm:.0f} |", flush=True)
    os.remove(obj)


if __name__ == "__main__":
    main()
