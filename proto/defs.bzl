"""C++ protobuf + gRPC code from /usr/bin/protoc and /usr/bin/grpc_cpp_plugin.

Bazel's native proto_library would download its own protoc; these genrules
use the system's, which matches the system libprotobuf and libgrpc++.
"""

def rlmesh_proto(name, deps = [], services = False):
    """Targets for proto/<name>.proto, one proto file each.

    :<name>_proto_files  the .proto and every .proto it imports (transitively)
    :<name>_cc_proto     the messages (<name>.pb.h); links protobuf only
    :<name>_cc_grpc      with services = True: the stubs and service bases
                         (<name>.grpc.pb.h); links gRPC

    Args:
      name: the file's base name ("reward" for reward.proto).
      deps: base names of the protos it imports (in this package); protos
        import each other as "proto/<file>.proto" (paths from the workspace root).
      services: whether the file declares a service.
    """
    src = name + ".proto"
    path = native.package_name() + "/" + src
    native.filegroup(
        name = name + "_proto_files",
        srcs = [src] + [":" + d + "_proto_files" for d in deps],
    )
    native.genrule(
        name = name + "_pb_codegen",
        srcs = [":" + name + "_proto_files"],
        outs = [name + ".pb.h", name + ".pb.cc"],
        cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) " + path,
    )
    native.cc_library(
        name = name + "_cc_proto",
        srcs = [name + ".pb.cc"],
        hdrs = [name + ".pb.h"],
        deps = [":" + d + "_cc_proto" for d in deps] + ["@system//:protobuf"],
    )
    if services:
        native.genrule(
            name = name + "_grpc_codegen",
            srcs = [":" + name + "_proto_files"],
            outs = [name + ".grpc.pb.h", name + ".grpc.pb.cc"],
            cmd = ("/usr/bin/protoc -I. --grpc_out=$(GENDIR) " +
                   "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin " + path),
        )
        native.cc_library(
            name = name + "_cc_grpc",
            srcs = [name + ".grpc.pb.cc"],
            hdrs = [name + ".grpc.pb.h"],
            deps = [
                ":" + name + "_cc_proto",
                "@system//:grpc",
            ],
        )
