#!/usr/bin/env bash
# The installed C++ package end to end: `cmake --install`, then examples/cpp (a LibTorch program
# with its own model) configured with find_package(dt CONFIG) and built out of tree against the
# prefix, run under `dtctl submit --exec` on 2 local ranks: its Gloo group starts on the
# coordinator's store, its rounds are committed; after kill -9 of rank 1 it resumes and succeeds
# with the same parameters on both ranks. The program pauses 20 ms a step (about 4 s in all), so
# the kill lands mid-run: unpaced, 200 steps took under a second and retention had removed step-10
# before the test looked for it.
set -euo pipefail
build_dir="$1"
source_dir="$2"
work=$(mktemp -d /tmp/dt-cpp-package-XXXXXX)
coord_pid=""
cleanup() {
  [[ -n "$coord_pid" ]] && kill "$coord_pid" 2>/dev/null && wait "$coord_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$work"/runs/cpp/logs/*.log; do echo "== $f"; tail -n 20 "$f"; done; exit 1; }
json() { /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

cmake --install "$build_dir" --prefix "$work/prefix" > /dev/null
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/dt-ccache}"
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$source_dir/examples/cpp" -B "$work/example" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/example" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

"$work/prefix/bin/dtcoord" --listen 127.0.0.1:0 --state-dir "$work/coord" --metrics-listen off \
  --heartbeat-interval 200ms --heartbeat-timeout 3s > "$work/dtcoord.log" 2>&1 &
coord_pid=$!
for _ in $(seq 100); do [[ -s "$work/coord/dtcoord.addr" ]] && break; sleep 0.1; done
export DT_COORDINATOR=$(cat "$work/coord/dtcoord.addr") DT_TOKEN=$(cat "$work/coord/admin.token") HOME="$work"
dtctl="$work/prefix/bin/dtctl"
run=$("$dtctl" submit -o json --name cpp --save-dir "$work/runs" --nproc-per-node 2 --max-restarts 1 \
      --exec -- "$work/example/train_cpp" 200 20 | json 'd["run_id"]')
committed() { [[ $("$dtctl" status "$run" -o json | json 'd["latest_checkpoint_step"]') != None ]]; }
for _ in $(seq 600); do committed && break; sleep 0.1; done
committed || fail "no checkpoint round committed"
victim=$("$dtctl" status "$run" -o json | json 'd["ranks"][1]["pid"]')
grep -q train_cpp "/proc/$victim/cmdline" || fail "rank 1's pid $victim is not the program"
kill -9 "$victim"
"$dtctl" watch "$run" > "$work/watch.log" || { cat "$work/watch.log"; fail "the run did not succeed"; }
status=$("$dtctl" status "$run" -o json)
[[ $(json 'd["restarts"]' <<< "$status") == 1 ]] || fail "restarts: $status"
[[ $(json 'd["failures"][0]["rank"]' <<< "$status") == 1 ]] || fail "root cause: $status"
[[ $(json 'd["latest_checkpoint_step"]' <<< "$status") == 200 ]] || fail "latest checkpoint: $status"
grep -q "rank 1: resumed from step" "$work/runs/cpp/logs/rank-1.log" || fail "rank 1 did not resume"
final0=$(grep "^done:" "$work/runs/cpp/logs/rank-0.log")
final1=$(grep "^done:" "$work/runs/cpp/logs/rank-1.log")
[[ -n "$final0" && "$final0" == "$final1" ]] || fail "ranks ended apart: '$final0' vs '$final1'"
# Points still queued in the killed generation die with it; from the resumed step on, every step's
# loss arrived, and none twice.
resumed=$(sed -n 's/^rank 1: resumed from step \([0-9]*\)$/\1/p' "$work/runs/cpp/logs/rank-1.log")
steps=$("$dtctl" metrics "$run" --key loss --rank 0 -o json | json '[r["step"] for r in d]')
/usr/bin/python3 -c "import sys; s=$steps; r=$resumed; sys.exit(0 if len(s) == len(set(s)) and set(range(r + 1, 201)) <= set(s) else 1)" \
  || fail "loss points of rank 0 after the resume at step $resumed: $steps"
# A sharded round: every rank saves its own file, published together with one manifest.json
# that names each file's rank.
sharded=$("$dtctl" submit -o json --name cpp-sharded --save-dir "$work/runs" --nproc-per-node 2 \
          --exec -- "$work/example/train_cpp" 20 0 sharded | json 'd["run_id"]')
"$dtctl" watch "$sharded" > "$work/watch-sharded.log" \
  || { cat "$work/watch-sharded.log" "$work/runs/cpp-sharded/logs/rank-0.log"; fail "the sharded run did not succeed"; }
manifest="$work/runs/cpp-sharded/checkpoints/step-20/manifest.json"
files=$(json 'sorted((f["name"], f["rank"]) for f in d["files"])' < "$manifest")
[[ "$files" == "[('model-rank0.pt', 0), ('model-rank1.pt', 1), ('step.txt', 0)]" ]] || fail "sharded files: $files"
[[ $(json '(d["world_size"], d["sharded"], d["layout"]["model"])' < "$manifest") == "(2, True, 'replicated')" ]] \
  || fail "sharded manifest: $(cat "$manifest")"
"$dtctl" checkpoints "$sharded" --verify | grep -q "2 of 2 ranks (sharded)" \
  || fail "dtctl checkpoints: $("$dtctl" checkpoints "$sharded" --verify)"
echo "C++ package OK: $final0"
