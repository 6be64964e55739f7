#!/usr/bin/env bash
# Cold build of the main job's binaries (`bazel build //coordinator`, which
# carries every role binary) as a fresh machine sees it: a fresh clone at
# each given commit, an empty disk cache and a fresh output base. Prints the
# wall time, Bazel's action count, the compile-seconds summed over actions
# and the slowest files, from Bazel's own profile.
#
#   bench/cold_build.sh [--targets "//coordinator"] COMMIT [COMMIT ...]
#
# Run it on an otherwise idle machine: the two cores are the whole budget.
# Each commit takes 8-10 minutes here (bench/cold_build.md); with
# --targets "//..." (the whole suite) about 25. Work folders go
# under ${TMPDIR:-/tmp}/rlmesh-cold-build and are removed afterwards.
set -uo pipefail

targets="//coordinator"
if [ "${1:-}" = "--targets" ]; then
  targets=$2
  shift 2
fi
if [ $# -eq 0 ]; then
  echo "usage: $0 [--targets \"//coordinator\"] COMMIT [COMMIT ...]" >&2
  exit 2
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
work=${TMPDIR:-/tmp}/rlmesh-cold-build
mkdir -p "$work"

for commit in "$@"; do
  name=$(git -C "$repo" rev-parse --short "$commit") || exit 2
  dir=$work/$name
  rm -rf "$dir" "$dir-ob" "$dir-dc"
  git clone -q "$repo" "$dir" && git -C "$dir" checkout -q "$commit" || exit 1
  start=$(date +%s)
  # shellcheck disable=SC2086  # $targets is a list of labels
  (cd "$dir" && bazel --output_base="$dir-ob" build --disk_cache="$dir-dc" $targets) > "$dir.log" 2>&1
  rc=$?
  seconds=$(($(date +%s) - start))
  actions=$(grep -oE '[0-9]+ total actions' "$dir.log" | tail -1)
  echo "$name: exit $rc, ${seconds} s, ${actions:-no actions line}"
  python3 - "$dir-ob/command.profile.gz" <<'EOF'
import gzip, json, sys
events = json.load(gzip.open(sys.argv[1]))["traceEvents"]
acts = [(e["dur"] / 1e6, e["name"]) for e in events
        if e.get("ph") == "X" and e.get("cat") == "action processing"]
sandbox = sum(e["dur"] / 1e6 for e in events if e.get("ph") == "X"
              and e.get("name") in ("sandbox.createFileSystem", "sandbox.delete"))
acts.sort(reverse=True)
print(f"  action-seconds {sum(d for d, _ in acts):.0f} (sandbox set-up and removal {sandbox:.0f})")
for d, n in acts[:8]:
    print(f"  {d:5.1f}  {n}")
EOF
  (cd "$dir" && bazel --output_base="$dir-ob" shutdown) > /dev/null 2>&1
  rm -rf "$dir" "$dir-ob" "$dir-dc" "$dir.log"
done
