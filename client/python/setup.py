"""Builds the package with its gRPC modules generated from the repository's proto/ at build time
(protoc and grpc_python_plugin, Debian's protobuf-compiler and protobuf-compiler-grpc): nothing
generated is checked in. The modules go to krause_serve/_gen/ in the build, their imports
rewritten to live there, so that they never clash with another copy of the same .proto files.
KRAUSE_PROTO_DIR overrides where the .proto files are (default: ../../proto from here)."""
import os
import pathlib
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTOS = ["krause/v1/krause.proto", "google/rpc/status.proto", "google/rpc/error_details.proto"]


def generate(out):
    proto_dir = pathlib.Path(os.environ.get("KRAUSE_PROTO_DIR", HERE.parent.parent / "proto"))
    if not (proto_dir / PROTOS[0]).exists():
        raise SystemExit(f"krause-serve: no {PROTOS[0]} under {proto_dir} (build from the "
                         "repository's checkout, or set KRAUSE_PROTO_DIR)")
    for tool in ("protoc", "grpc_python_plugin"):
        if shutil.which(tool) is None:
            raise SystemExit(f"krause-serve: {tool} is missing (Debian: protobuf-compiler, "
                             "protobuf-compiler-grpc)")
    gen = out / "krause_serve" / "_gen"
    shutil.rmtree(gen, ignore_errors=True)
    gen.mkdir(parents=True)
    subprocess.run(["protoc", f"-I{proto_dir}", f"--python_out={gen}", f"--grpc_python_out={gen}",
                    f"--plugin=protoc-gen-grpc_python={shutil.which('grpc_python_plugin')}"]
                   + PROTOS, check=True)
    for path in gen.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"^from (krause\.v1|google\.rpc) import",
                      r"from krause_serve._gen.\1 import", text, flags=re.M)
        path.write_text(text)
    for folder in [gen] + [p for p in gen.rglob("*") if p.is_dir()]:
        (folder / "__init__.py").touch()


class BuildWithProtos(build_py):
    def run(self):
        super().run()
        generate(pathlib.Path(self.build_lib))


setup(cmdclass={"build_py": BuildWithProtos})
