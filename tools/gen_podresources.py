"""Regenerate exporter/kubelet/api_pb2.py and api_pb2_grpc.py from exporter/kubelet/api.proto
(the kubelet's pod-resources API v1, committed as it is upstream).

    python tools/gen_podresources.py          # rewrite the generated modules
    python tools/gen_podresources.py --check  # exit 1 when they differ from what the proto generates

Needs grpcio-tools (a test dependency: pip install -e '.[test]'). The modules are generated from the
repository root with the proto at exporter/kubelet/api.proto, so the gRPC module imports the messages as
``exporter.kubelet.api_pb2``; the wire names (package ``v1``, service ``v1.PodResourcesLister``) are the
kubelet's, whatever the Python path.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO = Path("exporter/kubelet/api.proto")
OUTPUTS = ("api_pb2.py", "api_pb2_grpc.py")


def generate(out: Path) -> None:
    """Run protoc (grpcio-tools) on the proto; the modules land under ``out``/exporter/kubelet."""
    from grpc_tools import protoc

    (out / PROTO.parent).mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{REPO}", f"--python_out={out}", f"--grpc_python_out={out}", str(REPO / PROTO)]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    ns = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        stale = []
        for name in OUTPUTS:
            new = out / PROTO.parent / name
            old = REPO / PROTO.parent / name
            if ns.check:
                if not old.is_file() or old.read_bytes() != new.read_bytes():
                    stale.append(name)
            else:
                shutil.copyfile(new, old)
    if stale:
        print(f"stale generated modules: {', '.join(stale)} (run python tools/gen_podresources.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
