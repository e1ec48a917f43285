#!/usr/bin/env bash
# ctest entry of the OpenAI-client tests of `lowbit serve` (test_openai_client.py): runs them with the client
# environment scripts/setup.sh makes (${LOWBIT_CACHE:-~/.cache/lowbit}/venv-client, the `openai` package pinned there).
# Exit 77 (ctest: skipped, said out loud) when that environment or stories260K is missing.
# Usage: run.sh LOWBIT_CLI
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
CACHE="${LOWBIT_CACHE:-$HOME/.cache/lowbit}"
PY="$CACHE/venv-client/bin/python"
SHARED="${LOWBIT_SHARED_DIR:-$(cd "$here/../../.." && pwd)/shared}"
[ -d "$SHARED" ] || SHARED=/work/shared
STORIES="$SHARED/models/stories260K/stories260K.bin"
if ! "$PY" -c "import openai" 2>/dev/null; then
  echo "SKIPPED: no openai client environment at $CACHE/venv-client (scripts/setup.sh makes it)"
  exit 77
fi
if [ ! -f "$STORIES" ]; then
  echo "SKIPPED: missing $STORIES"
  exit 77
fi
exec "$PY" "$here/test_openai_client.py" "$1" "$STORIES" "$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
