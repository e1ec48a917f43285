#!/usr/bin/env bash
# Configure and build lowbit (Release) into build/. Extra arguments go to cmake's configure step.
# LOWBIT_DEVICE_CODE=check builds the CUDA kernels as PTX without the device optimizer outside CUTLASS (compiled and
# type-checked, not runnable at speed): what scripts/test.sh uses on a machine without a GPU. Default: sass, the
# optimized Hopper build.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
# Ninja for a new build folder: unlike make it compiles a target's objects while the libraries it links still build,
# which keeps both cores busy (an existing folder keeps the generator it was made with).
GEN=()
[ -f build/CMakeCache.txt ] || ! command -v ninja >/dev/null || GEN=(-G Ninja)
cmake -S . -B build "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DLOWBIT_CUDA_DEVICE_CODE="${LOWBIT_DEVICE_CODE:-sass}" "$@" >/dev/null
cmake --build build -j "$JOBS"
