#!/usr/bin/env bash
# The GPU test binaries in full on the lent machine, SmolLM2 included (the GGUF staged beforehand in parts by
# scripts/device/eval.sh stage over consecutive calls), then the end-to-end and kernel benchmarks of this build. Usage (on the device, repository root): scripts/device/validate.sh tests|bench
set -uo pipefail
bash scripts/device/eval.sh stage
source scripts/device/env.sh
export LOWBIT_SHARED_DIR=$LB/shared LOWBIT_SOURCE_DIR=$PWD
mkdir -p /tmp/lbcache/models
[ -f "$LB/smollm2.gguf" ] && ln -sf "$LB/smollm2.gguf" /tmp/lbcache/models/SmolLM2-135M-Instruct.Q4_1.gguf
export LOWBIT_CACHE=/tmp/lbcache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "${1:-}" in
  tests)
    timeout 250 "$LB/pkg/test_cuda_model" 2>&1 | grep -E "^\[|Failure|max \||agreement" | tail -40
    timeout 330 "$LB/pkg/test_cuda_kernels" 2>&1 | grep -E "^\[  |^\[==|Failure" | tail -40
    ;;
  bench)
    timeout 200 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b --weights fp16,anyprec --kernel-bits 2,3,4,8 --decode-batches 1,8
    timeout 300 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-70b --weights anyprec --kernel-bits 3,4 --decode-batches 1,8
    ;;
  *) echo "usage: $0 tests|bench" >&2; exit 2 ;;
esac
