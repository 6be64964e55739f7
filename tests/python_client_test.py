"""The Python client (python/, built with `pip install`) against a real cluster.

Launches `coordinator launch` with a token, submits a short SFT + GRPO
experiment as a dict with a --set-style override, waits for it, and checks
what the client returns against the run's own files: metrics() equals
metrics.jsonl record for record, the buffer's paged query returns every
stored trajectory once and in order, filters hold, export writes what Stats
counts. Bad input comes back as RlmeshError with the code and the field.

usage: python_client_test.py BIN_DIR WORK_DIR   (rlmesh importable)
"""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import grpc
import rlmesh

BIN_DIR, WORK = sys.argv[1], sys.argv[2]
TOKEN = "python-client-test-token"

EXPERIMENT = {
    "name": "pyclient",
    "seed": 7,
    "model": {"init": "scratch", "arch": "llama", "hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1,
              "max_positions": 32, "tokenizer": "char"},
    "task": {"kind": "arithmetic", "digits": 1, "ops": "+", "train": 2000, "eval": 40},
    "stages": [
        {"sft": {"steps": 30, "batch": 32, "optimizer": {"lr": 3.0e-3}}},
        {"grpo": {"rl": {"steps": 50, "prompts_per_step": 4, "samples_per_prompt": 4,
                         "optimizer": {"lr": 1.0e-4}}}},
    ],
    "rollout": {"workers": 1, "sampling": {"temperature": 1.0, "max_new_tokens": 4}},
    "reward": {"verifiers": [{"name": "numeric_answer", "weight": 1.0}]},
    "learner": {"shards": 1},
    "weight_sync": {"backend": "shm"},
    "eval": {"every": 2},
}
GRPO_STEPS = 3  # set by the override below: the dict says 50


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what, flush=True)


def expect_error(code, fn, must_mention=""):
    try:
        fn()
    except rlmesh.RlmeshError as e:
        check(e.code == code and must_mention in e.details, f"{e.method} fails with {code.name} ({e.details[:80]})")
        return
    raise AssertionError(f"expected {code.name}")


def main():
    os.makedirs(WORK, exist_ok=True)
    with open(f"{WORK}/token", "w") as f:
        f.write(TOKEN + "\n")
    with open(f"{WORK}/cluster.yaml", "w") as f:
        f.write(f"name: pyclient\ncoordinator_port: 0\nrollout_workers: 1\nreward_servers: 1\nlearners: 1\n"
                f"auth_token_file: {WORK}/token\nrun_dir: {WORK}/runs\n")
    port_file = f"{WORK}/coordinator.port"
    log = open(f"{WORK}/coordinator.log", "w")
    coord = subprocess.Popen([f"{BIN_DIR}/coordinator/coordinator", "launch", f"--cluster={WORK}/cluster.yaml",
                              f"--bin_dir={BIN_DIR}", f"--port_file={port_file}"],
                             stdout=log, stderr=subprocess.STDOUT, cwd=WORK)
    try:
        deadline = time.monotonic() + 120
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if coord.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("coordinator did not start: " + open(f"{WORK}/coordinator.log").read())
            time.sleep(0.2)
        address = "127.0.0.1:" + open(port_file).read().strip()
        run(address)
    finally:
        coord.send_signal(signal.SIGTERM)
        try:
            coord.wait(timeout=60)
        except subprocess.TimeoutExpired:
            coord.kill()
            raise


def run(address):
    anonymous = rlmesh.connect(address, timeout=10)
    expect_error(grpc.StatusCode.UNAUTHENTICATED, anonymous.list)
    c = rlmesh.connect(address, token=TOKEN, timeout=30)

    # Bad input: named, never a crash.
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: c.submit(dict(EXPERIMENT, bogus_field=1)), "bogus_field")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                 lambda: c.submit(EXPERIMENT, overrides=["stages[1].grpo.rl.steps=many"]), "steps")
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: c.cancel("no-such-experiment"))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: c.metrics("no-such-experiment"))

    exp = c.submit(EXPERIMENT, overrides=[f"stages[1].grpo.rl.steps={GRPO_STEPS}"])
    check(exp.startswith("pyclient-"), f"submit returns an id ({exp})")
    final = c.wait(exp, timeout=600, poll=0.5)
    check(final["state"] == "SUCCEEDED", f"experiment {exp} succeeded ({final['state']} {final['error']})")
    check(any(e["experiment_id"] == exp for e in c.list()), "list() has it")
    roles = c.status(exp)["roles"]
    check({r["role"] for r in roles} >= {"ROLE_REPLAY_BUFFER", "ROLE_LEARNER", "ROLE_ROLLOUT_WORKER"},
          "status() lists the roles")

    # metrics(): every record of the run's metrics.jsonl, in order, paged.
    records = c.metrics(exp, page_size=7)
    with open(os.path.join(final["run_dir"], "metrics.jsonl")) as f:
        on_disk = [json.loads(line) for line in f if line.strip()]
    check(records == on_disk and len(records) > 7, f"metrics() pages through all {len(on_disk)} records")
    grpo_steps = [r for r in c.metrics(exp, event="step") if r.get("stage") == "grpo"]
    check([r["step"] for r in grpo_steps] == list(range(1, GRPO_STEPS + 1)),
          "the override set the GRPO steps, and each has a record")
    check(all(isinstance(r["reward_mean"], float) for r in grpo_steps), "step records carry reward_mean")

    # The buffer: paged query == Stats; filters hold; export counts.
    buf = c.buffer()
    stats = [s for s in buf.stats(exp) if s["experiment_id"] == exp]
    check(len(stats) == 1 and stats[0]["trajectories"] == GRPO_STEPS * 4 * 4,
          f"stats: {GRPO_STEPS} steps x 4 prompts x 4 samples stored")
    mem = buf.store_memory()
    check(set(mem) == {"block_cache_usage", "block_cache_capacity", "memtables", "table_readers"} and
          mem["block_cache_capacity"] > 0 and 0 <= mem["block_cache_usage"] <= mem["block_cache_capacity"] and
          mem["memtables"] > 0, f"store_memory: RocksDB's accounting ({mem})")
    trajs = list(buf.query(exp, page_size=5))
    check(len(trajs) == stats[0]["trajectories"], "query pages through every trajectory")
    check(len({t["trajectory_id"] for t in trajs}) == len(trajs), "no trajectory twice across pages")
    steps = [t["step"] for t in trajs]
    groups = [t["group_id"] for t in trajs]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    check(steps == sorted(steps) and len(runs) == len(set(groups)) and
          all([t["sample_index"] for t in trajs if t["group_id"] == g] == [0, 1, 2, 3] for g in runs),
          "ordered by step, each group's samples together and in order")
    check(isinstance(trajs[0]["step"], int) and isinstance(trajs[0]["response_token_ids"], list),
          "64-bit fields are ints, repeated fields lists")
    good = list(buf.query(exp, min_reward=1.0))
    check(all(t["reward"] >= 1.0 for t in good) and len(good) == sum(t["reward"] >= 1.0 for t in trajs),
          f"min_reward filter ({len(good)} of {len(trajs)})")
    last = list(buf.query(exp, min_step=GRPO_STEPS, max_step=GRPO_STEPS))
    check(len(last) == 16 and all(t["step"] == GRPO_STEPS for t in last), "step range filter")
    check(len(list(buf.query(exp, limit=3))) == 3, "limit stops the iteration")
    stopped = list(buf.query(exp, finish_reason="stop"))
    check(all(t["finish_reason"] == "FINISH_REASON_STOP" for t in stopped) and
          len(stopped) == sum(t["finish_reason"] == "FINISH_REASON_STOP" for t in trajs),
          f"finish_reason filter ({len(stopped)} stopped)")
    try:
        list(buf.query(exp, finish_reason="bored"))
        raise AssertionError("an unknown finish reason was accepted")
    except ValueError as e:
        check("finish_reason" in str(e), "an unknown finish reason is refused by name")
    aggs = buf.aggregates(exp)
    check([a["step"] for a in aggs] == list(range(1, GRPO_STEPS + 1)) and all(a["count"] == 16 for a in aggs),
          "aggregates per step")
    exported = buf.export(exp)
    check(len(exported) == len(trajs), "export returns every trajectory")
    path = os.path.join(WORK, "export.jsonl")
    n = buf.export(exp, path=path)
    with open(path) as f:
        check(n == len(trajs) and sum(1 for _ in f) == n, "export to a file writes every record")
    check(not glob.glob(path + ".tmp-*"), "no temporary file left behind")
    try:
        buf.export(exp, format="xml")
    except ValueError as e:
        check("format" in str(e), "an unknown export format is refused by name")


if __name__ == "__main__":
    main()
    print("PASSED")
