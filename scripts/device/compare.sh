#!/usr/bin/env bash
# On the lent GPU machine, after `scripts/device/eval.sh stage` (bundle from scripts/device/bundle.sh): end-to-end speed
# of this build against a baseline build of lowbit, timed back to back on the same GPU, and host memory of loading a
# 7B-shaped fp16 model onto the GPU.
#   scripts/device/compare.sh e2e BASELINE_XZ   `bench --e2e` on the Llama-2-7B shape (fp16, any-precision 3/4/8, 2/4/16,
#                                               batch 1 and 8), this build and the baseline binary (xz-compressed)
#                                               alternately, twice each; $OUT/e2e-compare.txt
#   scripts/device/compare.sh rss               writes a random Llama-2-7B-shaped fp16 Hugging Face directory
#                                               (tools/make_random_hf_model.py) and loads it on the GPU with the
#                                               host-memory test; $OUT/rss.txt
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
source scripts/device/env.sh
export LOWBIT_SHARED_DIR="$LB/shared" LOWBIT_SOURCE_DIR="$PWD"
mkdir -p /tmp/lbcache/models
[ -f "$LB/smollm2.gguf" ] && ln -sf "$LB/smollm2.gguf" /tmp/lbcache/models/SmolLM2-135M-Instruct.Q4_1.gguf
export LOWBIT_CACHE=/tmp/lbcache
head() { echo "# \$ $*"; echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(date -u +%FT%TZ)"; }
case "${1:-}" in
  e2e)
    xz -dc "$2" > /tmp/lowbit-baseline && chmod +x /tmp/lowbit-baseline
    args=(bench --e2e --model-shapes llama2-7b --weights fp16,anyprec,mixed24a --kernel-bits 3,4,8 --decode-batches 1,8)
    {
      for round in 1 2; do
        for which in new baseline; do
          bin="$LB/pkg/lowbit"; [ "$which" = baseline ] && bin=/tmp/lowbit-baseline
          head "$which ($round)" "$bin" "${args[@]}"
          timeout 280 "$bin" "${args[@]}" 2>&1 | grep -E "^llama2" | cut -d'|' -f1-8
        done
      done
    } > "$OUT/e2e-compare.txt" 2>&1
    cat "$OUT/e2e-compare.txt"
    ;;
  rss)
    {
      head python3 tools/make_random_hf_model.py --shape llama2-7b --out /tmp/l7b
      t0=$SECONDS; python3 tools/make_random_hf_model.py --shape llama2-7b --out /tmp/l7b 2>&1 | tail -3; echo "write: $((SECONDS - t0)) s"
      du -sh /tmp/l7b
      head test_cuda_model --gtest_filter='CudaModel.LoadsAModelFile*' with LOWBIT_RSS_MODEL=/tmp/l7b
      LOWBIT_RSS_MODEL=/tmp/l7b timeout 400 "$LB/pkg/test_cuda_model" --gtest_filter='CudaModel.LoadsAModelFile*'
      head test_cuda_model --gtest_filter='CudaModel.LoadsAModelFile*' with SmolLM2
      timeout 120 "$LB/pkg/test_cuda_model" --gtest_filter='CudaModel.LoadsAModelFile*'
    } > "$OUT/rss.txt" 2>&1
    cat "$OUT/rss.txt"
    ;;
  *) echo "usage: $0 e2e BASELINE_XZ | rss" >&2; exit 2 ;;
esac
