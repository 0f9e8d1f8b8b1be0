#!/usr/bin/env bash
# `cmake --install` puts the three binaries, the sbatch template, data/ and the deploy files in a prefix,
# and the installed dtctl finds its template there. Also checks the Docker images' other script.
set -euo pipefail
build_dir="$1"
source_dir="$2"
prefix=$(mktemp -d /tmp/dt-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build_dir" --prefix "$prefix" > /dev/null
for f in bin/dtcoord bin/dtctl bin/dttrainer share/dt/dt.sbatch.tmpl share/dt/slurm/local-cluster.sh \
         share/dt/prometheus/prometheus.yml share/dt/prometheus/alerts.yml share/dt/grafana/dt-dashboard.json \
         share/dt/systemd/dtcoord.service share/dt/data/gpt2/encoder.json share/dt/data/gpt2/vocab.bpe \
         share/dt/data/gpt2/LICENSE share/dt/data/alpaca_sample.json share/dt/data/README.md; do
  [[ -e "$prefix/$f" ]] || { echo "not installed: $f"; exit 1; }
done
for b in dtcoord dtctl dttrainer; do "$prefix/bin/$b" --version > /dev/null; done
# The installed dtctl renders the installed template (no source tree fallback needed) and names
# the installed tokenizer files when the trainer arguments give none.
env -u DT_SBATCH_TEMPLATE "$prefix/bin/dtctl" --coordinator 10.0.0.1:50051 submit --dry-run --scheduler slurm \
  --name install-check --save-dir "$prefix/runs" --nodes 2 --nproc-per-node 4 --sbatch-arg=--partition=gpu \
  -- --dataset "$prefix/share/dt/data/alpaca_sample.json" > "$prefix/script"
grep -q '^#SBATCH --nodes=2$' "$prefix/script"
grep -q '^#SBATCH --ntasks-per-node=4$' "$prefix/script"
grep -q '^#SBATCH --partition=gpu$' "$prefix/script"
grep -q "srun --kill-on-bad-exit=1 $prefix/bin/dttrainer" "$prefix/script"
grep -q "DT_RUN_TOKEN='<run token>'" "$prefix/script"
grep -q -- "--tokenizer-dir $prefix/share/dt/data/gpt2" "$prefix/script"
"$source_dir/scripts/setup-cuda.sh" "$prefix/libtorch" --check > /dev/null
echo "install OK: $prefix"
