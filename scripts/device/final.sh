#!/usr/bin/env bash
# The full GPU validation and benchmark of one build on the lent machine, in parts that each fit one device call
# (10 minutes) and the 64 MiB transfer limit. On this machine first: scripts/device/bundle.sh. Then, back to back
# (the machine stays warm between calls), each call carrying the files named and running
# `OUT=$OUT bash scripts/device/final.sh PART`:
#   tests    (.devbundle/pkg.tar.xz, .devbundle/shared)  the GPU tests, all but SmolLM2's
#   kernels  (.devbundle/smollm2.part00)                 kernel benchmark: every shape of TARGETS.md x widths 2..8
#                                                        and 2/4/16 x batch 1,2,4,8,16,64,512 beside cuBLAS fp16
#   smollm2  (.devbundle/smollm2.part01, part02, .sha256) the SmolLM2 GPU tests, compute-sanitizer memcheck and
#                                                        racecheck over the tests named below
#   e2e                                                  end to end: Llama-2-7B and Llama-3-8B shapes, every format
#   e2e70b                                               end to end: Llama-2-70B shape (the any-precision parent needs
#                                                        ~77 GB: an H200)
#   sweep1, sweep2                                       memcheck of the two GEMV sweeps (one test per shape), in two
#                                                        calls
#   mma                                                  the 2/4/16 int8 tensor-core GEMV: tests, memcheck, kernel
#                                                        rows at batch 1..8, decode with it and without
#   outliers                                             the 2/4/16 GEMVs' tests and memcheck, the cuSPARSE outlier
#                                                        baseline, kernel rows at batch 1..8
# Logs land in $OUT, one file per step, each headed by its command, device and date.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
bash scripts/device/eval.sh stage
source scripts/device/env.sh
export LOWBIT_SHARED_DIR="$LB/shared" LOWBIT_SOURCE_DIR="$PWD"
mkdir -p /tmp/lbcache/models
[ -f "$LB/smollm2.gguf" ] && ln -sf "$LB/smollm2.gguf" /tmp/lbcache/models/SmolLM2-135M-Instruct.Q4_1.gguf
export LOWBIT_CACHE=/tmp/lbcache

case "${1:-}" in
  tests)
    step tests-model 150 "$LB/pkg/test_cuda_model" --gtest_filter='-CudaModel.SmolLM2*'
    step tests-kernels 400 "$LB/pkg/test_cuda_kernels"
    grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|^# exit" "$OUT"/tests-*.txt
    ;;
  kernels)
    step bench-kernels 560 "$LB/pkg/lowbit" bench --kernels --kernel-bits 2,3,4,5,6,7,8 --batch 1,2,4,8,16,64,512 --iters 20
    sed -n '/^summary/,$p' "$OUT/bench-kernels.txt" | head -40
    ;;
  e2e)
    step bench-e2e-7b-8b 580 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b,llama3-8b --weights fp16,anyprec,mixed24a \
      --kernel-bits 2,3,4,8 --decode-batches 1,8
    grep -E "^llama|width switch" "$OUT/bench-e2e-7b-8b.txt" | cut -c1-200
    ;;
  smollm2)
    step tests-smollm2 240 "$LB/pkg/test_cuda_model" --gtest_filter='CudaModel.SmolLM2*'
    step memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
      --gtest_filter='CudaKernels.*'
    step memcheck-model 100 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_model" \
      --gtest_filter='CudaModel.WidthSwitch*:CudaModel.GraphDecode*:CudaModel.DecodeAndBatch*'
    step racecheck 250 compute-sanitizer --tool racecheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
      --gtest_filter='CudaKernels.Int8GemvCtaForms*:CudaKernels.Mixed24aGrouped*'
    grep -hE "^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY|^# exit" "$OUT"/*.txt
    ;;
  e2e70b)
    step bench-e2e-70b 580 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-70b --weights anyprec,mixed24a \
      --kernel-bits 3,4,8 --decode-batches 1,8
    grep -E "^llama|width switch" "$OUT/bench-e2e-70b.txt" | cut -c1-200
    ;;
  dequant)   # the large-batch path's dequantize kernels: their tests, memcheck, the 2/4/16 kernel rows, 2/4/16 prefill
    step tests-dequant 300 "$LB/pkg/test_cuda_kernels" --gtest_filter='CudaKernels.Dequantize*:CudaKernels.LargeBatch*:CudaKernels.Mixed24a*:CudaKernels.Argmax*'
    step memcheck-dequant 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
      --gtest_filter='CudaKernels.Dequantize*:CudaKernels.LargeBatch*'
    step bench-kernels-mixed24a 200 "$LB/pkg/lowbit" bench --kernels --formats mixed24a --batch 1,8,16,64,512 --iters 20
    step bench-e2e-mixed24a 400 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b,llama3-8b,llama2-70b --weights mixed24a --decode-batches 1
    grep -hE "^\[  (PASSED|FAILED) |ERROR SUMMARY|^# exit|^llama|dequantize to fp16 alone" "$OUT"/*.txt | cut -c1-160
    ;;
  mma)   # the 2/4/16 int8 tensor-core GEMV (batch 3..8): its tests, memcheck, kernel rows beside the other paths, decode A/B
    step tests-mma 300 "$LB/pkg/test_cuda_kernels" --gtest_filter='CudaKernels.Mixed24a*'
    step memcheck-mma 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
      --gtest_filter='CudaKernels.Mixed24aIntegerDot*:CudaKernels.Mixed24aGrouped*'
    step bench-kernels-mma 200 "$LB/pkg/lowbit" bench --kernels --formats mixed24a --batch 1,2,3,4,6,8 --iters 20
    step bench-e2e-mma 250 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b,llama3-8b --weights mixed24a --decode-batches 1,4,8
    step bench-e2e-mma-off 250 env LOWBIT_MIXED_MMA=0 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b,llama3-8b --weights mixed24a \
      --decode-batches 4,8
    grep -hE "^\[  (PASSED|FAILED) |ERROR SUMMARY|^# exit|^llama" "$OUT"/*.txt | cut -c1-160
    ;;
  outliers)   # the 2/4/16 GEMVs and cuSPARSE as the outliers' third way: their tests, memcheck, the kernel rows at
              # batch 1..8 (fused, our CSR pass, cuSPARSE)
    step tests-outliers 300 "$LB/pkg/test_cuda_kernels" --gtest_filter='CudaKernels.Mixed24a*:CudaKernels.Cusparse*'
    step memcheck-outliers 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
      --gtest_filter='CudaKernels.Mixed24aIntegerDot*:CudaKernels.Mixed24aGrouped*:CudaKernels.Cusparse*'
    step bench-kernels-outliers 240 "$LB/pkg/lowbit" bench --kernels --formats mixed24a --batch 1,2,3,4,6,8 --iters 20
    grep -hE "^\[  (PASSED|FAILED) |ERROR SUMMARY|^# exit|cuSPARSE" "$OUT"/*.txt | cut -c1-160
    ;;
  sweep*)   # compute-sanitizer memcheck of the GEMV sweeps, one shape per test (sweep1: the any-precision sweep's shapes
            # 0-6, sweep2: its shapes 7-9 and the int8 sweep's five; the smollm2 part memchecks every CudaKernels.* test)
    if [ "$1" = sweep1 ]; then ids="0 1 2 3 4 5 6"; filter=""; else ids="7 8 9"; filter="CudaKernels/AnyPrecInt8GemvSweep.*"; fi
    for i in $ids; do filter="${filter:+$filter:}CudaKernels/AnyPrecGemvSweep.*/$i"; done
    step "memcheck-$1" 560 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" --gtest_filter="$filter"
    grep -hE "^\[       OK|^\[  (PASSED|FAILED) |ERROR SUMMARY|^# exit" "$OUT"/memcheck-$1.txt
    ;;
  *) echo "usage: $0 tests | kernels | smollm2 | e2e | e2e70b | dequant | mma | outliers | sweep1 | sweep2" >&2; exit 2 ;;
esac
