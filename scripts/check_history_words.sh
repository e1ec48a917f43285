#!/usr/bin/env bash
# Fails and prints file:line for every development-history word in lowbit's own text: the README, docs, sources,
# tests, benchmarks, scripts and build files. Docs and comments say what lowbit does and why a design was chosen,
# never when ("session 20", "issue 7", build tags like "v13e", "(new)"); that belongs in git log.
# docs/results/ holds raw logs, which may quote old commands: their contents are not checked, their file names are.
# Usage: scripts/check_history_words.sh   (exit 0: clean; 1: hits, listed as file:line: text)
set -uo pipefail
cd "$(dirname "$0")/.."

# One extended regex per kind of history word.
patterns=(
  '[Ss]essions? [0-9]'              # "session 20", "sessions 15 and 17", "Session 28's"
  '[Ss]ince session'                # "since session 18"
  '[Tt]his session'                 # "this session's first rewrite"
  '[Ii]ssues? ?[#-]?[0-9]'          # "issue 7", "issue #7", "issue-3 setup"
  'perf-history'                    # the development diary, removed
  'results/issue'                   # raw logs named after the diary
  '\bv[0-9]+[a-z]\b'                # build tags: v6b, v13e, v14d (GGUF "v2/v3" and "sm_90a" do not match)
  '\(new\)'                         # "(new)" goes stale the day it is written
)
# Allowed matches, each with its reason. A line is dropped when it matches one of these.
exceptions=(
  '\bv[0-9]+h\b'                    # v0h, v1h: kernel variables holding a value's high half, not build tags
)

# Where the product's text lives. tests/fixtures/ is data, docs/results/ raw logs (names checked below).
targets=(README.md CMakeLists.txt docs src include tools bench scripts examples .ci)
for f in tests/*.cpp tests/*.h; do [ -e "$f" ] && targets+=("$f"); done
existing=()
for t in "${targets[@]}"; do [ -e "$t" ] && existing+=("$t"); done

regex=$(IFS='|'; echo "${patterns[*]}")
self=scripts/check_history_words.sh

hits=$(grep -rnIE --exclude-dir=results --exclude-dir=.git -e "$regex" -- "${existing[@]}" 2>/dev/null \
         | grep -v -e "^$self:" || true)
for e in "${exceptions[@]}"; do
  [ -n "$hits" ] && hits=$(printf '%s\n' "$hits" | grep -vE -e "$e" || true)
done

# File names: the raw outputs are named by what they measure, never by when.
names=$(find docs src include tools bench tests scripts examples -type f 2>/dev/null \
          | grep -E 'issue|session|perf-history|(^|[^a-z0-9])v[0-9]+[a-z]([^a-z0-9]|$)' || true)

status=0
if [ -n "$hits" ]; then
  printf '%s\n' "$hits"
  status=1
fi
if [ -n "$names" ]; then
  printf '%s: file name\n' $names
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "check_history_words: history words found (say what lowbit does and why, not when; history is in git log)" >&2
else
  echo "check_history_words: clean"
fi
exit "$status"
