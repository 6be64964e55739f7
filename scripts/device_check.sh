#!/usr/bin/env bash
# The GPU checks, prepared here and run on a lent GPU machine
# (which has PyTorch 2.11 + CUDA 13 but no Bazel, gRPC or RocksDB).
#
#   scripts/device_check.sh pack      # CPU machine: build, then pack the test
#                                     # and bench binaries with the Debian
#                                     # libraries they need into
#                                     # .device/bundle.tar.gz (<= 64 MiB)
#   scripts/device_check.sh run       # GPU machine, repository root, with
#                                     # .device/ carried: unpack, run every
#                                     # GPU check, write the report to
#                                     # $OUT/gpu.md (else .device/gpu.md)
#   scripts/device_check.sh dry-run   # CPU machine: pack, then run from a
#                                     # scratch copy as the GPU machine would;
#                                     # every library must resolve from the
#                                     # bundle or torch, and every GPU check
#                                     # must FAIL naming the missing device
#
# The run uses the GPU machine's own torch (its lib/ and the nvidia/ wheels
# beside it): the binaries carry only what torch does not. Each check has
# its own timeout; the whole run stays under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
here=$(pwd)
dev="$here/.device"
limit_bytes=$((64 * 1024 * 1024))

# Binaries (bazel-bin paths, kept under bundle/bin/) the GPU machine runs:
# the GPU tests and benchmarks, and the roles of a cluster (`coordinator
# run` finds them under --bin_dir by these paths).
BINARIES=(
  dist/device_test
  dist/memory_gpu_test
  dist/nccl_gpu_test
  dist/libtorch_cuda_shim.so
  learner/data_parallel_gpu_test
  actor/fixed_decode_gpu_test
  weight_sync/weight_sync_gpu_test
  bench/gpu_bench
  bench/weight_sync_bench
  coordinator/coordinator
  learner/learner
  rollout/rollout_worker
  reward_server/reward_server
  replay_buffer/replay_buffer
)

die() { echo "device_check: $*" >&2; exit 1; }

torch_dir() {
  "${RLMESH_PYTHON:-python3}" -c 'import os, torch; print(os.path.dirname(torch.__file__))'
}

# Library folders of a torch install: torch/lib and every nvidia/*/lib.
torch_lib_path() {
  local t="$1" site
  site=$(dirname "$t")
  local p="$t/lib"
  for d in "$site"/nvidia/*/lib "$site"/nvidia/cu*/lib; do [ -d "$d" ] && p="$p:$d"; done
  echo "$p"
}

# Libraries the GPU machine has anyway: glibc's, and torch's own.
is_provided() {
  case "$(basename "$1")" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|ld-linux*|linux-vdso*|libresolv.so.*) return 0 ;;
    libtorch*|libc10*|libgomp*|libshm*|libcaffe2*) return 0 ;;
  esac
  case "$1" in */nvidia/*|/usr/local/cuda*) return 0 ;; esac
  return 1
}

pack() {
  command -v bazel >/dev/null || die "bazel not found (run scripts/setup.sh first)"
  local targets=()
  for b in "${BINARIES[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
  echo "device_check: building ${targets[*]}"
  mkdir -p "$dev"
  bazel build "${targets[@]}" >/dev/null 2>"$dev/build.log" || { cat "$dev/build.log" >&2; die "build failed"; }
  local bin_root
  bin_root=$(bazel info bazel-bin 2>/dev/null) || die "bazel info bazel-bin failed"
  rm -rf "$dev/bundle" && mkdir -p "$dev/bundle/bin" "$dev/bundle/lib"
  for b in "${BINARIES[@]}"; do
    mkdir -p "$dev/bundle/bin/${b%/*}"
    cp "$bin_root/$b" "$dev/bundle/bin/$b" || die "missing $bin_root/$b"
  done
  # The shared libraries they load that the GPU machine lacks (gRPC, Abseil,
  # Protobuf, ICU, libstdc++ of this GCC...), resolved here with ldd.
  local t
  t=$(torch_dir) || die "cannot import torch"
  # ldd on the binaries where Bazel built them: tests link Bazel's own
  # per-library .so files through an $ORIGIN-relative RPATH (_solib_k8/),
  # which a copy elsewhere no longer finds.
  for b in "${BINARIES[@]}"; do
    LD_LIBRARY_PATH="$(torch_lib_path "$t")" ldd "$bin_root/$b" | awk '/=> \// {print $3}'
  done | sort -u | while read -r lib; do
    is_provided "$lib" || cp -L "$lib" "$dev/bundle/lib/"
  done
  # Newest glibc symbol version the binaries need: the GPU machine's glibc
  # must be at least that (Debian 12 here has 2.36).
  local need
  need=$(for f in $(find "$dev/bundle/bin" "$dev/bundle/lib" -type f); do objdump -T "$f" 2>/dev/null; done |
         grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1)
  echo "$need" > "$dev/bundle/GLIBC_REQUIRED"
  git rev-parse HEAD > "$dev/bundle/COMMIT" 2>/dev/null || true
  tar -C "$dev" -czf "$dev/bundle.tar.gz" bundle
  local size
  size=$(stat -c %s "$dev/bundle.tar.gz")
  echo "device_check: packed $(find "$dev/bundle/bin" -type f | wc -l) binaries and $(ls "$dev/bundle/lib" | wc -l) libraries," \
       "$((size / 1024 / 1024)) MiB (limit 64), needs $need"
  [ "$size" -le "$limit_bytes" ] || die "bundle is $size bytes, over the 64 MiB carry limit"
  rm -rf "$dev/bundle"
}

# One check: NAME TIMEOUT COMMAND...; its output goes to $work/NAME.log, its
# exit code to $work/NAME.rc.
check() {
  local name="$1" secs="$2"; shift 2
  echo "device_check: $name"
  timeout "$secs" "$@" >"$work/$name.log" 2>&1
  echo $? >"$work/$name.rc"
}

run() {
  local root="${1:-$here}"
  local bundle_tar="$root/.device/bundle.tar.gz"
  [ -f "$bundle_tar" ] || die "$bundle_tar missing: run 'scripts/device_check.sh pack' first and carry .device"
  work=$(mktemp -d)
  tar -C "$work" -xzf "$bundle_tar" || die "cannot unpack $bundle_tar"
  local t
  t=$(torch_dir) || die "cannot import torch on this machine"
  export LD_LIBRARY_PATH="$work/bundle/lib:$(torch_lib_path "$t")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    echo "commit $(cat "$work/bundle/COMMIT" 2>/dev/null)"
    echo "glibc required $(cat "$work/bundle/GLIBC_REQUIRED") here $(ldd --version | head -1)"
    "${RLMESH_PYTHON:-python3}" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
          "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: none"
  } >"$work/machine.txt" 2>&1
  # Every library must come from the bundle, torch, or glibc.
  : >"$work/libraries.txt"
  for f in $(find "$work/bundle/bin" -type f); do
    ldd "$f" | while read -r line; do
      case "$line" in
        *"not found"*) echo "$(basename "$f"): MISSING $line" ;;
        *"=> /"*) lib=$(echo "$line" | awk '{print $3}')
                  case "$lib" in "$work"/bundle/lib/*) ;; *) is_provided "$lib" || echo "$(basename "$f"): FROM SYSTEM $lib" ;; esac ;;
      esac
    done >>"$work/libraries.txt"
  done
  local gpus
  gpus=$("${RLMESH_PYTHON:-python3}" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  echo "${gpus:-0}" >"$work/gpus.txt"
  # [gpu] names the real cases (not the hidden publisher case the two-process
  # test starts); NCCL's needs two GPUs.
  local filter="[gpu]~[multi_gpu]"
  [ "${gpus:-0}" -ge 2 ] && filter="[gpu]"
  local bin="$work/bundle/bin"
  # ProcessGroupNCCL's shared object, for every binary that makes a group
  # (the learner's data parallelism, the tests) wherever it sits.
  export RLMESH_TORCH_CUDA_SHIM="$bin/dist/libtorch_cuda_shim.so"
  check device_test 60 "$bin/dist/device_test"
  check memory_gpu_test 60 "$bin/dist/memory_gpu_test"
  check nccl_gpu_test 60 "$bin/dist/nccl_gpu_test" "$filter"
  # DataParallel on the GPU; over NCCL against one process where two GPUs exist.
  check data_parallel_gpu_test 120 "$bin/learner/data_parallel_gpu_test" "$filter"
  # The decode step replayed from CUDA graphs against the eager one.
  check fixed_decode_gpu_test 120 "$bin/actor/fixed_decode_gpu_test" "$filter"
  check weight_sync_gpu_test 120 "$bin/weight_sync/weight_sync_gpu_test" "$filter"
  check gpu_bench 300 "$bin/bench/gpu_bench"
  # CUDA IPC between two processes on the GPU, against a device copy.
  check weight_sync_bench 90 "$bin/bench/weight_sync_bench" --backend=cuda_ipc --device=cuda \
    --sync_mb=1024 --tensor_mb=16 --rounds=6
  # End to end: the main job's cluster with a 111M-parameter policy
  # (hidden 1024, 10 layers, 16 / 4 heads), the learner and one rollout
  # worker colocated on the GPU in bf16, sleeping in turn, weights over
  # CUDA IPC, decode from CUDA graphs; 100 SFT steps, then 20 GRPO steps
  # for the steps/s and the phase split. The run folder goes under $work;
  # its logs' last lines are appended to the check's log.
  (cd "$work" && check e2e_colocated 240 "$bin/coordinator/coordinator" run "$here/configs/grpo_arith_tiny.yaml" \
    --bin_dir="$bin" --set model.hidden=1024 --set model.layers=10 --set model.heads=16 --set model.kv_heads=4 \
    --set model.device=cuda --set learner.autocast=bf16 --set rollout.workers=1 --set rollout.sleep=weights \
    --set learner.sleep=cache --set weight_sync.backend=cuda_ipc --set rollout.cuda_graphs=true --set rollout.dtype=bf16 \
    --set 'stages[0].sft.steps=100' --set 'stages[1].grpo.rl.steps=20')
  local metrics
  metrics=$(ls -t "$work"/runs/*/metrics.jsonl 2>/dev/null | head -1)
  [ -n "$metrics" ] && cp "$metrics" "$work/e2e_metrics.jsonl"
  for l in "$work"/runs/*/logs/*.log; do
    [ -f "$l" ] && { echo "== ${l##*/}"; tail -3 "$l"; }
  done >>"$work/e2e_colocated.log"
  local out="${OUT:-$root/.device}"
  mkdir -p "$out"
  "${RLMESH_PYTHON:-python3}" "$here/bench/gpu_report.py" "$work" "${DRY_RUN:-0}" >"$out/gpu.md"
  local report_rc=$?
  # 3: the report was written but an assertion on the colocated run failed.
  [ "$report_rc" = 0 ] || [ "$report_rc" = 3 ] || die "report failed (rc $report_rc)"
  echo "device_check: report in $out/gpu.md"
  cat "$out/gpu.md"
  if [ "${DRY_RUN:-0}" = 1 ]; then
    # Without a GPU every check must fail, each naming the missing device,
    # and no library may be missing or come from outside the bundle.
    local bad=0
    grep -q . "$work/libraries.txt" && { echo "dry run: libraries not from the bundle:"; cat "$work/libraries.txt"; bad=1; }
    for c in device_test memory_gpu_test nccl_gpu_test data_parallel_gpu_test fixed_decode_gpu_test \
             weight_sync_gpu_test gpu_bench weight_sync_bench e2e_colocated; do
      rc=$(cat "$work/$c.rc")
      if [ "$c" = device_test ]; then
        # Runs here too: its no-GPU branch must pass.
        [ "$rc" = 0 ] || { echo "dry run: device_test failed (rc $rc)"; bad=1; }
      else
        [ "$rc" != 0 ] || { echo "dry run: $c passed without a GPU"; bad=1; }
        grep -qE "no CUDA device|Found no NVIDIA driver" "$work/$c.log" ||
          { echo "dry run: $c did not name the missing device:"; tail -5 "$work/$c.log"; bad=1; }
      fi
    done
    # Nothing ran, so the run's assertions must all fail (never pass vacuously).
    [ "$report_rc" = 3 ] || { echo "dry run: the colocated run's assertions did not fail (rc $report_rc)"; bad=1; }
    rm -rf "$work"
    [ "$bad" = 0 ] && echo "device_check: dry run ok" || die "dry run found problems"
    return
  fi
  rm -rf "$work"
  [ "$report_rc" = 0 ] || die "the colocated run broke an assertion (see the report)"
}

case "$mode" in
  pack) pack ;;
  run) run ;;
  dry-run)
    pack
    scratch=$(mktemp -d)
    mkdir -p "$scratch/.device" && cp "$dev/bundle.tar.gz" "$scratch/.device/"
    DRY_RUN=1 OUT="$scratch/out" run "$scratch"
    rc=$?
    rm -rf "$scratch"
    exit $rc ;;
  *) sed -n 2,20p "$0"; exit 2 ;;
esac
