"""Builds the rlmesh client with its gRPC stubs generated from ../proto.

The stubs are not kept in the source tree: `pip install ./python` runs
grpcio-tools' protoc over the project's .proto files (or those under
$RLMESH_PROTO_DIR) and puts the modules, with .pyi type stubs, in
rlmesh/proto/ of the built package. The .proto files import each other as
"proto/x.proto"; they are copied under rlmesh/proto/ with those imports
rewritten, so the generated modules import `rlmesh.proto.x_pb2`.
"""

import os
import pathlib
import re
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent


def proto_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("RLMESH_PROTO_DIR", HERE.parent / "proto"))
    if not (d / "coordinator.proto").is_file():
        raise SystemExit(f"rlmesh: no coordinator.proto in {d}; set RLMESH_PROTO_DIR to the project's proto/ folder")
    return d


def generate_stubs(out_root: pathlib.Path) -> None:
    from grpc_tools import protoc  # a build requirement (pyproject.toml)
    import grpc_tools

    src = proto_dir()
    with tempfile.TemporaryDirectory() as tmp:
        pkg = pathlib.Path(tmp) / "rlmesh" / "proto"
        pkg.mkdir(parents=True)
        names = sorted(p.name for p in src.glob("*.proto"))
        for name in names:
            text = (src / name).read_text()
            text = re.sub(r'import "proto/', 'import "rlmesh/proto/', text)
            (pkg / name).write_text(text)
        dest = out_root / "rlmesh" / "proto"
        dest.mkdir(parents=True, exist_ok=True)
        well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
        args = ["protoc", f"-I{tmp}", f"-I{well_known}", f"--python_out={out_root}", f"--pyi_out={out_root}",
                f"--grpc_python_out={out_root}"] + [f"rlmesh/proto/{n}" for n in names]
        if protoc.main(args) != 0:
            raise SystemExit("rlmesh: protoc failed on " + " ".join(names))
        (dest / "__init__.py").write_text('"""Messages and stubs generated from rlmesh\'s proto/ at build time."""\n')


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        generate_stubs(pathlib.Path(self.build_lib))


setup(cmdclass={"build_py": BuildPyWithStubs})
