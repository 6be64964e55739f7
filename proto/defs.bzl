"""C++ protobuf + gRPC code from /usr/bin/protoc and /usr/bin/grpc_cpp_plugin."""

def cc_grpc_library(name, srcs, deps = []):
    """One cc_library with the messages and services of every proto in srcs.

    Protos import each other as "proto/<file>.proto" (paths from the workspace root).
    """
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc", base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_codegen",
        srcs = srcs,
        outs = outs,
        cmd = ("/usr/bin/protoc -I. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(SRCS)"),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:grpc"],
    )
