#!/usr/bin/env bash
# On the lent GPU machine, after `scripts/device/eval.sh stage`: quantizes SmolLM2 with lowbit (CPU, the configs in
# parallel), then measures full WikiText-2 perplexity of every file with tools/hf_ppl.py on the GPU (transformers,
# fp32, weights decoded independently from the .lowbit layout) and, as the cross-check, `lowbit ppl` (CPU) on the
# first CHECK_WINDOWS windows of the same file. Logs and a summary go to $OUT.
#   scripts/device/quant_eval.sh CONFIG...    CONFIG: baseline | rtn:BITS:GROUP | gptq:BITS:GROUP:SAMPLES:SEQLEN[:act]
set -uo pipefail
source "$(dirname "$0")/env.sh"
B="$LB/pkg/lowbit"; M="$LB/smollm2.gguf"; W="$LB/data/wiki.test.raw"; C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/q
[ -d /tmp/hf ] || "$B" convert "$M" /tmp/hf > /dev/null
todo=0
for cfg in "$@"; do IFS=: read -r m b g _ _ f <<<"$cfg"; [ "$m" != baseline ] && [ ! -f "/tmp/q/$m-w$b-g$g${f:+-$f}.lowbit" ] && todo=$((todo + 1)); done
threads=$(( $(nproc) / (todo > 0 ? todo : 1) )); [ "$threads" -ge 1 ] || threads=1
pids=()
for cfg in "$@"; do
  IFS=: read -r method bits group samples seqlen flag <<<"$cfg"
  [ "$method" = baseline ] && continue
  name="$method-w$bits-g$group${flag:+-$flag}"
  [ -f "/tmp/q/$name.lowbit" ] && continue   # made by an earlier call on this machine
  extra=(); [ "$method" = gptq ] && extra=(--calib "$C" --calib-samples "$samples" --calib-seqlen "$seqlen")
  [ "$flag" = act ] && extra+=(--act-order)
  ( /usr/bin/time -f "wall %e s" env OMP_NUM_THREADS=$threads "$B" quantize "$M" --method "$method" --bits "$bits" \
      --group "$group" "${extra[@]}" -o "/tmp/q/$name.lowbit" 2>&1 | grep -v '^quantize \[' > "$OUT/quant-$name.log" ) &
  pids+=($!)
done
wait "${pids[@]}" 2>/dev/null
for cfg in "$@"; do
  IFS=: read -r method bits group samples seqlen flag <<<"$cfg"
  if [ "$method" = baseline ]; then name=baseline; args=(--hf-dir /tmp/hf); file="$M"
  else name="$method-w$bits-g$group${flag:+-$flag}"; file="/tmp/q/$name.lowbit"; args=(--lowbit "$file" --hf-dir /tmp/hf); fi
  gpu=$(python3 tools/hf_ppl.py "${args[@]}" --text "$W" 2>/dev/null | tail -1)
  cpu=$("$B" ppl "$file" --text "$W" --max-windows "${CHECK_WINDOWS:-2}" 2>/dev/null | grep -E "mean NLL" )
  gpu_sub=$(python3 tools/hf_ppl.py "${args[@]}" --text "$W" --max-windows "${CHECK_WINDOWS:-2}" 2>/dev/null | tail -1)
  bits_line=$(grep -E "average bits|time:|wall" "$OUT/quant-$name.log" 2>/dev/null | tr '\n' ' ')
  echo "$name | full(gpu): $gpu | first ${CHECK_WINDOWS:-2} windows: lowbit-cpu $cpu / gpu $gpu_sub | $bits_line" | tee -a "$OUT/summary.txt"
done
