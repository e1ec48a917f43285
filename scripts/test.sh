#!/usr/bin/env bash
# Set up (deps + model), build, and run every test. Exit status is ctest's.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh || { echo "[test] setup failed"; exit 1; }
scripts/build.sh || { echo "[test] build failed"; exit 1; }
ctest --test-dir build --output-on-failure -j "${JOBS:-$(nproc)}" 2>&1 | tee build/ctest.log
rc=${PIPESTATUS[0]}
skipped=$(grep -cE "^[[:space:]]+[0-9]+ - .*\(Skipped\)" build/ctest.log || true)   # the summary list (each test once)
echo
echo "================ lowbit test summary ================"
grep -E "tests passed|tests failed" build/ctest.log | tail -1
echo "skipped tests (each says why above): $skipped"
echo "elapsed: $(( $(date +%s) - start )) s"
[ "$rc" -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit "$rc"
