#!/bin/bash
# Runs scripts/function_size.py --self-test, then the check over the repository's
# tracked .cc files.
# Like history_test, the check needs the whole tree, so this test is local
# (unsandboxed) and finds the repository root by resolving the runfiles link
# of function_size.py back to its source, then lists the files with
# `git ls-files` there.
set -euo pipefail
script="$(readlink -f "$TEST_SRCDIR/$TEST_WORKSPACE/scripts/function_size.py")"
root="$(dirname "$(dirname "$script")")"
if ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "FAIL: $root (from the runfiles link of function_size.py) is not a git checkout"
  exit 1
fi
"${RLMESH_PYTHON:-python3}" "$script" --self-test
exec "${RLMESH_PYTHON:-python3}" "$script" "$root"
