#!/bin/bash
# Runs scripts/check_history.py over the repository's tracked text files.
# The check needs the whole tree (README.md, docs/, configs/, bench/ and every
# package's sources), and a glob in one BUILD package cannot see the others;
# so this test is local (unsandboxed) and finds the repository root by
# resolving the runfiles link of check_history.py back to its source, then
# lists the files with `git ls-files` there.
set -euo pipefail
script="$(readlink -f "$TEST_SRCDIR/$TEST_WORKSPACE/scripts/check_history.py")"
root="$(dirname "$(dirname "$script")")"
if ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "FAIL: $root (from the runfiles link of check_history.py) is not a git checkout"
  exit 1
fi
exec "${RLMESH_PYTHON:-python3}" "$script" "$root"
