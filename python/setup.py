"""pip install ./python (offline: pip install --no-build-isolation ./python): the dt module with
gRPC stubs generated from ../proto by protoc and grpc_python_plugin (Debian: protobuf-compiler,
protobuf-compiler-grpc). It needs grpcio and protobuf (Debian: python3-grpcio, python3-protobuf)."""
import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        proto_dir = os.path.join(HERE, "..", "proto")
        protos = sorted(glob.glob(os.path.join(proto_dir, "dt", "v1", "*.proto")))
        plugin = shutil.which("grpc_python_plugin")
        protoc = shutil.which("protoc")
        if not protos or not plugin or not protoc:
            raise SystemExit("building dt needs ../proto, protoc and grpc_python_plugin "
                             "(apt install protobuf-compiler protobuf-compiler-grpc)")
        subprocess.check_call([protoc, f"--proto_path={proto_dir}", f"--python_out={self.build_lib}",
                               f"--grpc_python_out={self.build_lib}",
                               f"--plugin=protoc-gen-grpc_python={plugin}", *protos])
        open(os.path.join(self.build_lib, "dt", "v1", "__init__.py"), "a").close()


setup(
    name="dt",
    version="0.1.0",
    description="dt for Python programs run by dtrun: metrics, barriers and checkpoint rounds",
    packages=["dt"],
    python_requires=">=3.9",
    cmdclass={"build_py": BuildWithStubs},
)
