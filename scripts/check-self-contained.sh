#!/usr/bin/env bash
# Fails when a file of the tree (tracked, or new and not ignored) refers to the folder beside the
# checkout that the project's own sessions explore: a user's clone has no such folder, so a test,
# benchmark, script or comment that points there breaks or misleads a user. The tests read data/
# (see data/README.md); the protocol notes the code relies on are in docs/.
set -euo pipefail
cd "$(dirname "$0")/.."
pattern='\.\./shared\b'
mapfile -t hits < <(git ls-files -z --cached --others --exclude-standard | xargs -0 grep -IlP "$pattern" 2>/dev/null || true)
if ((${#hits[@]} > 0)); then
  echo "check-self-contained: these files refer to the folder beside the checkout, which a clone has not got:" >&2
  git ls-files -z --cached --others --exclude-standard | xargs -0 grep -InP "$pattern" >&2 || true
  echo "copy what they need into data/ or docs/ (with its source and licence in data/README.md)" >&2
  exit 1
fi
echo "check-self-contained: nothing refers outside the clone"
