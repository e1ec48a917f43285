#!/usr/bin/env bash
# Runs on the lent GPU machine (CPU work: 16 cores) over the bundle from scripts/device/bundle.sh.
#   scripts/device/eval.sh stage                 unpack whatever parts of .devbundle/ came with this call into /tmp/lb
#   scripts/device/eval.sh run CONFIG...         quantize + full WikiText-2 ppl per CONFIG, logs under $OUT
# CONFIG: baseline | rtn:BITS:GROUP | gptq:BITS:GROUP[:SAMPLES:SEQLEN]   (GROUP 0 = per channel)
set -uo pipefail
source "$(dirname "$0")/env.sh"
OUT="${OUT:-/tmp/out}"
mkdir -p "$LB/parts" "$OUT"
case "${1:-}" in
  stage)
    [ -f .devbundle/pkg.tar.xz ] && tar -C "$LB" -xJf .devbundle/pkg.tar.xz
    [ -d .devbundle/data ] && cp -r .devbundle/data "$LB/"
    [ -d .devbundle/shared ] && cp -r .devbundle/shared "$LB/"
    cp .devbundle/smollm2.part* "$LB/parts/" 2>/dev/null
    cp .devbundle/smollm2.sha256 "$LB/" 2>/dev/null
    if [ -f "$LB/smollm2.sha256" ] && [ ! -f "$LB/smollm2.gguf" ]; then
      cat "$LB"/parts/smollm2.part* > "$LB/candidate.gguf"
      if [ "$(sha256sum "$LB/candidate.gguf" | cut -d' ' -f1)" = "$(cat "$LB/smollm2.sha256")" ]; then
        mv "$LB/candidate.gguf" "$LB/smollm2.gguf" && echo "stage: model complete"
      else
        rm -f "$LB/candidate.gguf" && echo "stage: model parts so far: $(ls "$LB/parts" | tr '\n' ' ')"
      fi
    fi
    "$LB/pkg/lowbit" --help >/dev/null && echo "stage: lowbit runs ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
    ;;
  run)
    shift
    M="$LB/smollm2.gguf"
    W="$LB/data/wiki.test.raw"
    C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
    for cfg in "$@"; do
      IFS=: read -r method bits group samples seqlen <<<"$cfg"
      name="${method}${bits:+-w$bits}${group:+-g$group}"
      model="$M"
      if [ "$method" != baseline ]; then
        model="/tmp/q/$name.lowbit"
        mkdir -p /tmp/q
        extra=()
        [ "$method" = gptq ] && extra=(--calib "$C" --calib-samples "${samples:-128}" --calib-seqlen "${seqlen:-2048}")
        /usr/bin/time -f "wall %e s, max RSS %M KB" "$LB/pkg/lowbit" quantize "$M" --method "$method" --bits "$bits" \
          --group "$group" "${extra[@]}" -o "$model" > "$OUT/quant-$name.log" 2>&1
        tail -7 "$OUT/quant-$name.log"
      fi
      "$LB/pkg/lowbit" ppl "$model" --text "$W" ${PPL_ARGS:-} > "$OUT/ppl-$name.log" 2>&1
      echo "$name: $(grep -E 'perplexity|speed' "$OUT/ppl-$name.log" | tr '\n' ' ')"
    done
    ;;
  *) echo "usage: $0 stage | run CONFIG..." >&2; exit 2 ;;
esac
