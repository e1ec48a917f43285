#!/usr/bin/env bash
# On the lent GPU machine, after `scripts/device/eval.sh stage`: the QUIK table (docs/QUALITY.md, "QUIK: weights and
# activations quantized").
#   scripts/device/quik_eval.sh quant   quantizes every weight configuration into $Q on the CPU (jobs in parallel,
#                                       2 threads each; background-safe: logs and a done marker under $LOGS)
#   scripts/device/quik_eval.sh eval    full WikiText-2 ppl of every (file, activation variant) on the GPU
#                                       (tools/hf_ppl.py --lowbit --abits: QUIK's arithmetic in fp64 from a decoder
#                                       independent of lowbit's) plus `lowbit ppl` (CPU, the file's own activation
#                                       bits) on the first window; summary in $LOGS/summary.txt
# Calibration keeps activations unquantized, so one weight file serves every activation width (A16/A8/A4/FP8).
set -uo pipefail
source "$(dirname "$0")/env.sh"
B="$LB/pkg/lowbit"; M="$LB/smollm2.gguf"; W="$LB/data/wiki.test.raw"; C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
LOGS="${LOGS:-/tmp/quiklogs}"; Q="${Q:-/tmp/qq}"
mkdir -p "$LOGS" "$Q"
CAL=(--calib "$C" --calib-samples "${SAMPLES:-128}" --calib-seqlen "${SEQLEN:-512}")
# name | quantize arguments | activation variants evaluated on the GPU
CONFIGS=(
  "quik-w4-od|--wbits 4 --abits 4|16,8,4,fp8"
  "quik-w4-o0|--wbits 4 --abits 4 --outliers 0|16,8,4"
  "quik-w8-od|--wbits 8 --abits 8|8"
  "quik-w8-o0|--wbits 8 --abits 8 --outliers 0|8"
  "quik-w4-od-d8|--wbits 4 --abits 4 --int8-down-proj|8,4"
  "quik-w4-o16|--wbits 4 --abits 4 --outliers 16|4"
  "quik-w4-o72|--wbits 4 --abits 4 --outliers 72|4"
  "quik-w4-o144|--wbits 4 --abits 4 --outliers 144|4"
)
# Files whose first window is also scored by `lowbit ppl` (CPU) and by the harness at the file's own activations.
CROSS="${CROSS:-quik-w4-od quik-w8-od}"
case "${1:-}" in
  quant)
    rm -f "$LOGS/quant.done"
    for entry in "${CONFIGS[@]}"; do
      IFS='|' read -r name args variants <<<"$entry"
      [ -f "$Q/$name.lowbit" ] && continue
      ( /usr/bin/time -f "wall %e s, max RSS %M KB" env OMP_NUM_THREADS=2 "$B" quantize "$M" --method quik $args \
          "${CAL[@]}" --dense-dtype f32 -o "$Q/$name.lowbit" 2>&1 | grep -v '^quantize \[' > "$LOGS/quant-$name.log" ) &
    done
    wait
    ls -la "$Q" > "$LOGS/quant.done"
    ;;
  eval)
    [ -d /tmp/hf ] || "$B" convert "$M" /tmp/hf > /dev/null
    for entry in "${CONFIGS[@]}"; do
      IFS='|' read -r name args variants <<<"$entry"
      grep -q "^$name " "$LOGS/summary.txt" 2>/dev/null && continue
      [ -f "$Q/$name.lowbit" ] || { echo "$name | missing" >> "$LOGS/summary.txt"; continue; }
      gpu=$(python3 tools/hf_ppl.py --lowbit "$Q/$name.lowbit" --hf-dir /tmp/hf --text "$W" --abits "$variants" 2>&1 | grep -E "^abits|Error" | tr '\n' ';')
      cpu=skipped; gpu1=skipped
      if [[ " $CROSS " == *" $name "* ]]; then
        cpu=$("$B" ppl "$Q/$name.lowbit" --text "$W" --max-windows 1 2>/dev/null | grep "mean NLL")
        gpu1=$(python3 tools/hf_ppl.py --lowbit "$Q/$name.lowbit" --hf-dir /tmp/hf --text "$W" --max-windows 1 2>/dev/null | tail -1)
      fi
      bits=$(grep -E "average bits|outlier columns" "$LOGS/quant-$name.log" | sed 's/(.*)//' | tr -s ' ' | tr '\n' ';')
      echo "$name | full(gpu): $gpu | first window, file's own activations: lowbit-cpu $cpu / gpu $gpu1 | $bits" >> "$LOGS/summary.txt"
      [ -n "${OUT:-}" ] && cp "$LOGS/summary.txt" "$OUT/" 2>/dev/null
    done
    ;;
  *) echo "usage: $0 quant | eval" >&2; exit 2 ;;
esac
