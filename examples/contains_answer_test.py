"""Checks examples/rewards/contains_answer.py as the reward server runs it.

Usage: contains_answer_test.py ROOT REWARD_SERVER_BINARY WORK_DIR

1. Feeds the script the exact line reward_server/verifiers.cc writes (a
   compact JSON object with sorted keys, then a newline) and checks the number
   it prints.
2. Starts the real reward_server allowing the script, sends a Score request
   whose verifiers name it (stubs generated from proto/ with grpcio-tools),
   and checks each item's reward and component.
"""
import json
import os
import subprocess
import sys
import time

CASES = [
    # (prompt, completion, reference answer, expected score)
    ("57+68=", "125", "125", 1.0),
    ("57+68=", "The sum is 125.", "125", 1.0),
    ("57+68=", "1125", "125", 0.0),
    ("57+68=", "15", "125", 0.0),
    ("How many?", "about 12.5 of them", "12", 0.0),
    ("Name it", "It is Paris, France", "Paris", 1.0),
]
DEADLINE_S = 60


def fail(msg):
    sys.exit("contains_answer_test: FAIL: " + msg)


def wire_line(prompt, completion, reference):
    # nlohmann::json::dump() of {prompt, completion, reference_answer}: keys
    # in sorted order, no spaces, UTF-8 as is.
    obj = {"prompt": prompt, "completion": completion, "reference_answer": reference}
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


def check_script(script):
    for prompt, completion, reference, want in CASES:
        out = subprocess.run([script], input=wire_line(prompt, completion, reference), text=True,
                             stdout=subprocess.PIPE, timeout=DEADLINE_S, check=True).stdout
        if float(out.strip()) != want:
            fail("%r / %r: printed %r, want %s" % (completion, reference, out, want))
    print("script: %d cases ok" % len(CASES))


def generate_stubs(root, out_dir):
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for name in ("common", "config", "reward"):
        rc = protoc.main(["protoc", "-I" + root, "-I" + include, "--python_out=" + out_dir,
                          "--grpc_python_out=" + out_dir, os.path.join(root, "proto", name + ".proto")])
        if rc != 0:
            fail("protoc failed on proto/%s.proto" % name)
    sys.path.insert(0, out_dir)


def check_server(root, binary, script, work):
    generate_stubs(root, work)
    import grpc
    from proto import config_pb2, reward_pb2, reward_pb2_grpc

    port_file = os.path.join(work, "port")
    log = open(os.path.join(work, "reward_server.log"), "w")
    server = subprocess.Popen([binary, "--port=0", "--port_file=" + port_file,
                               "--allowed_commands=" + script], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + DEADLINE_S
        while not os.path.exists(port_file):
            if server.poll() is not None or time.time() > deadline:
                fail("reward_server did not report its port; its log:\n" + open(log.name).read())
            time.sleep(0.05)
        port = open(port_file).read().strip()
        channel = grpc.insecure_channel("127.0.0.1:" + port)
        grpc.channel_ready_future(channel).result(timeout=DEADLINE_S)
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        request = reward_pb2.ScoreRequest(experiment_id="contains_answer_test", verifier_timeout_ms=20000)
        request.verifiers.add(name="command", command=[script], label="contains_answer", weight=1.0)
        for i, (prompt, completion, reference, _) in enumerate(CASES):
            request.items.add(item_id=str(i), prompt_text=prompt, completion_text=completion,
                              reference_answer=reference)
        response = stub.Score(request, timeout=DEADLINE_S)
        if len(response.results) != len(CASES):
            fail("%d results for %d items" % (len(response.results), len(CASES)))
        for (_, completion, reference, want), result in zip(CASES, response.results):
            if list(result.timed_out):
                fail("%r timed out: %s" % (completion, list(result.timed_out)))
            if result.reward != want or result.components["contains_answer"] != want:
                fail("%r / %r: reward %s, components %s, want %s" % (
                    completion, reference, result.reward, dict(result.components), want))
        print("reward_server: %d items scored as expected (%s)" % (len(CASES), response.reward_source))

        # A program the server was not started allowing is refused.
        other = reward_pb2.ScoreRequest(experiment_id="contains_answer_test")
        other.verifiers.add(name="command", command=["/bin/true"])
        other.items.add(item_id="x", prompt_text="p", completion_text="c", reference_answer="r")
        try:
            stub.Score(other, timeout=DEADLINE_S)
            fail("a Score naming /bin/true was accepted")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.PERMISSION_DENIED:
                fail("a Score naming /bin/true: %s, want PERMISSION_DENIED" % e.code())
        print("reward_server: an unlisted program is refused")
        channel.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def main():
    root, binary, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    script = os.path.join(root, "examples", "rewards", "contains_answer.py")
    check_script(script)
    check_server(root, binary, script, work)
    print("PASS")


if __name__ == "__main__":
    main()
