#!/usr/bin/env bash
# `cmake --install` puts the three binaries, the sbatch template and the deploy files in a prefix,
# and the installed dtctl finds its template there. Also checks the Docker images' other script.
set -euo pipefail
build_dir="$1"
source_dir="$2"
data_dir="$source_dir/../shared/data"
prefix=$(mktemp -d /tmp/dt-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build_dir" --prefix "$prefix" > /dev/null
for f in bin/dtcoord bin/dtctl bin/dttrainer share/dt/dt.sbatch.tmpl share/dt/slurm/local-cluster.sh \
         share/dt/prometheus/prometheus.yml share/dt/prometheus/alerts.yml share/dt/grafana/dt-dashboard.json \
         share/dt/systemd/dtcoord.service; do
  [[ -e "$prefix/$f" ]] || { echo "not installed: $f"; exit 1; }
done
for b in dtcoord dtctl dttrainer; do "$prefix/bin/$b" --version > /dev/null; done
# The installed dtctl renders the installed template (no source tree fallback needed).
env -u DT_SBATCH_TEMPLATE "$prefix/bin/dtctl" --coordinator 10.0.0.1:50051 submit --dry-run --scheduler slurm \
  --name install-check --save-dir "$prefix/runs" --nodes 2 --nproc-per-node 4 --sbatch-arg=--partition=gpu \
  -- --dataset "$data_dir/alpaca_5000.json" --tokenizer-dir "$data_dir/gpt2" > "$prefix/script"
grep -q '^#SBATCH --nodes=2$' "$prefix/script"
grep -q '^#SBATCH --ntasks-per-node=4$' "$prefix/script"
grep -q '^#SBATCH --partition=gpu$' "$prefix/script"
grep -q "srun --kill-on-bad-exit=1 $prefix/bin/dttrainer" "$prefix/script"
grep -q "DT_RUN_TOKEN='<run token>'" "$prefix/script"
"$source_dir/scripts/setup-cuda.sh" "$prefix/libtorch" --check > /dev/null
echo "install OK: $prefix"
