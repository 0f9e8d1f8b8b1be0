#!/usr/bin/env bash
# The main job, start to finish on one machine: install what dt needs, build it, start the
# coordinator (state in a temporary directory), submit a 2-rank local training run of a small
# GPT-2 on the Alpaca sample shipped in data/, watch it until it succeeds, then show its status,
# checkpoints, the Prometheus endpoint and a few metric lines.
#
#   scripts/demo.sh            DT_DEMO_DIR=/some/dir to keep the run's files there
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
data="$root/data"   # ships with dt: the GPT-2 tokenizer files and an Alpaca sample
[[ -f "$data/alpaca_sample.json" ]] || { echo "demo: $data/alpaca_sample.json is missing" >&2; exit 1; }

scripts/build.sh --target dtcoord --target dtctl --target dttrainer
bin="$root/build/bin"

work="${DT_DEMO_DIR:-$(mktemp -d /tmp/dt-demo.XXXXXX)}"
mkdir -p "$work"
echo "== dt demo in $work"
"$bin/dtcoord" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --state-dir "$work/coord" \
  > "$work/dtcoord.log" 2>&1 &
coord_pid=$!
trap 'kill $coord_pid 2>/dev/null; wait $coord_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [[ -s "$work/coord/dtcoord.addr" ]] && break; sleep 0.1; done
[[ -s "$work/coord/dtcoord.addr" ]] || { cat "$work/dtcoord.log"; exit 1; }
export DT_COORDINATOR=$(cat "$work/coord/dtcoord.addr")
export DT_TOKEN=$(cat "$work/coord/admin.token")
metrics=$(cat "$work/coord/metrics.addr")
echo "== dtcoord serving on $DT_COORDINATOR (log: $work/dtcoord.log)"

run=$("$bin/dtctl" submit --name gpt2-alpaca-demo --save-dir "$work/runs" --nproc-per-node 2 --max-restarts 1 -- \
  --model gpt2 --config-overrides n_embd=128,n_layer=4,n_head=4,n_positions=128 \
  --dataset "$data/alpaca_sample.json" \
  --seq-len 128 --batch-size 4 --max-steps 120 --lr 1e-3 --warmup-steps 10 \
  --eval-freq 40 --eval-batches 2 --ckpt-freq 40 --log-freq 10)
echo "== submitted $run; watching it"
"$bin/dtctl" watch "$run"

echo; echo "== dtctl status $run"
"$bin/dtctl" status "$run"
echo; echo "== dtctl checkpoints $run"
"$bin/dtctl" checkpoints "$run"
echo; echo "== Prometheus: http://$metrics/metrics"
curl -s "http://$metrics/metrics" | grep -E '^dt_(train_loss|train_tokens_seen_total|coordinator_runs\{state="SUCCEEDED"\})' | head -6
echo; echo "== dtctl metrics $run --key loss --rank 0 (last lines)"
"$bin/dtctl" metrics "$run" --key loss --rank 0 | tail -4
echo; echo "== done: the run's files are in $work/runs/gpt2-alpaca-demo"
