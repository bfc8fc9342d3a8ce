#!/bin/bash
# 20 runs of the real-process workload tests, each under stress-ng --cpu 2; pauses between runs while
# /tmp/s/pause exists or the fleet benchmark's prometheus runs; /tmp/s/stress.running marks a run in progress.
cd /work/wt/ci
pass=0; fail=0
for i in $(seq 1 20); do
  while [ -f /tmp/s/pause ] || pgrep -f "prom-4096" >/dev/null; do sleep 10; done
  touch /tmp/s/stress.running
  stress-ng --cpu 2 --timeout 900 >/dev/null 2>&1 &
  SP=$!
  sleep 3
  L=$(cut -d' ' -f1-3 /proc/loadavg)
  timeout 900 .venv/bin/pytest -q -p no:cacheprovider -n 0 tests/test_workload_real.py > /tmp/s/stress_run_$i.log 2>&1
  rc=$?
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
  rm -f /tmp/s/stress.running
  if [ $rc -eq 0 ]; then pass=$((pass+1)); else fail=$((fail+1)); fi
  echo "run $i rc=$rc load_at_start=$L $(tail -1 /tmp/s/stress_run_$i.log) $(date +%H:%M:%S)" >> /tmp/s/stress_summary.txt
done
echo "DONE pass=$pass fail=$fail" >> /tmp/s/stress_summary.txt
