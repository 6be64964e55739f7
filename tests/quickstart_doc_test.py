"""Runs the commands of docs/quickstart.md as a user would, so the page
cannot drift from the product: every fenced `bash` block, in order, in a
scratch directory holding the repository's configs/ and scripts/.

Translations (the test runs inside Bazel, which it cannot call):
`bazel run //coordinator --` becomes the built coordinator with the role
binaries beside it; `scripts/setup.sh` and `bazel build` lines are skipped
(the test's dependencies are the build); `python3` is the test's
interpreter; /tmp/ becomes the test's own temporary folder.

Usage: quickstart_doc_test.py ROOT WORKDIR (ROOT: the runfiles tree).
"""
import os
import re
import shlex
import subprocess
import sys


def blocks(markdown):
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)


def commands(block):
    text = block.replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def main():
    root, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for name in ("configs", "scripts"):
        link = os.path.join(work, name)
        if not os.path.exists(link):
            os.symlink(os.path.join(root, name), link)
    tmp = os.path.join(work, "tmp") + "/"
    os.makedirs(tmp, exist_ok=True)
    page = open(os.path.join(root, "docs/quickstart.md")).read()
    ran = 0
    for block in blocks(page):
        for cmd in commands(block):
            if cmd.startswith("scripts/setup.sh") or cmd.startswith("bazel build"):
                continue
            cmd = cmd.replace("/tmp/", tmp)
            argv = shlex.split(cmd)
            if argv[:3] == ["bazel", "run", "//coordinator"]:
                assert argv[3] == "--", cmd
                argv = [os.path.join(root, "coordinator/coordinator"), argv[4], "--bin_dir=" + root] + argv[5:]
            elif argv[0] == "python3":
                argv[0] = sys.executable
            else:
                sys.exit(f"docs/quickstart.md: no translation for {cmd!r}")
            print("$", cmd, flush=True)
            p = subprocess.run(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=600)
            print(p.stdout[-3000:], flush=True)
            if p.returncode != 0:
                sys.exit(f"docs/quickstart.md: {cmd!r} exited {p.returncode}")
            ran += 1
    # What the page says the run leaves behind.
    runs = os.path.join(work, "runs")
    run_dirs = [d for d in sorted(os.listdir(runs)) if d.startswith("grpo_hf_model-") and "-eval-" not in d]
    assert run_dirs, "no runs/grpo_hf_model-<date>-<time> folder"
    run_dir = os.path.join(runs, run_dirs[0])
    for path in ("stage-0.done.json", "eval/init.jsonl", "eval/0-grpo.jsonl", "metrics.jsonl",
                 "checkpoints/0-grpo/step_000004/config.json",
                 "checkpoints/0-grpo/step_000004/generation_config.json",
                 "checkpoints/0-grpo/step_000004/tokenizer_config.json"):
        assert os.path.exists(os.path.join(run_dir, path)), f"the page promises {path}"
    assert os.path.getsize(tmp + "tiny_qwen3_eval.jsonl") > 0, "eval wrote no samples"
    if ran < 4:
        sys.exit(f"only {ran} commands ran")
    print(f"quickstart_doc_test: {ran} commands of docs/quickstart.md ran")


if __name__ == "__main__":
    main()
