#!/usr/bin/env bash
# `cmake --install` puts the three binaries, the sbatch template, data/ and the deploy files in a prefix,
# and the installed dtctl finds its template there. Also checks the Docker images' other script.
set -euo pipefail
build_dir="$1"
source_dir="$2"
prefix=$(mktemp -d /tmp/dt-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build_dir" --prefix "$prefix" > /dev/null
for f in bin/dtcoord bin/dtctl bin/dttrainer bin/dtrun share/dt/python/dt/__init__.py \
         share/dt/python/dt/v1/checkpoint_pb2_grpc.py share/dt/dt.sbatch.tmpl share/dt/slurm/local-cluster.sh \
         share/dt/prometheus/prometheus.yml share/dt/prometheus/alerts.yml share/dt/grafana/dt-dashboard.json \
         share/dt/systemd/dtcoord.service share/dt/data/gpt2/encoder.json share/dt/data/gpt2/vocab.bpe \
         share/dt/data/gpt2/LICENSE share/dt/data/alpaca_sample.json share/dt/data/README.md; do
  [[ -e "$prefix/$f" ]] || { echo "not installed: $f"; exit 1; }
done
for b in dtcoord dtctl dttrainer dtrun; do "$prefix/bin/$b" --version > /dev/null; done
# The installed dtctl renders the installed template (no source tree fallback needed) and names
# the installed tokenizer files when the trainer arguments give none.
env -u DT_SBATCH_TEMPLATE "$prefix/bin/dtctl" --coordinator 10.0.0.1:50051 submit --dry-run --scheduler slurm \
  --name install-check --save-dir "$prefix/runs" --nodes 2 --nproc-per-node 4 --sbatch-arg=--partition=gpu \
  -- --dataset "$prefix/share/dt/data/alpaca_sample.json" > "$prefix/script"
need() {  # need FILE TEXT: a line of the rendered script holds TEXT
  grep -qF -- "$2" "$1" || { echo "$(basename "$1") lacks: $2"; exit 1; }
}
need_line() {  # need_line FILE LINE: the rendered script has the line LINE
  grep -qxF -- "$2" "$1" || { echo "$(basename "$1") lacks the line: $2"; exit 1; }
}
need_line "$prefix/script" '#SBATCH --nodes=2'
need_line "$prefix/script" '#SBATCH --ntasks-per-node=4'
need_line "$prefix/script" '#SBATCH --partition=gpu'
need "$prefix/script" "srun --kill-on-bad-exit=1 \"\${step_args[@]}\" $prefix/bin/dttrainer"
need "$prefix/script" "DT_RUN_TOKEN='<run token>'"
need "$prefix/script" "--tokenizer-dir $prefix/share/dt/data/gpt2"
need_line "$prefix/script" 'elastic=0'
if grep -qxF -- '#SBATCH --no-kill' "$prefix/script"; then echo "a fixed-size job renders --no-kill"; exit 1; fi
# --exec runs: one dtrun task per node, with the node's CPUs, the command after --; dtrun is told
# the step's node count. An elastic run (--nodes MIN:MAX) keeps its allocation when a node dies.
env -u DT_SBATCH_TEMPLATE "$prefix/bin/dtctl" --coordinator 10.0.0.1:50051 submit --dry-run --scheduler slurm \
  --name install-exec --save-dir "$prefix/runs" --nodes 1:2 --nproc-per-node 4 --exec -- /usr/bin/python3 train.py --lr 3e-4 \
  > "$prefix/exec-script"
need_line "$prefix/exec-script" '#SBATCH --ntasks-per-node=1'
need_line "$prefix/exec-script" '#SBATCH --cpus-per-task=4'
need_line "$prefix/exec-script" '#SBATCH --no-kill'
need_line "$prefix/exec-script" 'elastic=1'
need_line "$prefix/exec-script" 'step_nnodes=2'
need "$prefix/exec-script" "$prefix/bin/dtrun \"\${ca_args[@]}\" --nnodes \"\$step_nnodes\" --nproc-per-node 4 -- /usr/bin/python3 train.py --lr 3e-4"
# The installed dt Python module imports with its stubs, and so does one pip builds from python/.
(cd /tmp && PYTHONPATH="$prefix/share/dt/python" /usr/bin/python3 -c 'import dt, dt.v1.checkpoint_pb2_grpc; assert dt.init() is False')
/usr/bin/python3 -m pip install -q --no-build-isolation --no-deps --target "$prefix/pip" "$source_dir/python" 2> "$prefix/pip.err" \
  || { cat "$prefix/pip.err"; exit 1; }
(cd /tmp && PYTHONPATH="$prefix/pip" /usr/bin/python3 -c 'import dt, dt.v1.checkpoint_pb2_grpc; assert dt.init() is False')
"$source_dir/scripts/setup-cuda.sh" "$prefix/libtorch" --check > /dev/null
echo "install OK: $prefix"
