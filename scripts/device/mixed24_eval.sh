#!/usr/bin/env bash
# On the lent GPU machine, after `scripts/device/eval.sh stage`: the 2/4-bit mixed-precision table (docs/QUALITY.md,
# "2/4-bit intra-matrix mixed precision").
#   scripts/device/mixed24_eval.sh quant   quantizes every configuration into $Q on the CPU (jobs in parallel, 2
#                                          threads each; background-safe: logs and a done marker under $LOGS)
#   scripts/device/mixed24_eval.sh eval    full WikiText-2 ppl of every file on the GPU (tools/hf_ppl.py --lowbit:
#                                          the packed weights decoded by numpy from the documented layout) plus
#                                          `lowbit ppl` (CPU) on the first window; summary in $LOGS/summary.txt
set -uo pipefail
source "$(dirname "$0")/env.sh"
B="$LB/pkg/lowbit"; M="$LB/smollm2.gguf"; W="$LB/data/wiki.test.raw"; C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
LOGS="${LOGS:-/tmp/m24logs}"; Q="${Q:-/tmp/q}"
mkdir -p "$LOGS" "$Q"
CAL=(--calib "$C" --calib-samples "${SAMPLES:-128}" --calib-seqlen "${SEQLEN:-512}")
CONFIGS=(
  "m24a-o0|--method mixed24 --outliers 0"
  "m24a-o0.002|--method mixed24 --outliers 0.002"
  "m24a-o0.005|--method mixed24 --outliers 0.005"
  "m24a-o0.002-all|--method mixed24 --outliers 0.002 --outliers-from all"
  "m24a-o0.002-colorder|--method mixed24 --outliers 0.002 --unit-order column"
  "m24g-r0.25-o0.002|--method mixed24 --layout generic --outliers 0.002"
  "m24g-r0.1-o0.002|--method mixed24 --ratio-4bit 0.1 --outliers 0.002"
  "m24g-layers-down-o0.002|--method mixed24 --layers-4bit down --outliers 0.002"
  "gptq-w2-g16|--method gptq --bits 2 --group 16"
)
case "${1:-}" in
  quant)
    rm -f "$LOGS/quant.done"
    for entry in "${CONFIGS[@]}"; do
      name=${entry%%|*}; args=${entry#*|}
      [ -f "$Q/$name.lowbit" ] && continue
      ( /usr/bin/time -f "wall %e s, max RSS %M KB" env OMP_NUM_THREADS=2 "$B" quantize "$M" $args "${CAL[@]}" \
          -o "$Q/$name.lowbit" 2>&1 | grep -v '^quantize \[' > "$LOGS/quant-$name.log" ) &
    done
    wait
    ls -la "$Q" > "$LOGS/quant.done"
    ;;
  eval)
    for entry in "${CONFIGS[@]}"; do
      name=${entry%%|*}
      grep -q "^$name " "$LOGS/summary.txt" 2>/dev/null && continue
      [ -f "$Q/$name.lowbit" ] || { echo "$name | missing" >> "$LOGS/summary.txt"; continue; }
      [ -d /tmp/hf ] || "$B" convert "$M" /tmp/hf > /dev/null
      gpu=$(python3 tools/hf_ppl.py --lowbit "$Q/$name.lowbit" --hf-dir /tmp/hf --text "$W" 2>/dev/null | tail -1)
      cpu=$("$B" ppl "$Q/$name.lowbit" --text "$W" --max-windows 1 2>/dev/null | grep "mean NLL")
      gpu1=$(python3 tools/hf_ppl.py --lowbit "$Q/$name.lowbit" --hf-dir /tmp/hf --text "$W" --max-windows 1 2>/dev/null | tail -1)
      bits=$(grep -E "average bits|paper-style" "$LOGS/quant-$name.log" | sed 's/(.*)//' | tr -s ' ' | tr '\n' ';')
      echo "$name | full(gpu): $gpu | first window: lowbit-cpu $cpu / gpu $gpu1 | $bits" >> "$LOGS/summary.txt"
    done
    ;;
  *) echo "usage: $0 quant | eval" >&2; exit 2 ;;
esac
