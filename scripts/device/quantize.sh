#!/usr/bin/env bash
# GPU quantization on the lent machine: tests, the SmolLM2 GPU-vs-CPU table, and Llama-shaped timings. On this
# machine first: scripts/device/bundle.sh. Then, back to back (the machine keeps /tmp between warm calls), each call
# carrying the files named and running `OUT=$OUT bash scripts/device/quantize.sh PART`:
#   tests   (.devbundle/pkg.tar.xz, .devbundle/shared)   the GPU quantizer tests (GPTQ/RTN/QUIK, 2/4/16, Fisher, driver)
#   smollm2 (.devbundle/smollm2.part00..01, .sha256)     every SmolLM2 configuration quantized on GPU 0 and, alongside,
#                                                        on the CPU (one job per configuration, the cores split
#                                                        between them), each file scored over the full WikiText-2
#                                                        test by tools/hf_ppl.py on the other GPUs (a multi-GPU kind
#                                                        fits it in one call)
#   eval                                                 scores whatever `smollm2` left unscored
#   first                                                the driver's tests, then Llama-2-7B RTN and GPTQ
#   check, timings                                       on a multi-GPU kind: the tests beside the 7B any-precision
#                                                        timing; the QUIK, 2/4/16 and 70B timings side by side
#   7b, 7b-mixed, 70b                                    random:llama2-7b / random:llama2-70b?layers=10 timings
# Logs land in $OUT, one file per step.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
bash scripts/device/eval.sh stage
source scripts/device/env.sh
export LOWBIT_SHARED_DIR="$LB/shared" LOWBIT_SOURCE_DIR="$PWD"
B="$LB/pkg/lowbit"; M="$LB/smollm2.gguf"; W="$LB/data/wiki.test.raw"; C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
Q=/tmp/qg; LOGS=/tmp/qglogs
mkdir -p "$Q" "$LOGS"
CAL=(--calib "$C" --calib-samples 128 --calib-seqlen 512)
# name | quantize arguments | hf_ppl variants (--bits for anyprec, --abits for quik)
CONFIGS=(
  "rtn-w4g128|--method rtn --bits 4 --group 128|"
  "gptq-w3g128|--method gptq --bits 3 --group 128 ${CAL[*]}|"
  "gptq-w4g128-ao|--method gptq --bits 4 --group 128 --act-order ${CAL[*]}|"
  "anyprec-3to8|--method anyprec --calib $C|--bits 3,4,8"
  "mixed24|--method mixed24 ${CAL[*]}|"
  "quik-w4a8|--method quik --wbits 4 --abits 8 ${CAL[*]}|--abits 8"
  "quik-w8a8|--method quik --wbits 8 --abits 8 ${CAL[*]}|--abits 8"
)

score() {   # score NAME DEVICE: full WikiText-2 perplexity of $Q/NAME-DEVICE.lowbit into $LOGS/summary.txt
  local name=$1 dev=$2 variants=$3 f="$Q/$1-$2.lowbit"
  grep -q "^$name $dev " "$LOGS/summary.txt" 2>/dev/null && return
  [ -f "$f" ] || { echo "$name $dev | missing" >> "$LOGS/summary.txt"; return; }
  local ppl
  ppl=$(OMP_NUM_THREADS=4 python3 tools/hf_ppl.py --lowbit "$f" --hf-dir /tmp/hf --text "$W" $variants 2>&1 | grep -E "ppl|Error" | tr '\n' ';')
  local q
  q=$(grep -E "^  time:|average bits|time by stage|peak" "$LOGS/quant-$name-$dev.log" | tr -s ' ' | tr '\n' ';')
  echo "$name $dev | $ppl | $q" >> "$LOGS/summary.txt"
  cp "$LOGS/summary.txt" "$OUT/"
}

case "${1:-}" in
  tests)
    for t in test_gptq_gpu test_mixed24_gpu test_fisher_gpu test_quantize_gpu test_anyprec_gpu; do step "$t" 300 "$LB/pkg/$t"; done
    grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|^# exit|budget|Hessian k=|mean NLL" "$OUT"/test_*.txt | head -80
    ;;
  smollm2)   # one GPU quantizes (the others score); the CPU reference runs alongside, the cores split between its jobs
    [ -d /tmp/hf ] || "$B" convert "$M" /tmp/hf > /dev/null
    NG=$(nvidia-smi -L | wc -l); NC=$(nproc); JOBS=${#CONFIGS[@]}
    THREADS=$(( (NC - 8) / JOBS )); [ "$THREADS" -lt 1 ] && THREADS=1
    echo "smollm2: $NG GPUs, $NC cores, CPU reference $JOBS jobs x $THREADS threads"
    gpu_for_scoring() { [ "$NG" -gt 1 ] && echo $(( 1 + $1 % (NG - 1) )) || echo 0; }
    i=0
    for entry in "${CONFIGS[@]}"; do   # the CPU reference: quantize, then score, per configuration in the background
      IFS='|' read -r name args variants <<<"$entry"
      g=$(gpu_for_scoring $i); i=$((i + 1))
      ( [ -f "$Q/$name-cpu.lowbit" ] || /usr/bin/time -f "wall %e s, max RSS %M KB" env OMP_NUM_THREADS=$THREADS \
          "$B" quantize "$M" $args --device cpu -o "$Q/$name-cpu.lowbit" > "$LOGS/quant-$name-cpu.log" 2>&1
        cp "$LOGS/quant-$name-cpu.log" "$OUT/"
        CUDA_VISIBLE_DEVICES=$g score "$name" cpu "$variants" ) &
    done
    i=0
    for entry in "${CONFIGS[@]}"; do   # the GPU quantizations one at a time on GPU 0, each scored in the background
      IFS='|' read -r name args variants <<<"$entry"
      g=$(gpu_for_scoring $i); i=$((i + 1))
      [ -f "$Q/$name-gpu.lowbit" ] || /usr/bin/time -f "wall %e s, max RSS %M KB" env CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 \
        "$B" quantize "$M" $args --device cuda -o "$Q/$name-gpu.lowbit" > "$LOGS/quant-$name-gpu.log" 2>&1
      cp "$LOGS/quant-$name-gpu.log" "$OUT/"
      ( CUDA_VISIBLE_DEVICES=$g score "$name" gpu "$variants" ) &
    done
    wait
    sort "$LOGS/summary.txt"
    ;;
  eval)
    [ -d /tmp/hf ] || "$B" convert "$M" /tmp/hf > /dev/null
    for entry in "${CONFIGS[@]}"; do
      IFS='|' read -r name args variants <<<"$entry"
      score "$name" gpu "$variants"; score "$name" cpu "$variants"
    done
    cat "$LOGS/summary.txt"
    ;;
  first)   # the driver's GPU tests, then the Llama-2-7B shape at RTN and GPTQ (what one short device session affords)
    step test_quantize_gpu 150 "$LB/pkg/test_quantize_gpu"
    grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|^# exit|Hessian k=|mean NLL" "$OUT"/test_quantize_gpu.txt
    S="random:llama2-7b"
    step q7b-rtn 90 "$B" quantize "$S" --method rtn --bits 4 --group 128 --device cuda -o /tmp/q7b.lowbit
    rm -f /tmp/q7b.lowbit
    step q7b-gptq 330 "$B" quantize "$S" --method gptq --bits 4 --group 128 --act-order --device cuda -o /tmp/q7b.lowbit
    rm -f /tmp/q7b.lowbit
    grep -hE "^  time|time by stage|peak|device:|^# exit|error" "$OUT"/q7b-*.txt
    ;;
  check)     # a multi-GPU kind: the GPU quantizer tests then the 7B any-precision timing on GPU 0; the kernel tests on
             # GPU 1; the model and API tests on GPU 2; 16 OpenMP threads each (64 per process oversubscribed the cores
             # ten-fold)
    export OMP_NUM_THREADS=16
    ( export CUDA_VISIBLE_DEVICES=1; step test_cuda_kernels 420 "$LB/pkg/test_cuda_kernels" ) &
    ( export CUDA_VISIBLE_DEVICES=2; step test_cuda_model 300 "$LB/pkg/test_cuda_model"; step test_api 200 "$LB/pkg/test_api" ) &
    export CUDA_VISIBLE_DEVICES=0
    for t in test_gptq_gpu test_mixed24_gpu test_fisher_gpu test_quantize_gpu test_anyprec_gpu; do step "$t" 300 "$LB/pkg/$t"; done
    if grep -q "^# exit 0" "$OUT/test_anyprec_gpu.txt"; then
      step q7b-anyprec 330 "$B" quantize random:llama2-7b --method anyprec --device cuda -o /tmp/q7b.lowbit
      rm -f /tmp/q7b.lowbit
    fi
    wait
    grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|^# exit|budget|Hessian k=|mean NLL|anyprec 3..8" "$OUT"/test_*.txt | head -80
    grep -hE "^  time|time by stage|peak|^# exit|error" "$OUT"/q7b-*.txt 2>/dev/null
    ;;
  timings)   # a multi-GPU kind, one run per GPU at once: 7B QUIK W4A8; the QUIK GPU kernels (scripts/device/cuda.sh
             # quik); the 70B shape's GPTQ and any-precision over 3 of its 80 blocks (the summary's stage times and peak
             # memory; the per-block time is flat); the packed uniform kernels (cuda.sh uniform). 16 OpenMP threads
             # each, so that the runs do not oversubscribe the cores
    export OMP_NUM_THREADS=16
    rm -rf /tmp/q7b-quik.lowbit* /tmp/q70b.lowbit*
    ( export CUDA_VISIBLE_DEVICES=0
      step q7b-quik 420 "$B" quantize random:llama2-7b --method quik --wbits 4 --abits 8 --device cuda -o /tmp/q7b-quik.lowbit
      rm -rf /tmp/q7b-quik.lowbit* ) &
    ( export CUDA_VISIBLE_DEVICES=1; bash scripts/device/cuda.sh quik > /dev/null 2>&1 ) &
    ( export CUDA_VISIBLE_DEVICES=2; S="random:llama2-70b?layers=3"
      step q70b-gptq 200 "$B" quantize "$S" --method gptq --bits 4 --group 128 --device cuda -o /tmp/q70b.lowbit
      rm -rf /tmp/q70b.lowbit*
      step q70b-anyprec 250 "$B" quantize "$S" --method anyprec --device cuda -o /tmp/q70b.lowbit
      rm -rf /tmp/q70b.lowbit* ) &
    [ "$(nvidia-smi -L | wc -l)" -ge 4 ] && ( export CUDA_VISIBLE_DEVICES=3; bash scripts/device/cuda.sh uniform > /dev/null 2>&1 ) &
    wait
    grep -hE "^  time|time by stage|peak|^# exit|error" "$OUT"/q7*.txt
    grep -hE "^# exit|PASSED|FAILED|ERROR SUMMARY" "$OUT"/uniform-*.txt "$OUT"/quik-*.txt 2>/dev/null
    ;;
  7b)        # the Llama-2-7B shape: any-precision and QUIK W4A8
    S="random:llama2-7b"
    step q7b-anyprec 330 "$B" quantize "$S" --method anyprec --device cuda -o /tmp/q7b.lowbit
    rm -f /tmp/q7b.lowbit
    step q7b-quik 330 "$B" quantize "$S" --method quik --wbits 4 --abits 8 --device cuda -o /tmp/q7b.lowbit
    rm -f /tmp/q7b.lowbit
    grep -hE "^  time|time by stage|peak|^# exit|error" "$OUT"/q7b-*.txt
    ;;
  7b-mixed)  # the Llama-2-7B shape: 2/4/16
    step q7b-mixed24 580 "$B" quantize random:llama2-7b --method mixed24 --device cuda -o /tmp/q7b.lowbit
    rm -f /tmp/q7b.lowbit
    grep -hE "^  time|time by stage|peak|^# exit|error" "$OUT"/q7b-*.txt
    ;;
  70b)       # the Llama-2-70B shape, 10 of its 80 blocks (per-block progress lines kept to show the time is flat)
    S="random:llama2-70b?layers=10"
    step q70b-gptq 300 "$B" quantize "$S" --method gptq --bits 4 --group 128 --device cuda -o /tmp/q70b.lowbit
    rm -f /tmp/q70b.lowbit
    step q70b-anyprec 280 "$B" quantize "$S" --method anyprec --device cuda -o /tmp/q70b.lowbit
    rm -f /tmp/q70b.lowbit
    grep -hE "^  time|time by stage|peak|^# exit|error" "$OUT"/q70b-*.txt
    ;;
  *) echo "usage: $0 first | tests | check | smollm2 | eval | timings | 7b | 7b-mixed | 70b" >&2; exit 2 ;;
esac
