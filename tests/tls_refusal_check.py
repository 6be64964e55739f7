#!/usr/bin/env python3
"""Calls one method of every rlmesh service (and the health check) on the
given servers with each kind of client, and checks who gets in:

  plaintext                      -> refused at the transport (UNAVAILABLE)
  TLS, no client certificate     -> refused at the handshake (UNAVAILABLE)
  TLS, rogue client certificate  -> refused at the handshake (UNAVAILABLE)
  TLS, wrong root (cannot verify the server) -> UNAVAILABLE
  mutual TLS, no token           -> UNAUTHENTICATED (health: answers, liveness only)
  mutual TLS + token             -> past auth (OK or an error about the request)

usage: tls_refusal_check.py CERT_DIR TOKEN NAME=SERVICE@HOST:PORT ...
Exit 0 when every expectation holds; prints one line per check.
"""
import sys

import grpc

SERVICE_METHOD = {
    "coordinator": "/rlmesh.Coordinator/List",
    "learner": "/rlmesh.Learner/GetStatus",
    "replay_buffer": "/rlmesh.ReplayBuffer/Stats",
    "reward_server": "/rlmesh.RewardService/GetStatus",
    "rollout_worker": "/rlmesh.RolloutService/GetStatus",
}
HEALTH = "/grpc.health.v1.Health/Check"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def call(address, method, creds, token):
    if creds is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, creds)
    metadata = [("authorization", "Bearer " + token)] if token else None
    try:
        channel.unary_unary(method, request_serializer=None, response_deserializer=None)(
            b"", timeout=5, metadata=metadata)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        channel.close()


def main():
    certs, token, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    ca, node_pem, node_key = read(certs + "/ca.pem"), read(certs + "/node.pem"), read(certs + "/node.key")
    rogue_pem, rogue_key, rogue_ca = read(certs + "/rogue.pem"), read(certs + "/rogue.key"), read(certs + "/rogue-ca.pem")
    clients = {
        "plaintext": (None, token),
        "tls without client certificate": (grpc.ssl_channel_credentials(ca), token),
        "tls with a rogue client certificate": (grpc.ssl_channel_credentials(ca, rogue_key, rogue_pem), token),
        "tls trusting another root": (grpc.ssl_channel_credentials(rogue_ca, node_key, node_pem), token),
        "mutual tls without the token": (grpc.ssl_channel_credentials(ca, node_key, node_pem), ""),
        "mutual tls with the token": (grpc.ssl_channel_credentials(ca, node_key, node_pem), token),
    }
    refused = {grpc.StatusCode.UNAVAILABLE}
    failures = 0
    for target in targets:
        name, rest = target.split("=", 1)
        service, address = rest.split("@", 1)
        for method, is_health in ((SERVICE_METHOD[service], False), (HEALTH, True)):
            for client, (creds, tok) in clients.items():
                code = call(address, method, creds, tok)
                if client.startswith("mutual tls with the token"):
                    ok = code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
                elif client == "mutual tls without the token":
                    # The health check reports liveness only and answers
                    # without the token; every service method wants it.
                    ok = code == grpc.StatusCode.OK if is_health else code == grpc.StatusCode.UNAUTHENTICATED
                else:
                    ok = code in refused
                failures += not ok
                print(f"tls_refusal_check: {'ok  ' if ok else 'FAIL'} {name} {method} {client}: {code.name}")
    print(f"tls_refusal_check: {failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
