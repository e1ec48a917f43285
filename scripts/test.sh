#!/usr/bin/env bash
# Set up (deps + model), build, run every test, then install lowbit into build/install and build and run the example
# program (examples/) against the installed package, as a project using lowbit would. Exit status: non-zero when
# ctest or the install/example step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh || { echo "[test] setup failed"; exit 1; }
# Without a GPU the GPU tests skip, so the kernels only need to compile: PTX without the device optimizer (CMakeLists.txt,
# LOWBIT_CUDA_DEVICE_CODE) skips most of their compile time.
if [ -z "${LOWBIT_DEVICE_CODE:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then export LOWBIT_DEVICE_CODE=sass
  else
    export LOWBIT_DEVICE_CODE=check
    echo "[test] no GPU here: CUDA kernels built as PTX without the device optimizer (compile check only; LOWBIT_DEVICE_CODE=sass for the full build)"
  fi
fi
scripts/build.sh || { echo "[test] build failed"; exit 1; }
ctest --test-dir build --output-on-failure -j "${JOBS:-$(nproc)}" 2>&1 | tee build/ctest.log
rc=${PIPESTATUS[0]}
skipped=$(grep -cE "^[[:space:]]+[0-9]+ - .*\(Skipped\)" build/ctest.log || true)   # the summary list (each test once)

# The installed package: every public header compiles on its own with only the standard library, and the example
# finds lowbit with find_package(lowbit CONFIG), links lowbit::lowbit and runs on stories260K.
SHARED="${LOWBIT_SHARED_DIR:-$(cd .. && pwd)/shared}"
[ -d "$SHARED" ] || SHARED=/work/shared
STORIES="$SHARED/models/stories260K/stories260K.bin"
example() {
  rm -rf build/install build/example
  cmake --install build --prefix build/install >/dev/null || { echo "[test] cmake --install failed"; return 1; }
  for h in build/install/include/lowbit/*.h; do   # only the installed headers on the include path
    echo "#include \"lowbit/$(basename "$h")\"" |
      ${CXX:-c++} -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I build/install/include -x c++ - ||
      { echo "[test] $h does not compile on its own"; return 1; }
  done
  cmake -S examples -B build/example -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null &&
    cmake --build build/example -j "${JOBS:-$(nproc)}" >/dev/null || { echo "[test] example build failed"; return 1; }
  if [ ! -f "$STORIES" ]; then
    echo "[test] example built; not run: missing $STORIES"
    return 0
  fi
  OMP_NUM_THREADS=1 build/example/lowbit_example "$STORIES"
}
echo
echo "== installed package: public headers + examples/ against build/install =="
example 2>&1 | tee build/example.log
example_rc=${PIPESTATUS[0]}

echo
echo "================ lowbit test summary ================"
grep -E "tests passed|tests failed" build/ctest.log | tail -1
echo "skipped tests (each says why above): $skipped"
if [ "$example_rc" -eq 0 ]; then
  echo "installed package + example: PASS ($(grep -c '^example: OK' build/example.log) run on stories260K)"
else
  echo "installed package + example: FAIL (see above)"
fi
echo "elapsed: $(( $(date +%s) - start )) s"
[ "$rc" -eq 0 ] && [ "$example_rc" -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
[ "$rc" -eq 0 ] && [ "$example_rc" -eq 0 ]
