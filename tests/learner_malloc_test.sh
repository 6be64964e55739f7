#!/bin/bash
# The learner binary runs on TCMalloc (third_party/system.BUILD, "tcmalloc"):
# libtcmalloc_minimal must be among the libraries it loads, ahead of libc,
# so the dynamic linker binds malloc/free/operator new to it. The rollout
# worker keeps glibc's malloc (decode measured no gain). Fails when the
# dependency or its --no-as-needed is dropped.
set -euo pipefail
ROOT="$TEST_SRCDIR/$TEST_WORKSPACE"
position() {  # $1: binary, $2: library name prefix -> its place in the load order (empty if absent)
  LD_TRACE_LOADED_OBJECTS=1 "$1" | awk -v p="$2" 'index($1, p) == 1 && !n {n = NR} END {if (n) print n}'
}
learner="$ROOT/learner/learner"
tc=$(position "$learner" libtcmalloc_minimal.so)
libc=$(position "$learner" libc.so)
if [ -z "$tc" ]; then
  echo "FAIL: $learner does not load libtcmalloc_minimal:"; LD_TRACE_LOADED_OBJECTS=1 "$learner"; exit 1
fi
if [ -z "$libc" ] || [ "$tc" -ge "$libc" ]; then
  echo "FAIL: libtcmalloc_minimal (position $tc) does not load before libc (position ${libc:-none})"
  LD_TRACE_LOADED_OBJECTS=1 "$learner"; exit 1
fi
rollout="$ROOT/rollout/rollout_worker"
if [ -n "$(position "$rollout" libtcmalloc_minimal.so)" ]; then
  echo "FAIL: $rollout loads libtcmalloc_minimal; it is meant to keep glibc's malloc"; exit 1
fi
echo "PASS: the learner loads libtcmalloc_minimal at $tc, libc at $libc; the rollout worker keeps glibc's malloc"
