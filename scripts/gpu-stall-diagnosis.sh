#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu-check.sh has built build-gpu/: the checkpoint stall row
# (trainer_bench.py gpu-ckpt) once per variant named, each with the trainer's threads sampled from
# /proc (bench/thread_states.py) and the cgroup's CPU and memory figures before and after. For a
# stall some rounds show and others do not (30 ms against 2 on an H200): whether the trainer's
# main thread then waits in the kernel, is throttled, or runs.
#
#   scripts/gpu-stall-diagnosis.sh [VARIANT...]   default (the first traced) | write-behind |
#                                                 direct | buffered (--checkpoint-io). Output: one
#                                                 file, $OUT/gpu-stall-diagnosis.tar.gz (the
#                                                 device tool hands back only a few files).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
OUT=${OUT:-/tmp/gpu-stall-out} B=$PWD/build-gpu
D=/tmp/gpu-stall-diagnosis
rm -rf "$D" && mkdir -p "$D" "$OUT"

cgroup_figures() {
  echo "== $1 $(date +%s.%N)"
  local f
  for f in /sys/fs/cgroup/{cpu.max,cpu.stat,cpu.pressure,memory.max,memory.high,memory.current,memory.events} \
    /sys/fs/cgroup/{memory.pressure,io.pressure} /sys/fs/cgroup/cpu{,acct,\,cpuacct}/{cpu.cfs_quota_us,cpu.cfs_period_us,cpu.stat} \
    /sys/fs/cgroup/memory/{memory.limit_in_bytes,memory.usage_in_bytes,memory.max_usage_in_bytes,memory.failcnt}; do
    [[ -f $f ]] && { echo "-- $f"; cat "$f"; }
  done
  echo "-- /proc/pressure"; grep . /proc/pressure/* 2>&1
  echo "-- meminfo"; grep -E '^(MemFree|Cached|Dirty|Writeback|Shmem):' /proc/meminfo
}

{
  echo "nproc $(nproc), $(grep -c ^processor /proc/cpuinfo) processors"
  cat /proc/self/cgroup; cat /sys/fs/cgroup/cgroup.controllers
  findmnt -T /tmp; findmnt -T "$PWD"; df -hT /tmp "$PWD"
} >"$D/machine.txt" 2>&1

traced=1 n=0
for variant in "${@:-default}"; do
  n=$((n + 1)) name=$n-$variant  # a variant may be named twice
  args="" traces=""
  [[ $variant != default ]] && args="--checkpoint-io $variant"
  if ((traced)); then traces=/tmp/dt-stall-profiles; rm -rf "$traces"; mkdir -p "$traces"; traced=0; fi
  python3 bench/thread_states.py dttrainer "$D/threads-$name.txt" 1 &
  sampler=$!
  cgroup_figures "before $name" >>"$D/cgroup.txt"
  DT_BENCH_BIN=$B/bin DT_BENCH_OUT=$D/bench-$name.jsonl DT_BENCH_PYTHON=$(command -v python3) \
    DT_GPU_CKPT_ARGS=$args DT_GPU_PROFILE_DIR=$traces PYTHONUNBUFFERED=1 \
    timeout 150 python3 bench/trainer_bench.py gpu-ckpt 2>&1 | tee "$D/bench-$name.log"
  cgroup_figures "after $name" >>"$D/cgroup.txt"
  kill "$sampler"
  gzip -f "$D/threads-$name.txt"
  [[ -n $traces ]] && tar -C /tmp -czf "$D/profiles-$name.tar.gz" "$(basename "$traces")"
done
tar -C /tmp -czf "$OUT/gpu-stall-diagnosis.tar.gz" "$(basename "$D")"
