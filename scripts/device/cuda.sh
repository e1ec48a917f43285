#!/usr/bin/env bash
# On the lent GPU machine, after `scripts/device/eval.sh stage` (bundle from scripts/device/bundle.sh):
#   scripts/device/cuda.sh test        the GPU tests (kernels vs CPU twins, GPU model vs CPU model); $OUT/cuda-tests.txt
#   scripts/device/cuda.sh sanitize    the same tests under compute-sanitizer memcheck; $OUT/cuda-sanitizer.txt
#   scripts/device/cuda.sh bench [ARGS] lowbit bench --kernels ARGS; $OUT/bench-kernels.txt
#   scripts/device/cuda.sh e2e [ARGS]   lowbit bench --e2e ARGS; $OUT/bench-e2e.txt
#   scripts/device/cuda.sh all          test, bench (defaults), e2e (Llama-2-7B and Llama-3-8B shapes), sanitize
#                                       (kernel tests), in that order, each log copied to $OUT as it finishes
#   scripts/device/cuda.sh uniform [tests|kernels|e2e|sanitize]  the packed uniform (RTN / GPTQ) kernels: tests, kernel
#                                       timings (the mixed-input GEMM beside dequantize + cuBLAS), 7B / 70B prefill, memcheck
#   scripts/device/cuda.sh quik [tests|kernels|e2e|e2e70b|sanitize|attention|gemv]  the QUIK kernels (every activation form): the same
#   scripts/device/cuda.sh serve [tests|fp16|anyprec|paged-tests|paged-load|mixed-tests]  continuous batching: GPU
#                                       tests, sanitizer, bench --serve load (paged-*: the paged KV cache's tests, the
#                                       load at concurrency 8 and 64, and a KV pool of half the reserved contexts;
#                                       mixed-tests: the mixed-width GEMV's tests, sanitizer and kernel benchmark)
#   scripts/device/cuda.sh spec [tests|7b|smollm2]  speculative decoding: GPU tests, 7B-shape step times, SmolLM2 acceptance
#   scripts/device/cuda.sh quik-smollm2 SmolLM2 QUIK W8A8 / W4A8 (and W4 with FP8 activations at load) quantized on the
#                                       GPU, full WikiText-2 perplexity on the GPU and on the CPU side by side (needs
#                                       the SmolLM2 GGUF staged: scripts/device/eval.sh stage over both parts)
set -uo pipefail
source "$(dirname "$0")/env.sh"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
# What the tests read: the staged subset of ../shared and the SmolLM2 GGUF (as the model cache lays it out).
export LOWBIT_SHARED_DIR="$LB/shared"
mkdir -p /tmp/lbcache/models && [ -f "$LB/smollm2.gguf" ] && ln -sf "$LB/smollm2.gguf" /tmp/lbcache/models/SmolLM2-135M-Instruct.Q4_1.gguf
export LOWBIT_CACHE=/tmp/lbcache
export LOWBIT_SOURCE_DIR="$PWD"   # the repository copy this command runs in (tests/fixtures)
case "${1:-}" in
  test)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/cuda-tests.txt"
    for t in "$LB"/pkg/test_cuda_*; do
      "$t" 2>&1 | tee -a "$OUT/cuda-tests.txt" | grep -E "^\[ |OK|FAILED|SKIPPED|Failure|budget|PASSED|Expected|Which|error" | head -80
    done
    ;;
  sanitize)
    : > "$OUT/cuda-sanitizer.txt"
    for t in "$LB"/pkg/test_cuda_*; do
      compute-sanitizer --tool memcheck --error-exitcode 9 "$t" "${@:2}" >> "$OUT/cuda-sanitizer.txt" 2>&1
      echo "compute-sanitizer $(basename "$t") exit: $?" | tee -a "$OUT/cuda-sanitizer.txt"
    done
    grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/cuda-sanitizer.txt" | head
    ;;
  bench)
    shift
    "$LB/pkg/lowbit" bench --kernels "$@" 2>&1 | tee "$OUT/bench-kernels.txt"
    ;;
  e2e)
    shift
    "$LB/pkg/lowbit" bench --e2e "$@" 2>&1 | tee "$OUT/bench-e2e.txt"
    ;;
  all)
    bash "$0" test
    bash "$0" bench
    bash "$0" e2e --model-shapes llama2-7b,llama3-8b
    bash "$0" sanitize --gtest_filter='CudaKernels.*'
    ;;
  uniform)   # [tests | kernels | e2e | sanitize]: the packed uniform (RTN / GPTQ) path. Above batch 8 the mixed-input
             # GEMM and dequantize + cuBLAS (LOWBIT_FUSED_GEMM=0) are timed in the same run
    phase="${2:-all}"
    if [ "$phase" = tests ] || [ "$phase" = all ]; then
      step uniform-tests 300 "$LB/pkg/test_cuda_kernels" --gtest_filter='CudaKernels.Uniform*:CudaKernels.Dequantize*:CudaKernels.LargeBatch*'
      step uniform-model 300 "$LB/pkg/test_cuda_model" --gtest_filter='CudaModel.GptqModelRunsPacked'
    fi
    if [ "$phase" = kernels ] || [ "$phase" = all ]; then
      step uniform-bench 400 "$LB/pkg/lowbit" bench --kernels --formats uniform --batch 1,8,16,64,128,512,1024,2048,4096 \
        --shapes 4096x4096,11008x4096,4096x11008,8192x8192,28672x8192,8192x28672
    fi
    if [ "$phase" = e2e ] || [ "$phase" = all ]; then
      step uniform-e2e-2048 300 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b --weights fp16,uniform-w4g128,uniform-w3g128 \
        --kernel-bits 4 --prefill 2048 --decode-batches 1,8
      step uniform-e2e-512 200 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b --weights fp16,uniform-w4g128 \
        --kernel-bits 4 --prefill 512 --decode-batches 1
      for p in 512 2048; do   # the same weights with dequantize + cuBLAS above batch 8
        step "uniform-e2e-dequant-$p" 200 env LOWBIT_FUSED_GEMM=0 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b \
          --weights uniform-w4g128 --kernel-bits 4 --prefill "$p" --decode-batches 1
      done
      for p in 512 2048; do
        step "uniform-e2e70b-$p" 300 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-70b --weights uniform-w4g128 \
          --kernel-bits 4 --prefill "$p" --decode-batches 1
      done
    fi
    if [ "$phase" = sanitize ] || [ "$phase" = all ]; then
      step uniform-sanitizer 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
        --gtest_filter='CudaKernels.UniformFused*'
    fi
    grep -hE "^# exit|PASSED|FAILED|ERROR SUMMARY|uniform w[34] g128 .*\*|^llama2-(7|70)b \| (fp16|uniform)" "$OUT"/uniform-*.txt | head -80
    ;;
  quik)      # [tests | kernels | e2e | e2e70b | sanitize]: QUIK on the GPU, every activation form. The fused CUTLASS
             # GEMM and the library GEMM + epilogue (LOWBIT_QUIK_FUSED=0) are timed in the same run
    phase="${2:-all}"
    SHAPES=4096x4096,11008x4096,4096x11008,8192x8192,28672x8192,8192x28672
    QW=quik-w8a8,quik-w4a8,quik-w4fp8
    if [ "$phase" = tests ] || [ "$phase" = all ]; then
      step quik-tests 400 "$LB/pkg/test_cuda_kernels" \
        --gtest_filter='CudaKernels.Quik*:CudaKernels.PrefillAttention*:CudaKernels.Attention*:CudaKernels.RefusesWhatItCannotRun'
      step quik-model 300 "$LB/pkg/test_cuda_model" --gtest_filter='CudaModel.QuikModelRunsOnTheGpu:CudaModel.DecodeAndBatch*:CudaModel.PagedCache*:CudaModel.TinyArch*:CudaModel.ContinuousBatch*:CudaModel.Stories260K*'
    fi
    if [ "$phase" = kernels ] || [ "$phase" = all ]; then
      step quik-bench 400 "$LB/pkg/lowbit" bench --kernels --formats quik --batch 1,8,16,128,512,2048,4096 --shapes "$SHAPES"
    fi
    if [ "$phase" = e2e ] || [ "$phase" = all ]; then
      # prefill 2048 with decode batch 1 and 8 (the per-row attention and each-linear quantization timed in the same
      # run), then prefill 512 with decode batch 1
      step quik-e2e-2048 420 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b --weights fp16,$QW,uniform-w4g128,uniform-w3g128 \
        --kernel-bits 4 --prefill 2048 --decode-batches 1,8
      step quik-e2e-512 200 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b --weights fp16,$QW,uniform-w4g128,uniform-w3g128 \
        --kernel-bits 4 --prefill 512 --decode-batches 1
      step e2e-512-anyprec 150 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b --weights anyprec,mixed24a \
        --kernel-bits 2,3,4,8 --prefill 512 --decode-batches 1
    fi
    if [ "$phase" = e2e70b ]; then   # fp16 70B does not fit one H200: the quantized forms only
      step quik-e2e70b-2048 330 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-70b --weights quik-w8a8,quik-w4a8,uniform-w4g128 \
        --kernel-bits 4 --prefill 2048 --decode-batches 1
      step quik-e2e70b-512 400 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-70b --weights $QW,uniform-w4g128,uniform-w3g128 \
        --kernel-bits 4 --prefill 512 --decode-batches 8
    fi
    if [ "$phase" = sanitize ] || [ "$phase" = all ]; then
      step quik-sanitizer 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
        --gtest_filter='CudaKernels.Quik*'
    fi
    if [ "$phase" = attention ]; then   # the o projection's input quantized inside attention: tests, memcheck, e2e
      step quik-attention-tests 200 "$LB/pkg/test_cuda_kernels" \
        --gtest_filter='CudaKernels.QuikAttention*:CudaKernels.QuikProducers*:CudaKernels.PrefillAttention*:CudaKernels.Attention*'
      step quik-attention-model 200 "$LB/pkg/test_cuda_model" \
        --gtest_filter='CudaModel.QuikModelRunsOnTheGpu:CudaModel.DecodeAndBatch*:CudaModel.PagedCache*:CudaModel.ContinuousBatch*'
      step quik-attention-sanitizer 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
        --gtest_filter='CudaKernels.QuikAttention*'
      step quik-attention-synccheck 200 compute-sanitizer --tool synccheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
        --gtest_filter='CudaKernels.QuikAttention*'
      # attention alone, with and without the sink, on the test's shapes (32 heads of 128 first): durations in ns
      step quik-attention-ncu 200 ncu --kernel-name regex:attention --launch-count 26 --metrics gpu__time_duration.sum \
        --csv "$LB/pkg/test_cuda_kernels" --gtest_filter='CudaKernels.QuikAttention*'
      step quik-attention-e2e-2048 300 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b --weights fp16,$QW \
        --kernel-bits 4 --prefill 2048 --decode-batches 1,8
      step quik-attention-e2e70b 300 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-70b --weights quik-w4a8 \
        --kernel-bits 4 --prefill 512 --decode-batches 1
    fi
    if [ "$phase" = gemv ]; then   # the integer GEMV's 16- and 32-code forms (LOWBIT_QUIK_GEMV_CHUNK) side by side
      step quik-gemv-tests 200 "$LB/pkg/test_cuda_kernels" --gtest_filter='CudaKernels.QuikMatchesIntegerReference'
      step quik-gemv-sanitizer 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_kernels" \
        --gtest_filter='CudaKernels.QuikMatchesIntegerReference'
      for c in 16 32; do
        LOWBIT_QUIK_GEMV_CHUNK=$c step quik-gemv-ncu-$c 200 ncu --kernel-name regex:quik_gemv --launch-count 400 \
          --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread \
          --csv "$LB/pkg/lowbit" bench --kernels --formats quik --batch 1,8 --iters 3 --shapes 4096x4096,11008x4096,4096x11008,8192x28672
        LOWBIT_QUIK_GEMV_CHUNK=$c step quik-gemv-bench-$c 200 "$LB/pkg/lowbit" bench --kernels --formats quik \
          --batch 1,2,4,8 --shapes "$SHAPES"
      done
      for c in 16 32; do
        LOWBIT_QUIK_GEMV_CHUNK=$c step quik-gemv-e2e-$c 300 "$LB/pkg/lowbit" bench --e2e --model-shapes llama2-7b \
          --weights anyprec,quik-w8a8,quik-w4a8 --kernel-bits 4 --prefill 512 --decode-batches 1,8
      done
    fi
    grep -hE "^# exit|PASSED|FAILED|ERROR SUMMARY|QUIK W[48].* \*|^llama2-(7|70)b \| (fp16|quik|uniform|anyprec)" "$OUT"/quik-*.txt | head -80
    ;;
  quik-smollm2)   # [quantize | cpu | cuda | all]: the phases can run on different GPUs / the CPU side by side
    M="$LB/smollm2.gguf"; W="$LB/data/wiki.test.raw"; C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
    [ -f "$M" ] || { echo "quik-smollm2: no staged SmolLM2 GGUF at $M"; exit 2; }
    phase="${2:-all}"
    RUNS=("w8a8|/tmp/sq-w8a8.lowbit|" "w4a8|/tmp/sq-w4a8.lowbit|" "w4fp8|/tmp/sq-w4a8.lowbit|--abits fp8")
    if [ "$phase" = quantize ] || [ "$phase" = all ]; then
      for wb in 8 4; do
        step "quik-smollm2-w${wb}a8-quantize" 200 "$LB/pkg/lowbit" quantize "$M" --method quik --wbits "$wb" --abits 8 \
          --calib "$C" --calib-samples 128 --calib-seqlen 512 --device cuda -o "/tmp/sq-w${wb}a8.lowbit"
      done
    fi
    if [ "$phase" = cpu ] || [ "$phase" = all ]; then   # the three CPU runs side by side, OMP_NUM_THREADS each
      for run in "${RUNS[@]}"; do
        IFS='|' read -r name file opt <<<"$run"
        step "quik-smollm2-$name-cpu" 560 "$LB/pkg/lowbit" ppl "$file" --text "$W" --device cpu $opt &
      done
      wait
    fi
    if [ "$phase" = cuda ] || [ "$phase" = all ]; then
      for run in "${RUNS[@]}"; do
        IFS='|' read -r name file opt <<<"$run"
        step "quik-smollm2-$name-cuda" 200 "$LB/pkg/lowbit" ppl "$file" --text "$W" --device cuda $opt
      done
    fi
    grep -hE "^# \$|perplexity|^# exit" "$OUT"/quik-smollm2-*.txt 2>/dev/null
    ;;
  serve)     # [tests | fp16 | anyprec]: continuous batching on the GPU: its tests and sanitizer, then the serving load
             # benchmark on the Llama-2-7B shape (fp16; any-precision 3 / 4 / 8 and their mix)
    phase="${2:-all}"
    if [ "$phase" = tests ] || [ "$phase" = all ]; then
      step serve-tests 300 "$LB/pkg/test_cuda_model" \
        --gtest_filter='CudaModel.SlotDecode*:CudaModel.ContinuousBatch*:CudaModel.GraphDecode*:CudaModel.WidthSwitch*:CudaModel.DecodeAndBatch*'
      step serve-sanitizer 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_model" \
        --gtest_filter='CudaModel.SlotDecode*:CudaModel.ContinuousBatch*'
    fi
    if [ "$phase" = paged-tests ]; then   # the paged KV cache: attention through block tables, preemption
      step paged-kernel-tests 200 "$LB/pkg/test_cuda_kernels" --gtest_filter='CudaKernels.Attention*'
      step paged-model-tests 300 "$LB/pkg/test_cuda_model" \
        --gtest_filter='CudaModel.SlotDecode*:CudaModel.ContinuousBatch*:CudaModel.Speculative*:CudaModel.DecodeAndBatch*'
      step paged-sanitizer 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_model" \
        --gtest_filter='CudaModel.ContinuousBatch*'
    fi
    if [ "$phase" = mixed-tests ]; then   # rows of different widths in one forward (anyprec_gemv_mixed)
      step mixed-kernel-tests 240 "$LB/pkg/test_cuda_mixed_width"
      step mixed-model-tests 300 "$LB/pkg/test_cuda_model" --gtest_filter='CudaModel.Mixed*:CudaModel.WidthSwitch*:CudaModel.SlotDecode*:CudaModel.ContinuousBatch*:CudaModel.Speculative*'
      step mixed-sanitizer 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_mixed_width" \
        --gtest_filter='CudaMixedWidth/AnyPrecMixedSweep.RowsMatchTheirWidth/3:CudaMixedWidth.GraphReplaysFollowNewWidths'
      step mixed-model-sanitizer 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_model" \
        --gtest_filter='CudaModel.Mixed*:CudaModel.ContinuousBatch*'
      step mixed-kernel-bench 200 "$LB/pkg/lowbit" bench --kernels --formats anyprec --kernel-bits 3,4,8 --batch 8 \
        --iters 50 --shapes 4096x4096,11008x4096,4096x11008,28672x8192
    fi
    if [ "$phase" = final ]; then   # the paged cache's and the mixed step's GPU tests, then the load at 8 and 64
      step final-tests 300 "$LB/pkg/test_cuda_model" \
        --gtest_filter='CudaModel.Mixed*:CudaModel.Paged*:CudaModel.SlotDecode*:CudaModel.ContinuousBatch*:CudaModel.Speculative*:CudaModel.WidthSwitch*'
      step final-sanitizer 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$LB/pkg/test_cuda_model" \
        --gtest_filter='CudaModel.Paged*:CudaModel.Mixed*:CudaModel.ContinuousBatch*'
      step final-kernel-tests 200 "$LB/pkg/test_cuda_kernels" --gtest_filter='CudaKernels.Attention*'
      step final-load-anyprec 330 "$LB/pkg/lowbit" bench --serve --model-shapes llama2-7b --weights anyprec \
        --kernel-bits 3,4,8 --concurrency 8,64
      step final-load-fp16 120 "$LB/pkg/lowbit" bench --serve --model-shapes llama2-7b --weights fp16 --concurrency 8,64
      step final-load-pool 120 "$LB/pkg/lowbit" bench --serve --model-shapes llama2-7b --weights fp16 --concurrency 64 \
        --kv-cache-gb 20
    fi
    if [ "$phase" = paged-load ]; then    # the load at concurrency 8 and 64 with every context reserved, then a
                                          # pool of about half that at concurrency 64
      step serve-load-paged-anyprec 330 "$LB/pkg/lowbit" bench --serve --model-shapes llama2-7b --weights anyprec \
        --kernel-bits 3,4,8 --concurrency 8,64
      step serve-load-paged-fp16 250 "$LB/pkg/lowbit" bench --serve --model-shapes llama2-7b --weights fp16 --concurrency 8,64
      step serve-load-paged-pool 250 "$LB/pkg/lowbit" bench --serve --model-shapes llama2-7b --weights fp16 \
        --concurrency 64 --kv-cache-gb 20
    fi
    for kind in fp16 anyprec; do
      if [ "$phase" = "$kind" ] || [ "$phase" = all ]; then
        step "serve-load-$kind" 560 "$LB/pkg/lowbit" bench --serve --model-shapes llama2-7b --weights "$kind" \
          --kernel-bits 3,4,8 --concurrency 1,8,32,64
      fi
    done
    grep -hE "^# exit|PASSED|FAILED|ERROR SUMMARY|^llama2-7b \|" "$OUT"/serve-*.txt | head -60
    ;;
  spec)      # [tests | 7b | smollm2]: speculative decoding: GPU tests; Llama-2-7B-shape step times and modelled speedup;
             # SmolLM2 any-precision 2..8 quantized on the GPU, acceptance and speed on WikiText-2 and C4 prompts
    phase="${2:-all}"
    if [ "$phase" = tests ] || [ "$phase" = all ]; then
      step spec-tests 300 "$LB/pkg/test_cuda_model" --gtest_filter='CudaModel.Speculative*:CudaModel.SlotDecode*'
    fi
    if [ "$phase" = 7b ] || [ "$phase" = all ]; then
      step spec-7b 300 "$LB/pkg/lowbit" bench --e2e --spec --model-shapes llama2-7b --kernel-bits 2,3,4
    fi
    if [ "$phase" = smollm2 ] || [ "$phase" = all ]; then
      M="$LB/smollm2.gguf"; W="$LB/data/wiki.test.raw"; C="$LB/data/c4-validation.calib-docs-0-511.jsonl"
      [ -f "$M" ] || { echo "spec: no staged SmolLM2 GGUF at $M"; exit 2; }
      step spec-smollm2-quantize 300 "$LB/pkg/lowbit" quantize "$M" --method anyprec --seed-bits 2 --widths 2,3,4,6,8 \
        --calib "$C" --device cuda -o /tmp/smol-ap.lowbit
      step spec-smollm2 400 "$LB/pkg/lowbit" bench /tmp/smol-ap.lowbit --draft-bits 2,3,4 --target-bits 6,8 \
        --spec-text "$W" --spec-text "$C" --spec-prompts 8 --decode 128 --device cuda
    fi
    grep -hE "^# exit|PASSED|FAILED|speculative on the GPU|^llama2-7b|\| [68]-bit \|" "$OUT"/spec-*.txt | head -60
    ;;
  *) echo "usage: $0 test | sanitize | bench [ARGS] | e2e [ARGS] | all | uniform | quik | quik-smollm2 | serve | spec" >&2; exit 2 ;;
esac
