"""An environment server in Python, generated from proto/environment.proto with grpcio-tools.

Usage: python_environment_server.py PROTO_ROOT OUT_DIR PORT_FILE
A counting environment: the first observation is "[" ; after model turn k
(0-based) the observation is "<k>" — sent as token ids (the char
tokenizer's ids for "<", the digit, ">") on even turns and as text on odd
ones, so both paths are exercised — with reward 0.5 when the turn had
tokens; done after 2 steps. info records what arrived. Exits on SIGTERM.
"""
import os
import signal
import sys
import threading
from concurrent import futures

# The char tokenizer (actor/tokenizer.cc): 4 specials, then this alphabet.
ALPHABET = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ \n"
            "+-*/=()<>.,:;?!'\"_%#@&^|~[]{}$`\\")


def char_ids(text):
    return [4 + ALPHABET.index(c) for c in text]


def main():
    proto_root, out_dir, port_file = sys.argv[1:4]
    from grpc_tools import protoc
    import grpc_tools

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main([
        "protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}", f"{proto_root}/proto/environment.proto",
    ])
    if rc != 0:
        sys.exit("protoc failed for environment.proto")
    sys.path.insert(0, out_dir)
    import grpc
    from proto import environment_pb2, environment_pb2_grpc

    lock = threading.Lock()
    episodes = {}

    class Counting(environment_pb2_grpc.EnvironmentServiceServicer):
        def Reset(self, request, context):
            with lock:
                episode_id = f"py-{len(episodes) + 1}"
                episodes[episode_id] = 0
            return environment_pb2.ResetResponse(episode_id=episode_id, observation="[")

        def Step(self, request, context):
            with lock:
                if request.episode_id not in episodes:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"episode {request.episode_id} unknown")
                turn = episodes[request.episode_id]
                episodes[request.episode_id] = turn + 1
            resp = environment_pb2.StepResponse(
                reward=0.5 if len(request.action_token_ids) > 0 else 0.0, done=turn + 1 >= 2)
            obs = f"<{turn}>"
            if turn % 2 == 0:
                resp.observation_token_ids.extend(char_ids(obs))
            else:
                resp.observation = obs
            resp.info["tokens"] = str(len(request.action_token_ids))
            resp.info["turn"] = str(request.turn)
            return resp

        def Close(self, request, context):
            with lock:
                episodes.pop(request.episode_id, None)
            return environment_pb2.CloseResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    environment_pb2_grpc.add_EnvironmentServiceServicer_to_server(Counting(), server)
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
