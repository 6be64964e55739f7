"""Finds LibTorch inside the PyPI `torch` wheel and exposes it as @libtorch//:torch.

Order: $RLMESH_TORCH_DIR (the torch package folder), else the `torch` that
$RLMESH_PYTHON (default: python3 on PATH) imports. scripts/setup.sh installs it.
"""

def _find_torch(ctx):
    explicit = ctx.os.environ.get("RLMESH_TORCH_DIR", "")
    if explicit:
        return explicit
    python = ctx.os.environ.get("RLMESH_PYTHON", "python3")
    res = ctx.execute([python, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"])
    if res.return_code != 0:
        fail("rlmesh: cannot import torch with %s (run scripts/setup.sh, or set RLMESH_TORCH_DIR): %s" % (python, res.stderr))
    return res.stdout.strip()

def _torch_repository_impl(ctx):
    torch_dir = _find_torch(ctx)
    lib = torch_dir + "/lib"
    if not ctx.path(lib + "/libtorch_cpu.so").exists:
        fail("rlmesh: %s has no lib/libtorch_cpu.so; is it the PyPI torch wheel?" % torch_dir)
    # Every header folder of the wheel except google/: that is the wheel's own
    # protobuf, which would shadow Debian's /usr/include/google/protobuf that
    # our generated code must compile against.
    for entry in ctx.path(torch_dir + "/include").readdir():
        if entry.basename != "google":
            ctx.symlink(entry, "include/" + entry.basename)

    # libtorch_cpu.so of the CUDA wheel needs libcudart/libcupti from the
    # nvidia-* wheels that sit beside torch in site-packages.
    site = ctx.path(torch_dir).dirname
    rpaths = [lib]
    for sub in ["nvidia/cu13/lib", "nvidia/cuda_runtime/lib", "nvidia/cuda_cupti/lib"]:
        p = "%s/%s" % (site, sub)
        if ctx.path(p).exists:
            rpaths.append(p)
    linkopts = ["-L" + lib]

    # DT_RPATH (not RUNPATH) so that libtorch_cpu's own dependencies are found too.
    linkopts.append("-Wl,--disable-new-dtags")
    for r in rpaths:
        linkopts.append("-Wl,-rpath," + r)
    # push/pop, not a bare --as-needed after them: that would switch every
    # library linked later to --as-needed, and a system library that only
    # our shared objects use (libgrpc++ under the *_cc_grpc libraries) would
    # be dropped from a binary that then fails to start.
    linkopts += ["-Wl,--push-state,--no-as-needed", "-ltorch_cpu", "-lc10", "-Wl,--pop-state"]

    # LibTorch's CUDA libraries, for the one shared object that must link
    # them (//dist:libtorch_cuda_shim.so, loaded with dlopen): libtorch_cuda and
    # libc10_cuda, and the nvidia wheels they need at run time.
    cuda_rpaths = [lib]
    for sub in ["nvidia/cu13/lib", "nvidia/nccl/lib", "nvidia/cudnn/lib", "nvidia/cusparselt/lib", "nvidia/nvshmem/lib"]:
        p = "%s/%s" % (site, sub)
        if ctx.path(p).exists:
            cuda_rpaths.append(p)
    cuda_linkopts = ["-L" + lib, "-Wl,--disable-new-dtags"] + ["-Wl,-rpath," + r for r in cuda_rpaths]
    cuda_linkopts += ["-Wl,--push-state,--no-as-needed", "-ltorch_cuda", "-lc10_cuda", "-Wl,--pop-state"]

    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# Links LibTorch's CUDA libraries: only for a shared object loaded with
# dlopen (a binary linking them would not start without them).
cc_library(
    name = "torch_cuda_link",
    linkopts = {cuda_linkopts},
)

# Torch's headers are many; keep <torch/torch.h> out of most files.
cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"]),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["USE_C10D_GLOO"],
    linkopts = {linkopts},
)

exports_files(["torch_dir.txt"])
""".format(linkopts = repr(linkopts), cuda_linkopts = repr(cuda_linkopts)))
    ctx.file("torch_dir.txt", torch_dir + "\n")

torch_repository = repository_rule(
    implementation = _torch_repository_impl,
    environ = ["RLMESH_TORCH_DIR", "RLMESH_PYTHON", "PATH"],
    local = True,
)
