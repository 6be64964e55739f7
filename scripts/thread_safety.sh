#!/usr/bin/env bash
# Clang's thread-safety analysis over the C++ that carries Abseil lock
# annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...), which
# gcc ignores. Compiles, under --config=clang-tsa (-Werror=thread-safety),
# every cc_library of every package with an annotated file, plus each target
# that lists an annotated file itself (tests, binaries); compile only, no
# linking. The packages are found by grep, so a new one is never left out.
# Then checks that //scripts:thread_safety_violation, which reads a guarded
# member without its lock, still fails to compile: if the analysis were
# switched off (flags, toolchain), this script fails.
#   scripts/thread_safety.sh            (CI runs it after bazel test //...)
# Output base: $RLMESH_TSA_OUTPUT_BASE or ~/.cache/rlmesh/tsa-output-base;
# objects go to the shared disk cache (.bazelrc).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
OB="${RLMESH_TSA_OUTPUT_BASE:-$HOME/.cache/rlmesh/tsa-output-base}"
BZL=(bazel --output_base="$OB")
command -v clang++ >/dev/null || { echo "thread_safety: clang++ not found (scripts/setup.sh installs it)"; exit 1; }

# Every Abseil thread-safety annotation (absl/base/thread_annotations.h).
ANNOTATION='ABSL_(PT_)?GUARDED_BY|ABSL_(EXCLUSIVE|SHARED)_LOCKS?_REQUIRED|ABSL_LOCKS_EXCLUDED|ABSL_LOCK_RETURNED'
ANNOTATION+='|ABSL_(EXCLUSIVE|SHARED)?_?(TRY)?(UN)?LOCK_FUNCTION|ABSL_ACQUIRED_(BEFORE|AFTER)|ABSL_ASSERT_(SHARED_)?LOCK'
ANNOTATION+='|ABSL_LOCKABLE|ABSL_SCOPED_LOCKABLE'
# Tracked and new (not ignored) sources; the deliberate violation is checked
# on its own below.
mapfile -t files < <(git grep -lE --untracked "$ANNOTATION" -- '*.h' '*.cc' ':!scripts/thread_safety_violation.cc' |
                     grep -v '^third_party/' | sort)
if [ ${#files[@]} -eq 0 ]; then
  echo "thread_safety: no annotated file found; the pattern in $0 is wrong"
  exit 1
fi
# Each file's package: the nearest folder above it with a BUILD file.
declare -A pkgs=()
labels=()
for f in "${files[@]}"; do
  d=$(dirname "$f")
  while [ "$d" != . ] && [ ! -f "$d/BUILD" ] && [ ! -f "$d/BUILD.bazel" ]; do d=$(dirname "$d"); done
  if [ "$d" = . ]; then d=""; fi
  pkgs[$d]=1
  labels+=("//$d:${f#"$d/"}")
done
pkg_set="set($(printf '%s\n' "${!pkgs[@]}" | sort | sed 's|.*|//&:*|' | tr '\n' ' '))"
echo "thread_safety: ${#files[@]} annotated files in ${#pkgs[@]} packages: $(printf '%s\n' "${!pkgs[@]}" | sort | tr '\n' ' ')"

query="(kind('cc_library rule', $pkg_set) + kind('cc_.* rule', same_pkg_direct_rdeps(set(${labels[*]}))))"
query+=" except attr(tags, 'manual', $pkg_set)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "${BZL[@]}" query "$query" >"$tmp/targets" 2>"$tmp/query.log" || [ ! -s "$tmp/targets" ]; then
  echo "thread_safety: bazel query failed (is every annotated file in a BUILD target?):"
  tail -20 "$tmp/query.log"
  exit 1
fi
mapfile -t targets <"$tmp/targets"
echo "thread_safety: compiling ${#targets[@]} targets under --config=clang-tsa"
rc=0
"${BZL[@]}" build --config=clang-tsa --keep_going --output_groups=compilation_outputs "${targets[@]}" || rc=$?

# The analysis must reject a known violation.
log="$tmp/violation.log"
if "${BZL[@]}" build --config=clang-tsa --output_groups=compilation_outputs //scripts:thread_safety_violation \
    >"$log" 2>&1; then
  echo "thread_safety: //scripts:thread_safety_violation compiled: the analysis is not running"
  rc=1
elif ! grep -q 'Werror,-Wthread-safety' "$log"; then
  echo "thread_safety: //scripts:thread_safety_violation failed, but not with a thread-safety error:"
  cat "$log"
  rc=1
else
  echo "thread_safety: //scripts:thread_safety_violation is rejected, as it must be"
fi
echo "thread_safety: finished in $(( $(date +%s) - start ))s with exit code $rc"
exit "$rc"
