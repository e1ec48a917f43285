#!/usr/bin/env bash
# Packs what the lent GPU machine needs into .devbundle/ (git-ignored): a portable lowbit build (no -march=native;
# OpenBLAS picks its kernels at run time; CUDA for sm_90 when nvcc is here) and the GPU test binary, with the shared
# libraries the device image lacks (not cuBLAS / cuSPARSE: the device's own are used, see scripts/device/env.sh), the
# evaluation/calibration text, and the SmolLM2 GGUF split in two parts that each fit the 64 MiB transfer limit.
# The device runs scripts/device/eval.sh stage on it. Usage: scripts/device/bundle.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
B=build-portable-cuda
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DLOWBIT_NATIVE=OFF -DLOWBIT_CUDA=ON -DLOWBIT_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
GPU_TESTS=(test_cuda_kernels test_cuda_model test_api test_gptq_gpu test_mixed24_gpu test_fisher_gpu test_quantize_gpu
  test_anyprec_gpu test_cuda_mixed_width)
targets=(lowbit_cli)
grep -q "LOWBIT_CUDA:BOOL=ON" $B/CMakeCache.txt && grep -q "CMAKE_CUDA_COMPILER:.*nvcc" $B/CMakeCache.txt && targets+=("${GPU_TESTS[@]}")
cmake --build $B -j "$(nproc)" --target "${targets[@]}" >/dev/null
rm -rf .devbundle && mkdir -p .devbundle/pkg/lib .devbundle/data
cp $B/lowbit .devbundle/pkg/
for t in "${GPU_TESTS[@]}"; do [ -f $B/$t ] && cp $B/$t .devbundle/pkg/; done
for bin in .devbundle/pkg/lowbit .devbundle/pkg/test_*; do
  [ -f "$bin" ] || continue
  for lib in $(ldd "$bin" | awk '/=>/ {print $3}'); do
    case "$(basename "$lib")" in libc.so*|libm.so*|libcublas*|libcusparse*|libcusolver*|libnvJitLink*|libcudart*|libcuda.so*) ;; *) cp -L "$lib" .devbundle/pkg/lib/ ;; esac
  done
done
# One xz dictionary spanning all the binaries (each ~30 MB, the same CUDA library linked into each): the copies
# after the first cost almost nothing, where the default 8 MiB window compressed each on its own.
tar -C .devbundle -cf - pkg | xz -T1 --lzma2=preset=6,dict=320MiB > .devbundle/pkg.tar.xz && rm -rf .devbundle/pkg
SHARED="${LOWBIT_SHARED_DIR:-$(cd .. && pwd)/shared}"
cp "$SHARED/data/wikitext-2-raw/wiki.test.raw" "$SHARED/data/c4/c4-validation.calib-docs-0-511.jsonl" .devbundle/data/
# The part of ../shared the GPU tests read (LOWBIT_SHARED_DIR on the device).
mkdir -p .devbundle/shared/models .devbundle/shared/data/c4 .devbundle/shared/data/tinystories
cp -r "$SHARED/models/stories260K" .devbundle/shared/models/
cp "$SHARED/data/c4/c4-validation.calib-docs-0-511.jsonl" .devbundle/shared/data/c4/
cp "$SHARED/data/tinystories/TinyStoriesV2-GPT4-valid.sample8.txt" .devbundle/shared/data/tinystories/
GGUF="${LOWBIT_CACHE:-$HOME/.cache/lowbit}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
# Two parts of ~47 MiB: each fits one call's 64 MiB transfer beside the working tree.
split -n 2 -d "$GGUF" .devbundle/smollm2.part
sha256sum "$GGUF" | cut -d' ' -f1 > .devbundle/smollm2.sha256
ls -la .devbundle
