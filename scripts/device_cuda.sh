#!/usr/bin/env bash
# On the lent GPU machine, after `scripts/device_eval.sh stage` (bundle from scripts/device_bundle.sh):
#   scripts/device_cuda.sh test        the CUDA kernel tests (GPU vs CPU twins); log in $OUT/cuda-tests.txt
#   scripts/device_cuda.sh sanitize    the same tests under compute-sanitizer memcheck; $OUT/cuda-sanitizer.txt
#   scripts/device_cuda.sh bench [ARGS] lowbit bench --kernels ARGS; $OUT/bench-kernels.txt
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
case "${1:-}" in
  test)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/cuda-tests.txt"
    "$LB/pkg/test_cuda_kernels" 2>&1 | tee -a "$OUT/cuda-tests.txt" | grep -E "OK|FAILED|SKIPPED|Failure|budget|PASSED" | head -60
    ;;
  sanitize)
    compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" > "$OUT/cuda-sanitizer.txt" 2>&1
    echo "compute-sanitizer exit: $?" | tee -a "$OUT/cuda-sanitizer.txt"
    grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/cuda-sanitizer.txt" | head
    ;;
  bench)
    shift
    "$LB/pkg/lowbit" bench --kernels "$@" 2>&1 | tee "$OUT/bench-kernels.txt"
    ;;
  *) echo "usage: $0 test | sanitize | bench [ARGS]" >&2; exit 2 ;;
esac
