"""Regenerate src/trainguard/format/proto/event_pb2.py from event.proto.

Needs grpcio-tools (`pip install grpcio-tools`). The generated module is committed so that
installing trainguard never needs protoc.

protoc pins the generated code to its own protobuf runtime version (a call to
``ValidateProtobufRuntimeVersion``), which would force every user onto the newest protobuf.
The builder API the generated code uses exists since protobuf 3.20, so we drop that pin: users
whose environment pins an older protobuf (TensorFlow, ONNX) can still install trainguard.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO = "trainguard/format/proto/event.proto"


def main() -> None:
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", "src", "--python_out=src", f"src/{PROTO}"],
        cwd=ROOT,
        check=True,
    )
    generated = ROOT / "src" / PROTO.replace(".proto", "_pb2.py")
    text = generated.read_text()
    text = re.sub(r"from google\.protobuf import runtime_version as _runtime_version\n", "", text)
    text = re.sub(r"_runtime_version\.ValidateProtobufRuntimeVersion\(.*?\n\)\n", "", text, flags=re.S)
    generated.write_text(text)


if __name__ == "__main__":
    main()
