// Any-precision quantization (Park et al., ICML 2024) of one linear weight on the GPU: the device twin of
// anyprec_quantize (quantize/anyprec.h), which is its reference and its test oracle (tests/test_anyprec_gpu.cpp).
// Both run the same per-row core (quantize/anyprec_row.h: k-means seed, fp16 centroids, nearest-centroid assignment,
// exact 2-means splits), so the result is the CPU's bit for bit: codes, every LUT, the outlier CSR.
// Device steps (anyprec_gpu.cu has the design block): outlier selection by an exact threshold search over the
// sensitivities; a stable segmented sort of every row by value; one thread per row running the shared core on
// global-memory scratch, rows in chunks that bound the scratch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/anyprec/layout.h"
#include "quantize/anyprec.h"

namespace lowbit::cuda {

// w, sensitivity: device [n, k] fp32, left unchanged. Same options and checks as anyprec_quantize (plus n · k < 2^62
// and k < 2^31); the result equals anyprec_quantize's exactly. Synchronises `stream` before it returns.
AnyPrecQuantized anyprec_quantize_gpu(const float* w, const float* sensitivity, int64_t n, int64_t k,
                                      const AnyPrecOptions& o, cudaStream_t stream);

}  // namespace lowbit::cuda
