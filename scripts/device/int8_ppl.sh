#!/usr/bin/env bash
# On the lent GPU machine, after `scripts/device/eval.sh stage` with the SmolLM2 GGUF staged: the perplexity cost of
# the int8 GEMV's centroid rounding (src/backend_cuda/anyprec/int8_tables.h) as a what-if on every layer of SmolLM2 (the
# GPU path itself needs k >= 2048 and reaches none of SmolLM2's layers). Quantizes the seed-3 -> 8 any-precision parent
# (Fisher sensitivity, 100 x 512 C4 calibration; skipped when /tmp/q/ap.lowbit exists) and runs tools/hf_ppl.py over
# the full WikiText-2 test at widths 3 and 4, with the LUTs as stored and with --int8-tables. Output: $OUT/ppl.txt.
set -uo pipefail
source "$(dirname "$0")/env.sh"
OUT="${OUT:-/tmp/out}"; Q=/tmp/q; HF=/tmp/hf
mkdir -p "$OUT" "$Q"
B="$LB/pkg/lowbit"; M="$LB/smollm2.gguf"; W="$LB/data/wiki.test.raw"; C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
[ -f "$M" ] || { echo "int8_ppl.sh: $M missing (stage the GGUF parts first)" >&2; exit 2; }
if [ ! -f "$Q/ap.lowbit" ]; then
  /usr/bin/time -f "wall %e s, max RSS %M KB" "$B" quantize "$M" --method anyprec --seed-bits 3 --parent-bits 8 \
    --calib "$C" --calib-samples 100 --calib-seqlen 512 -o "$Q/ap.lowbit" 2>&1 | grep -v -E '^(quantize|fisher) \[' > "$OUT/quant.log"
fi
tail -3 "$OUT/quant.log"
[ -d "$HF" ] || "$B" convert "$M" "$HF" > /dev/null
for flag in "" --int8-tables; do
  python3 tools/hf_ppl.py --lowbit "$Q/ap.lowbit" --hf-dir "$HF" --text "$W" --bits 3,4 $flag 2>/dev/null | tee -a "$OUT/ppl.txt"
done
