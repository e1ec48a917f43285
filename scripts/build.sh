#!/usr/bin/env bash
# Configure and build lowbit (Release) into build/. Extra arguments go to cmake's configure step.
# LOWBIT_DEVICE_CODE=check builds the CUDA kernels as unoptimized PTX (compiled and type-checked, not runnable at
# speed): what scripts/test.sh uses on a machine without a GPU. Default: sass, the optimized Hopper build.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOWBIT_CUDA_DEVICE_CODE="${LOWBIT_DEVICE_CODE:-sass}" "$@" >/dev/null
cmake --build build -j "$JOBS"
