# Sourced by the scripts/device/*.sh scripts on the lent GPU machine: where the staged bundle lives ($LB), a
# library path holding the bundle's shared libraries plus the machine's own cuBLAS, cuSPARSE and cuSOLVER (the CUDA build links
# them dynamically and the CUDA runtime statically; each is found once and remembered in $LB/cublas_dir, $LB/cusparse_dir,
# $LB/cusolver_dir), and step(), which runs one logged, time-limited command.
LB="${LB:-/tmp/lb}"
if [ ! -s "$LB/cublas_dir" ]; then
  mkdir -p "$LB"
  lib=$(find /usr/local /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)
  [ -z "$lib" ] && lib=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib", "x"))' 2>/dev/null)
  [ -n "$lib" ] && dirname "$lib" > "$LB/cublas_dir"
fi
if [ ! -s "$LB/cusparse_dir" ]; then
  mkdir -p "$LB"
  lib=$(find /usr/local /usr/lib /opt -name 'libcusparse.so.12*' 2>/dev/null | head -1)
  [ -z "$lib" ] && lib=$(python3 -c 'import nvidia.cusparse, os; print(os.path.join(os.path.dirname(nvidia.cusparse.__file__), "lib", "x"))' 2>/dev/null)
  [ -n "$lib" ] && dirname "$lib" > "$LB/cusparse_dir"
fi
if [ ! -s "$LB/cusolver_dir" ]; then
  mkdir -p "$LB"
  lib=$(find /usr/local /usr/lib /opt -name 'libcusolver.so.12*' 2>/dev/null | head -1)
  [ -z "$lib" ] && lib=$(python3 -c 'import nvidia.cu13, os; print(os.path.join(os.path.dirname(nvidia.cu13.__file__), "lib", "x"))' 2>/dev/null)
  [ -n "$lib" ] && dirname "$lib" > "$LB/cusolver_dir"
fi
export LD_LIBRARY_PATH="$LB/pkg/lib:$(cat "$LB/cublas_dir" 2>/dev/null):$(cat "$LB/cusparse_dir" 2>/dev/null):$(cat "$LB/cusolver_dir" 2>/dev/null)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# step NAME TIMEOUT CMD...: runs CMD into $OUT/NAME.txt ($OUT set by the caller), headed by the command, the GPU and the date.
step() {
  local name=$1 limit=$2
  shift 2
  {
    echo "# \$ $*"
    echo "# $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader), $(date -u +%FT%TZ)"
  } > "$OUT/$name.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" >> "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "# exit $rc after $((SECONDS - t0)) s" >> "$OUT/$name.txt"
  echo "$name: exit $rc after $((SECONDS - t0)) s"
}
