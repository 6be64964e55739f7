"""Runs the commands of README.md and docs/*.md (docs/quickstart.md has its
own test; docs/configuration.md is generated), so the pages cannot drift
from the product.

Every ```bash block says in its info string what the test does with it
(rendered pages highlight by the first word and ignore the rest):

  ```bash                         runnable: each command runs, in order, in
                                  a scratch folder with links to configs/,
                                  scripts/ and examples/, translated as
                                  docs/doc_commands.py says; it must exit 0
  ```bash shortened               runnable, with every stage of each
                                  `coordinator run CONFIG` cut to a few steps;
                                  only for a page that says the full command
                                  runs longer
  ```bash covered-by=//p:t,//q:u  needs what this test cannot give (root, a
                                  GPU, Slurm, a sanitizer build, Bazel), and
                                  the named tests run the same; each must be a
                                  target in its package's BUILD file
  ```bash not-run="reason"        nothing here can run it; the reason is in
                                  the summary

A ```bash block with any other info string, or a shell block fenced as sh,
shell or console, fails the test, naming the file and line.

Placeholders get real values from a live run: PORT (the coordinator's
port), RB_PORT (the replay buffer's), METRICS_PORT (Prometheus), ID (the
experiment id). The run is the page's own (a `coordinator run ... &` earlier
on the page) or, if the page has none, a run of the main job the test
starts, with a short SFT stage and a GRPO stage it stops at the end of the
page; commands wait until that run's step 41. A page that names
127.0.0.1:7401 (a cluster from `coordinator launch`) gets a launched cluster
on a free port instead, with the same job submitted to it, and 7401 becomes
that port. `runs/<...>` is a run the test started and cancelled after a few
GRPO steps (a fresh one for each command). `/secure/` is a folder of the
test's. A command ending in `&` runs in the background until the end of its
page; one whose comment says "until Ctrl-C" runs for a few seconds and is
then interrupted.

Usage: doc_commands_test.py ROOT WORKDIR [PAGE...] (ROOT: the runfiles tree;
PAGEs, e.g. docs/monitoring.md, run only those, after every page's markers
are checked).
"""
import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_commands  # noqa: E402

SHELL_LANGUAGES = ("sh", "shell", "console", "zsh", "shell-session")
PLACEHOLDER = re.compile(r"\b(PORT|RB_PORT|METRICS_PORT|ID)\b")
RUN_DIR_PLACEHOLDER = re.compile(r"runs/<[^>]*>")


def pages(root):
    docs = sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    names = ["README.md"] + [os.path.relpath(p, root) for p in docs]
    return [n for n in names if n not in ("docs/quickstart.md", "docs/configuration.md")]


def marker(block):
    """('run'|'shortened'|'covered-by'|'not-run', detail) of a block, or exits
    naming it."""
    info = block.info
    if info == "":
        return "run", None
    if info == "shortened":
        return "shortened", None
    m = re.fullmatch(r"covered-by=(//\S+)", info)
    if m:
        return "covered-by", m.group(1).split(",")
    m = re.fullmatch(r'not-run="([^"]+)"', info)
    if m:
        return "not-run", m.group(1)
    sys.exit(f"{block.where()}: unknown marker {info!r} after ```bash (use nothing, shortened, "
             f"covered-by=//pkg:target or not-run=\"reason\")")


def check_fences(path, text):
    """A shell block must be ```bash with a marker."""
    for k, line in enumerate(text.split("\n")):
        m = re.match(r"^ *```(\S+)", line)
        if m and m.group(1).lower() in SHELL_LANGUAGES:
            sys.exit(f"{path}:{k + 1}: a shell block must be ```bash with a marker (```{m.group(1)} is unmarked)")


class Proc:
    """A process the test started, its output collected as it comes; stopped
    with SIGINT (the coordinator cancels at a step boundary and stops its
    roles), then its process group killed."""

    def __init__(self, argv, cwd, label):
        self.label = label
        self.p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        self.out = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.out.append(line)

    def text(self):
        return "".join(self.out)

    def wait_for(self, pattern, seconds, what):
        deadline = time.time() + seconds
        while time.time() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m
            if self.p.poll() is not None:
                self.reader.join(5)
                m = re.search(pattern, self.text())
                if m:
                    return m
                sys.exit(f"{self.label}: exited {self.p.returncode} before {what}:\n{self.text()[-3000:]}")
            time.sleep(0.2)
        sys.exit(f"{self.label}: no {what} within {seconds} s:\n{self.text()[-3000:]}")

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.p.pid, signal.SIGKILL)  # what is left of the group
        except ProcessLookupError:
            pass
        self.p.wait()
        self.reader.join(5)
        return self.p.returncode


def wait_for_step(run_dir, stage, step, seconds, proc):
    """Waits until run_dir/metrics.jsonl has `stage`'s step `step`."""
    deadline = time.time() + seconds
    needle = f'"stage":"{stage}","step":{step},'
    path = os.path.join(run_dir, "metrics.jsonl")
    while time.time() < deadline:
        if os.path.exists(path) and needle in open(path).read():
            return
        if proc.p.poll() is not None:
            sys.exit(f"{proc.label}: exited {proc.p.returncode} before {stage} step {step}:\n{proc.text()[-3000:]}")
        time.sleep(0.3)
    sys.exit(f"{proc.label}: no {stage} step {step} within {seconds} s:\n{proc.text()[-3000:]}")


def live_values(proc):
    """The placeholders' values from a `coordinator run`'s output."""
    m = proc.wait_for(r"cluster up \(coordinator [\d.]+:(\d+)\); experiment (\S+)", 180, "'cluster up' line")
    values = {"PORT": m.group(1), "ID": m.group(2)}
    m = proc.wait_for(r"query it with: \S+ query --address [\d.]+:(\d+) ", 10, "replay buffer address")
    values["RB_PORT"] = m.group(1)
    m = re.search(r"metrics on http://[\d.]+:(\d+)/metrics", proc.text())
    if m:
        values["METRICS_PORT"] = m.group(1)
    return values


def stage_overrides(config_path):
    """--set flags that cut every stage of an experiment to a few steps."""
    stages = yaml.safe_load(open(config_path))["stages"]
    sets = []
    for i, stage in enumerate(stages):
        (kind,) = stage.keys()
        key = f"stages[{i}].{kind}.rl.steps=2" if kind in ("grpo", "ppo") else f"stages[{i}].{kind}.steps=20"
        sets += ["--set", shlex.quote(key)]
    return sets


class PageRun:
    def __init__(self, root, work, tmp, path):
        self.root, self.work, self.tmp, self.path = root, work, tmp, path
        self.coordinator = os.path.join(root, "coordinator/coordinator")
        self.background = []
        self.live = None
        self.fixtures = os.path.join(work, "fixtures")
        # A page that names a launched cluster's port (7401) gets a launched
        # cluster; any other a live `coordinator run`.
        self.launch = False

    def fixture_run(self, sets, label):
        argv = [self.coordinator, "run", "configs/grpo_arith_tiny.yaml", "--bin_dir=" + self.root,
                "--run_dir=" + self.fixtures, "--set", "stages[0].sft.steps=20"] + sets
        print(f"  (the test starts {label}: {' '.join(argv[1:])})", flush=True)
        proc = Proc(argv, self.work, label)
        m = proc.wait_for(r"run dir (\S+)", 60, "run dir")
        return proc, os.path.join(self.work, m.group(1))

    def ensure_live(self):
        if self.live is not None:
            return
        if self.launch:
            self.live = self.launched_cluster()
            return
        proc, run_dir = self.fixture_run(["--set", "stages[1].grpo.rl.steps=1000", "--set", "logging.prometheus_port=0"],
                                         "a live run for the placeholders")
        self.background.append(proc)
        self.live = live_values(proc)
        wait_for_step(run_dir, "grpo", 41, 300, proc)

    def launched_cluster(self):
        """`coordinator launch` on a free port with the main job submitted,
        once it is past GRPO step 41."""
        cluster = os.path.join(self.tmp, "live_cluster.yaml")
        with open(cluster, "w") as f:
            f.write("name: live\nrollout_workers: 2\nreward_servers: 1\nlearners: 1\n")
        run_dir = os.path.join(self.fixtures, "live")
        argv = [self.coordinator, "launch", "--cluster=" + cluster, "--bin_dir=" + self.root, "--run_dir=" + run_dir,
                "--metrics_port=0"]
        print(f"  (the test starts a cluster for the placeholders: {' '.join(argv[1:])})", flush=True)
        proc = Proc(argv, self.work, "a launched cluster for the placeholders")
        self.background.append(proc)
        port = proc.wait_for(r"cluster up \(coordinator [\d.]+:(\d+)\)", 180, "'cluster up' line").group(1)
        values = {"PORT": port, "RB_PORT": open(os.path.join(run_dir, "ports", "replay_buffer.port")).read().strip(),
                  "METRICS_PORT": re.search(r"metrics on http://[\d.]+:(\d+)/metrics", proc.text()).group(1)}
        submit = [self.coordinator, "submit", "configs/grpo_arith_tiny.yaml", "--address=127.0.0.1:" + port,
                  "--set", "stages[0].sft.steps=20", "--set", "stages[1].grpo.rl.steps=1000",
                  "--set", "rollout.max_batch=0"]
        print(f"  (and submits {' '.join(submit[1:])})", flush=True)
        p = subprocess.run(submit, cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=60)
        if p.returncode != 0:
            sys.exit(f"submit to the launched cluster exited {p.returncode}:\n{p.stdout}")
        values["ID"] = p.stdout.strip().splitlines()[-1]
        wait_for_step(os.path.join(run_dir, "experiments", values["ID"]), "grpo", 41, 300, proc)
        return values

    def cancelled_run(self):
        proc, run_dir = self.fixture_run(["--set", "stages[1].grpo.rl.steps=8", "--set", "checkpoint.every=2",
                                          "--set", "learner.shards=2", "--set", "learner.zero=1"],
                                         "a run to resume, cancelled after GRPO step 3")
        wait_for_step(run_dir, "grpo", 3, 300, proc)
        proc.stop()
        assert os.path.isdir(os.path.join(run_dir, "checkpoints", "1-grpo")), "the cancelled run saved no checkpoint"
        return run_dir

    def substitute(self, cmd):
        if RUN_DIR_PLACEHOLDER.search(cmd):
            cmd = RUN_DIR_PLACEHOLDER.sub(lambda m: shlex.quote(self.cancelled_run()), cmd)
        if "127.0.0.1:7401" in cmd:
            self.ensure_live()
            cmd = cmd.replace("127.0.0.1:7401", "127.0.0.1:" + self.live["PORT"])
        if PLACEHOLDER.search(cmd):
            self.ensure_live()
            for name in ("PORT", "RB_PORT", "METRICS_PORT", "ID"):
                if re.search(r"\b" + name + r"\b", cmd):
                    if name not in self.live:
                        sys.exit(f"{self.path}: the live run has no {name}")
                    cmd = re.sub(r"\b" + name + r"\b", self.live[name], cmd)
        if "/secure/" in cmd:
            os.makedirs(self.tmp + "secure", exist_ok=True)
            cmd = cmd.replace("/secure/", self.tmp + "secure/")
        return cmd

    def shorten(self, original, translated):
        argv = shlex.split(original)
        if "run" not in argv or "--resume" in argv:
            return translated
        configs = [a for a in argv[argv.index("run") + 1:] if a.endswith(".yaml") and not a.startswith("-")]
        if not configs:
            return translated
        return translated + " " + " ".join(stage_overrides(os.path.join(self.work, configs[0])))

    def run(self, command, shortened):
        where = f"{self.path}:{command.line}"
        try:
            cmd = doc_commands.translate(command.text, self.root, self.tmp)
        except doc_commands.Skipped as why:
            print(f"$ {command.text}\n  (not run: {why})", flush=True)
            return "skipped"
        if shortened:
            cmd = self.shorten(command.text, cmd)
        background = cmd.endswith("&") and not cmd.endswith("&&")
        if background:
            cmd = cmd[:-1].rstrip()
        cmd = self.substitute(cmd)
        print(f"$ {command.text}", flush=True)
        if cmd != command.text:
            print(f"  (runs {cmd})", flush=True)
        if background:
            if re.search(r"[;&|]", cmd):
                sys.exit(f"{where}: a background command must be one simple command")
            proc = Proc(["bash", "-c", "exec " + cmd], self.work, where)
            self.background.append(proc)
            if re.search(r"coordinator (run|launch) ", cmd):
                self.live = live_values(proc)
            else:
                proc.wait_for(r"listening on \S+", 60, "'listening on' line")
            print("  (running in the background)", flush=True)
            return "run"
        if "until Ctrl-C" in command.comment:
            proc = Proc(["bash", "-c", "exec " + cmd], self.work, where)
            time.sleep(5)
            if proc.p.poll() is not None:
                sys.exit(f"{where}: {command.text!r} exited {proc.p.returncode} before Ctrl-C:\n{proc.text()[-3000:]}")
            proc.stop()
            print(proc.text()[-2000:], flush=True)
            return "run"
        p = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=self.work, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=600)
        print(p.stdout[-2000:], flush=True)
        if p.returncode != 0:
            sys.exit(f"{where}: {command.text!r} exited {p.returncode}")
        return "run"

    def stop(self):
        for proc in reversed(self.background):
            proc.stop()


def main():
    root, work, only = sys.argv[1], sys.argv[2], sys.argv[3:]
    tmp = doc_commands.scratch_dir(root, work)
    started = time.time()
    summary = []
    # Every page's markers first: a bad marker fails before anything runs.
    plan = []
    for path in pages(root):
        text = open(os.path.join(root, path)).read()
        check_fences(path, text)
        blocks = [(b, marker(b)) for b in doc_commands.bash_blocks(text, path)]
        for block, (kind, detail) in blocks:
            if kind == "covered-by":
                for label in detail:
                    doc_commands.check_target(root, label, block.where())
        plan.append((path, blocks))
    for path, blocks in plan:
        if only and path not in only:
            continue
        counts = {"run": 0, "skipped": 0, "covered-by": 0, "not-run": 0}
        notes = []
        page_started = time.time()
        page = PageRun(root, work, tmp, path)
        page.launch = any(k in ("run", "shortened") and "127.0.0.1:7401" in b.body for b, (k, _) in blocks)
        try:
            for block, (kind, detail) in blocks:
                cmds = doc_commands.commands(block)
                if kind == "covered-by":
                    counts["covered-by"] += len(cmds)
                    notes.append(f"{block.where()}: {len(cmds)} covered by {', '.join(detail)}")
                elif kind == "not-run":
                    counts["not-run"] += len(cmds)
                    notes.append(f"{block.where()}: {len(cmds)} not run: {detail}")
                else:
                    print(f"--- {block.where()}{' (shortened)' if kind == 'shortened' else ''}", flush=True)
                    for command in cmds:
                        counts[page.run(command, kind == "shortened")] += 1
        except BaseException:
            print("\ndoc_commands_test: pages done before the failure:\n" + "\n".join(summary), flush=True)
            raise
        finally:
            page.stop()
        line = (f"{path}: {counts['run']} run, {counts['skipped']} not run (bazel/setup), "
                f"{counts['covered-by']} covered-by, {counts['not-run']} not-run "
                f"({time.time() - page_started:.0f} s)")
        summary.append(line)
        summary += ["  " + n for n in notes]
    print("\ndoc_commands_test summary:")
    print("\n".join(summary))
    print(f"total {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
