#!/bin/sh
# The device tool's `run` command for the real-GPU validation run (docs/benchmarks.md "Real GPU run: how"):
#   run(command="sh bench/gpu_real_device.sh", carry=[".whl"], timeout_s=600)
# after tools/gpu-real-wheels.sh filled .whl/ here. It installs the carried wheels into /tmp/site (the
# device reaches no package index), runs bench/gpu_real.py under a hard timeout that stays inside the tool's
# 600 s, and leaves in $OUT what the tool brings back (at most 8 files): summary.md, results.json, run.log,
# nvidia-smi.txt and results.tgz (the whole results folder: the field trace, each workload's /metrics, the
# daemon's log). Extra arguments go to gpu_real.py (e.g. --seconds 30).
set -u
out=${OUT:-/tmp/gpu_real_out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "installing the carried wheels failed: run tools/gpu-real-wheels.sh and carry .whl" >&2; exit 1; }
PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
res=/tmp/gpu_real
rm -rf "$res"
timeout -k 15 "${GPU_REAL_TIMEOUT:-550}" python3 bench/gpu_real.py --out "$res" "$@" >"$out/run.log" 2>&1
rc=$?
cp "$res/summary.md" "$res/results.json" "$out/" 2>/dev/null
tar -czf "$out/results.tgz" -C "$(dirname "$res")" "$(basename "$res")" 2>/dev/null
tail -n 20 "$out/run.log"
# The tool's reply keeps the last 12,000 characters of output: the host, then the verdicts and the A/B.
sed -n '/^## Host/,/^## NVML calls/p' "$out/summary.md" 2>/dev/null | head -c 3000
sed -n '/^## Workloads/,$p' "$out/summary.md" 2>/dev/null | head -c 8000
exit "$rc"
