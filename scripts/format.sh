#!/usr/bin/env bash
# Formats dt's C++ sources with the tree's .clang-format (clang-format from Debian, installed by
# scripts/setup.sh).
#   scripts/format.sh           rewrite every .cc/.h of the tree that is not formatted (tracked, or new
#                               and not ignored: a file about to be added is checked before it lands)
#   scripts/format.sh --check   change nothing; list the files that are not formatted, exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format is missing: run scripts/setup.sh" >&2; exit 2; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cc' '*.h')
if [[ "${1:-}" == "--check" ]]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]} > 0)); then
    echo "not formatted (run scripts/format.sh): ${bad[*]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted"
  exit 0
fi
clang-format -i "${files[@]}"
