#!/usr/bin/env bash
# Packs what a CPU evaluation on the lent GPU machine needs into .devbundle/ (git-ignored): a portable lowbit
# build (no -march=native; OpenBLAS picks its kernels at run time) with the shared libraries the device image lacks,
# the evaluation/calibration text, and the SmolLM2 GGUF split into parts that fit the 64 MiB transfer limit.
# The device runs scripts/device_eval.sh on it. Usage: scripts/device_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DLOWBIT_NATIVE=OFF -DLOWBIT_CUDA=OFF -DLOWBIT_TESTS=OFF >/dev/null
cmake --build build-portable -j "$(nproc)" --target lowbit_cli >/dev/null
rm -rf .devbundle && mkdir -p .devbundle/pkg/lib .devbundle/data
cp build-portable/lowbit .devbundle/pkg/
for lib in $(ldd build-portable/lowbit | awk '/=>/ {print $3}'); do
  case "$(basename "$lib")" in libc.so*|libm.so*) ;; *) cp -L "$lib" .devbundle/pkg/lib/ ;; esac
done
tar -C .devbundle -cJf .devbundle/pkg.tar.xz pkg && rm -rf .devbundle/pkg
SHARED="${LOWBIT_SHARED_DIR:-$(cd .. && pwd)/shared}"
cp "$SHARED/data/wikitext-2-raw/wiki.test.raw" "$SHARED/data/c4/c4-validation.calib-docs-0-511.jsonl" .devbundle/data/
GGUF="${LOWBIT_CACHE:-$HOME/.cache/lowbit}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
split -b 40M -d "$GGUF" .devbundle/smollm2.part
sha256sum "$GGUF" | cut -d' ' -f1 > .devbundle/smollm2.sha256
ls -la .devbundle
