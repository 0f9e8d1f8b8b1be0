#!/usr/bin/env bash
# Fuzzes dt's parsers and request validation with libFuzzer (clang, ASan+UBSan, build-fuzz/):
# the GPT-2 tokenizer, the dataset readers, dtctl's run files, the sbatch renderer, and every RPC's
# validation on a live coordinator (fuzz/*_fuzz.cc say what each asserts).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]    default: 60 seconds each, every target
#
# What a target learns stays in build-fuzz/fuzz-corpus/<target>/. A crasher is written to
# build-fuzz/fuzz-artifacts/<target>/; copy it into fuzz/regressions/<target>/ with the fix, and
# every build replays it from then on (ctest Fuzz.<target>.Replay).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
[[ $# -gt 0 ]] && shift
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(tokenizer dataset run_file sbatch requests)

scripts/build.sh --fuzz
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
failed=0
for t in "${targets[@]}"; do
  inputs=("fuzz/corpus/$t")
  [[ -d "fuzz/regressions/$t" ]] && inputs+=("fuzz/regressions/$t")
  mkdir -p "build-fuzz/fuzz-corpus/$t" "build-fuzz/fuzz-artifacts/$t"
  echo "fuzz: $t for ${seconds}s"
  if ! "build-fuzz/bin/${t}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/fuzz-artifacts/$t/" "build-fuzz/fuzz-corpus/$t" "${inputs[@]}" \
      2> "build-fuzz/fuzz-$t.log"; then
    echo "fuzz: $t FAILED; the input is in build-fuzz/fuzz-artifacts/$t/, the log in build-fuzz/fuzz-$t.log"
    grep -m5 -E "fuzz property broken|ERROR: |runtime error" "build-fuzz/fuzz-$t.log" || true
    failed=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "build-fuzz/fuzz-$t.log" | tr '\n' ' '
    echo
  fi
done
exit "$failed"
