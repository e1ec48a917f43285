#!/usr/bin/env bash
# The main job end to end: set up, build, quantize the default model once into one any-precision file (a 3-bit seed
# upscaled to an 8-bit parent, serving 3, 4 and 8 bits), then from that one file generate at 3 and at 8 bits and
# score each width on a quick WikiText-2 subset, ending with a table. Runs on the GPU when one is present (device
# auto); quantization runs on the CPU.
#   Default model: SmolLM2-135M-Instruct (GGUF, fetched by scripts/setup.sh); without it, stories260K.
#   The .lowbit file goes to ${LOWBIT_CACHE:-~/.cache/lowbit} (never into the repository) and is reused when present.
#   LOWBIT_DEMO_CALIB=N: calibration windows of 512 tokens for the Fisher pass (default 4; the paper uses 100).
#   LOWBIT_BUILD_DIR=DIR: use the lowbit binary already built in DIR (no set-up, no build).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if [ -n "${LOWBIT_BUILD_DIR:-}" ]; then
  LB="$LOWBIT_BUILD_DIR/lowbit"
else
  scripts/setup.sh || true
  scripts/build.sh
  LB=build/lowbit
fi
[ -x "$LB" ] || { echo "demo: $LB was not built"; exit 1; }
CACHE="${LOWBIT_CACHE:-$HOME/.cache/lowbit}"
SMOL="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SHARED="${LOWBIT_SHARED_DIR:-$(cd .. && pwd)/shared}"
[ -d "$SHARED" ] || SHARED=/work/shared   # a clone outside the workplace layout
WIKI="$SHARED/data/wikitext-2-raw/wiki.test.raw"
CALIB="${LOWBIT_DEMO_CALIB:-4}"
PPL_CTX=512
PPL_WINDOWS=2
WIDTHS="3 4 8"

if [ -f "$SMOL" ]; then
  SRC="$SMOL"
  NAME="smollm2-135m-instruct"
  PROMPT="What are three good reasons to learn to cook?"
  CHAT=(--chat)
  TOKENS=48
else
  SRC="$SHARED/models/stories260K/stories260K.bin"
  NAME="stories260k"
  PROMPT="Once upon a time, there was a little girl named Lily."
  CHAT=()
  TOKENS=48
  echo "note: SmolLM2 unavailable (scripts/setup.sh fetches it); the demo uses stories260K"
fi
OUT="$CACHE/$NAME.anyprec-3to8.calib$CALIB.lowbit"
mkdir -p "$CACHE"
LOG="$(mktemp -d)"
trap 'rm -rf "$LOG"' EXIT

echo
echo "== 1. quantize $(basename "$SRC") -> one any-precision file (seed 3 bits, parent 8, widths 3,4,8) =="
if [ -f "$OUT" ] && $LB inspect "$OUT" --summary >/dev/null 2>&1; then
  echo "reusing $OUT (delete it to quantize again)"
  quant_s="(reused)"
else
  echo "calibration: $CALIB windows of 512 tokens from the C4 sample (the paper uses 100; LOWBIT_DEMO_CALIB=N)"
  t0=$(date +%s)
  $LB quantize "$SRC" --method anyprec --seed-bits 3 --parent-bits 8 --widths 3,4,8 \
      --calib-samples "$CALIB" --calib-seqlen 512 -o "$OUT"
  quant_s="$(( $(date +%s) - t0 )) s"
fi
$LB inspect "$OUT" --summary | tee "$LOG/inspect.txt" | sed -n '/any-precision widths/,$p'

echo
for b in 3 8; do
  echo "== 2. generate at $b bits from $(basename "$OUT")${CHAT:+ (chat)}, greedy =="
  $LB generate "$OUT" "${CHAT[@]}" --bits "$b" --prompt "$PROMPT" --max-tokens "$TOKENS" 2> "$LOG/gen$b.txt"
  cat "$LOG/gen$b.txt"
  echo
done

# Decode speed per width. On a GPU `lowbit bench` times 128 greedy steps after a 128-token prompt (CUDA-graph steps,
# after untimed warm-up steps); on the CPU, where that takes minutes, the table keeps the generations' own speed.
device=$(sed -n 's/^\[\([^|]*\) |.*/\1/p' "$LOG/gen8.txt" | sed 's/ *$//')
if [[ "$device" == cuda* ]]; then
  echo "== 2b. decode speed per width (lowbit bench: 128 greedy steps after a 128-token prompt) =="
  for b in $WIDTHS; do
    $LB bench "$OUT" --bits "$b" --prefill 128 --decode 128 --reps 3 | tee "$LOG/bench$b.txt" | grep -E "^(prefill|decode)"
  done
  echo
fi

if [ -f "$WIKI" ]; then
  echo "== 3. perplexity on WikiText-2 test, SUBSET: the first $PPL_WINDOWS windows of $PPL_CTX tokens =="
  $LB ppl "$OUT" --text "$WIKI" --ctx "$PPL_CTX" --max-windows "$PPL_WINDOWS" --bits 3,4,8 2>/dev/null | tee "$LOG/ppl.txt"
  echo "-- the source model, same windows --"
  $LB ppl "$SRC" --text "$WIKI" --ctx "$PPL_CTX" --max-windows "$PPL_WINDOWS" 2>/dev/null | tee "$LOG/ppl_src.txt"
else
  echo "== 3. perplexity skipped: $WIKI not found =="
fi

# The table: one row per width from the runs above.
ppl_of() {   # width (0: the source model's file)
  local f="$LOG/ppl.txt"
  [ "$1" = 0 ] && f="$LOG/ppl_src.txt"
  [ -f "$f" ] || { echo "-"; return; }
  if [ "$1" = 0 ]; then awk '/^perplexity:/ {print $2}' "$f"; else awk -v b="$1" '/^bits:/ {cur=$2} /^perplexity:/ && cur==b {print $2}' "$f"; fi
}
bits_of() { awk -v b="$1" '$1==b && NF==4 {print $2}' "$LOG/inspect.txt"; }
toks_of() {
  if [ -f "$LOG/bench$1.txt" ]; then
    awk '/^decode/ {for (i = 1; i < NF; ++i) if ($(i + 1) == "tokens/s") {print $i; exit}}' "$LOG/bench$1.txt"
  elif [ -f "$LOG/gen$1.txt" ]; then
    sed -n 's/.*new tokens: \([0-9.]*\) tok\/s.*/\1/p' "$LOG/gen$1.txt"
  else
    echo "-"
  fi
}
mib() { awk -v s="$(stat -L -c %s "$1")" 'BEGIN {printf "%.1f MiB", s / 1048576}'; }

echo
echo "================ lowbit demo summary ================"
echo "model: $NAME   source: $SRC ($(mib "$SRC"))"
echo "one any-precision file: $OUT ($(mib "$OUT"); quantized in $quant_s, $CALIB calibration windows)"
echo "device: $device"
echo "perplexity: WikiText-2 test, SUBSET of $PPL_WINDOWS windows x $PPL_CTX tokens (not comparable to full-test figures)"
printf "%-8s %12s %18s %16s\n" "width" "ppl SUBSET" "bits read/weight" "decode tok/s"
for b in $WIDTHS; do
  t=$(toks_of "$b")
  printf "%-8s %12s %18s %16s\n" "$b" "$(ppl_of "$b")" "$(bits_of "$b")" "$t"
done
printf "%-8s %12s %18s %16s\n" "source" "$(ppl_of 0)" "-" "-"
if [[ "$device" == cuda* ]]; then
  echo "(decode tok/s: lowbit bench, 128 greedy steps after a 128-token prompt, batch 1)"
else
  echo "(decode tok/s: the $TOKENS-token generations above, on the CPU)"
fi
echo "(bits read/weight: every bit a forward at that width reads per quantized weight: planes, that width's"
echo " lookup table and outliers; each row of k weights carries a table of 2^b fp16 entries, so models as small as"
echo " this one (k = 576 for SmolLM2-135M) read well above b bits per weight)"
echo "elapsed: $(( $(date +%s) - start )) s   binary: $LB   (try: $LB --help)"
