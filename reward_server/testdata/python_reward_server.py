"""A reward server in Python, generated from proto/reward.proto with grpcio-tools.

Usage: python_reward_server.py PROTO_ROOT OUT_DIR PORT_FILE
Scores 1.0 when the completion text ends with the reference answer, else 0.0,
and reports itself as reward_source "python:endswith". Exits on SIGTERM.
"""
import os
import signal
import sys
from concurrent import futures


def main():
    proto_root, out_dir, port_file = sys.argv[1:4]
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for name in ("common", "config", "reward"):
        rc = protoc.main([
            "protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", f"{proto_root}/proto/{name}.proto",
        ])
        if rc != 0:
            sys.exit(f"protoc failed for {name}.proto")
    sys.path.insert(0, out_dir)
    import grpc
    from proto import reward_pb2, reward_pb2_grpc

    class EndsWith(reward_pb2_grpc.RewardServiceServicer):
        def Score(self, request, context):
            resp = reward_pb2.ScoreResponse(reward_source="python:endswith")
            for item in request.items:
                text = item.completion_text
                ok = bool(item.reference_answer) and text.strip().endswith(item.reference_answer)
                r = resp.results.add(item_id=item.item_id, reward=1.0 if ok else 0.0,
                                     completion_text=text)
                r.components["endswith"] = r.reward
            return resp

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    reward_pb2_grpc.add_RewardServiceServicer_to_server(EndsWith(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.rename(tmp, port_file)
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0.5))
    server.wait_for_termination()


if __name__ == "__main__":
    main()
