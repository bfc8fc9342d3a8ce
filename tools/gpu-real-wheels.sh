#!/usr/bin/env bash
# Download gpufeed's runtime dependencies as wheels for the device machine's Python into .whl/ (git-ignored),
# for bench/gpu_real_device.sh to install there: the device machine reaches no package index, so what the
# daemon needs travels with the working tree (the device tool's `carry: [".whl"]`). Its image already has
# PyTorch; this brings the rest, with nvidia-ml-py at the version the Docker image pins.
#   tools/gpu-real-wheels.sh [DEST]        PY_VERSION=3.12 (the device's python3, /work/.library/device/KINDS.md)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
py=${PY_VERSION:-3.12}
nvml=$(sed -n 's/^ARG NVIDIA_ML_PY_VERSION=//p' Dockerfile)
[[ -n $nvml ]] || { echo "no ARG NVIDIA_ML_PY_VERSION in the Dockerfile" >&2; exit 1; }
# project.dependencies, with the binding pinned; psutil for bench/ (procstat).
mapfile -t reqs < <(python3 - "$nvml" <<'PY'
import re, sys
text = open("pyproject.toml").read()
block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
for spec in re.findall(r'^\s*"([^"]+)"', block, re.M):
    print(f"nvidia-ml-py=={sys.argv[1]}" if spec.startswith("nvidia-ml-py") else spec)
print("psutil>=5.9")
PY
)
rm -rf "$dest"
mkdir -p "$dest"
platforms=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version "$py" \
  --implementation cp "${platforms[@]}" -d "$dest" "${reqs[@]}"
ls -1 "$dest"
du -sh "$dest"
