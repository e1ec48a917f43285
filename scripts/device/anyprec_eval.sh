#!/usr/bin/env bash
# On the lent GPU machine, after `scripts/device/eval.sh stage`: the any-precision table for SmolLM2 (docs/QUALITY.md,
# "Any-precision: seed, upscaling, bitplanes").
#   scripts/device/anyprec_eval.sh quant   quantizes into $Q (CPU, 16 cores): the seed-3 -> 8 parent with Fisher
#                                          sensitivity (its Fisher cached), the same width quantized directly
#                                          (seed = width, from the cached Fisher) for 3..8, Hessian-diagonal
#                                          sensitivity, a 2-bit seed, 0.5% dense-and-sparse outliers, and GPTQ g128
#                                          at 5..8 for the comparison; writes $OUT/quant.done when all are done
#   scripts/device/anyprec_eval.sh eval    full WikiText-2 ppl of every width of every file with tools/hf_ppl.py
#                                          on the GPU (numpy decoder of the documented layout), and `lowbit ppl`
#                                          (CPU) on the first CHECK_WINDOWS windows as the cross-check
# Files already made (or evaluated) by an earlier call on this machine are skipped.
set -uo pipefail
source "$(dirname "$0")/env.sh"
B="$LB/pkg/lowbit"; M="$LB/smollm2.gguf"; W="$LB/data/wiki.test.raw"; C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
OUT="${OUT:-/tmp/out}"; Q="${Q:-/tmp/q}"; HF="${HF:-/tmp/hf}"
mkdir -p "$OUT" "$Q"
AP_CAL=(--calib "$C" --calib-samples "${AP_SAMPLES:-100}" --calib-seqlen "${AP_SEQLEN:-512}")
GPTQ_CAL=(--calib "$C" --calib-samples "${GPTQ_SAMPLES:-128}" --calib-seqlen "${GPTQ_SEQLEN:-512}")
NP=$(nproc)

q() {   # q NAME THREADS ARGS...: one quantization, timed, skipped when its file exists
  local name=$1 threads=$2; shift 2
  [ -f "$Q/$name.lowbit" ] && return 0
  /usr/bin/time -f "wall %e s, max RSS %M KB" env OMP_NUM_THREADS="$threads" "$B" quantize "$M" "$@" \
    -o "$Q/$name.lowbit" 2>&1 | grep -v -E '^(quantize|fisher) \[' > "$OUT/quant-$name.log"
}

case "${1:-}" in
  quant)
    rm -f "$OUT/quant.done"
    for b in ${GPTQ_WIDTHS:-5 6 7 8}; do
      q "gptq-w$b-g128" 2 --method gptq --bits "$b" --group 128 "${GPTQ_CAL[@]}" &
    done
    q ap-s3p8-hdiag 2 --method anyprec --sensitivity hessian-diag "${AP_CAL[@]}" &
    # The Fisher pass (the long part) gets the remaining cores and writes the cache the other runs read.
    q ap-s3p8-fisher $((NP > 12 ? NP - 10 : 2)) --method anyprec --seed-bits 3 --parent-bits 8 "${AP_CAL[@]}" \
      --sensitivity-cache "$Q/fisher.st"
    for b in 3 4 5 6 7 8; do
      q "ap-direct-w$b" 2 --method anyprec --seed-bits "$b" --parent-bits "$b" "${AP_CAL[@]}" --sensitivity-cache "$Q/fisher.st" &
    done
    q ap-s2p8-fisher 2 --method anyprec --seed-bits 2 "${AP_CAL[@]}" --sensitivity-cache "$Q/fisher.st" &
    q ap-s3p8-fisher-o0.005 2 --method anyprec --outliers 0.005 "${AP_CAL[@]}" --sensitivity-cache "$Q/fisher.st" &
    wait
    ls -la "$Q" > "$OUT/quant.done"
    ;;
  eval)
    [ -d "$HF" ] || "$B" convert "$M" "$HF" > /dev/null
    ev() {   # ev NAME WIDTHS
      local name=$1 widths=$2
      [ -f "$Q/$name.lowbit" ] || { echo "$name: missing" | tee -a "$OUT/summary.txt"; return; }
      grep -q "^$name " "$OUT/summary.txt" 2>/dev/null && return
      local bits=(); [ -n "$widths" ] && bits=(--bits "$widths")
      python3 tools/hf_ppl.py --lowbit "$Q/$name.lowbit" --hf-dir "$HF" --text "$W" "${bits[@]}" \
        ${MAXW:+--max-windows $MAXW} 2>/dev/null | sed "s/^/$name | gpu full | /" | tee -a "$OUT/summary.txt"
      local first=${widths%%,*}
      "$B" ppl "$Q/$name.lowbit" --text "$W" ${first:+--bits $first} --max-windows "${CHECK_WINDOWS:-1}" 2>/dev/null \
        | grep -E "mean NLL" | sed "s/^/$name | cpu first ${CHECK_WINDOWS:-1} windows ${first:+bits $first} | /" \
        | tee -a "$OUT/summary.txt"
      python3 tools/hf_ppl.py --lowbit "$Q/$name.lowbit" --hf-dir "$HF" --text "$W" ${first:+--bits $first} \
        --max-windows "${CHECK_WINDOWS:-1}" 2>/dev/null | sed "s/^/$name | gpu first ${CHECK_WINDOWS:-1} windows | /" \
        | tee -a "$OUT/summary.txt"
    }
    ev ap-s3p8-fisher 3,4,5,6,7,8
    for b in 3 4 5 6 7 8; do ev "ap-direct-w$b" "$b"; done
    ev ap-s3p8-hdiag 3,4,5,6,7,8
    ev ap-s2p8-fisher 2,3,4,5,6,7,8
    ev ap-s3p8-fisher-o0.005 3,4,5,6,7,8
    for b in ${GPTQ_WIDTHS:-5 6 7 8}; do ev "gptq-w$b-g128" ""; done
    for f in "$OUT"/quant-*.log; do echo "== $f"; grep -E "wall|time|width|average bits|file size" "$f"; done \
      > "$OUT/quant-times.txt"
    ;;
  *) echo "usage: $0 quant | eval" >&2; exit 2 ;;
esac
