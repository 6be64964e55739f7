"""Runs the commands of docs/quickstart.md as a user would, so the page
cannot drift from the product: every fenced `bash` block, in order, in a
scratch directory holding the repository's configs/ and scripts/.

The test runs inside Bazel, which it cannot call: docs/doc_commands.py
translates each command (the built coordinator for `bazel run //coordinator
--`, the test's interpreter for `python3`, its own temporary folder for
/tmp/; `scripts/setup.sh` and `bazel build` are skipped).

Usage: quickstart_doc_test.py ROOT WORKDIR (ROOT: the runfiles tree).
"""
import os
import subprocess
import sys


def main():
    root, work = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.join(root, "docs"))
    import doc_commands  # the translations, shared with //docs:doc_commands_test

    tmp = doc_commands.scratch_dir(root, work, names=("configs", "scripts"))
    page = open(os.path.join(root, "docs/quickstart.md")).read()
    ran = 0
    for block in doc_commands.bash_blocks(page, "docs/quickstart.md"):
        for command in doc_commands.commands(block):
            try:
                cmd = doc_commands.translate(command.text, root, tmp)
            except doc_commands.Skipped:
                continue
            print("$", command.text, flush=True)
            p = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=work, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=600)
            print(p.stdout[-3000:], flush=True)
            if p.returncode != 0:
                sys.exit(f"docs/quickstart.md:{command.line}: {command.text!r} exited {p.returncode}")
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
