// `lowbit bench --kernels`: the GPU kernels beside cuBLAS fp16 timed in the same run (CUDA events, medians,
// weights rotated through enough copies to defeat the L2), with the achieved weight bandwidth as a fraction of a
// device-to-device copy measured first. Random packed data of the real layouts (content does not change the work).
#pragma once
#include <cstdint>
#include <ostream>
#include <utility>
#include <vector>

namespace lowbit::cuda {

struct KernelBenchOptions {
  std::vector<std::pair<int64_t, int64_t>> shapes;   // (n, k): n outputs, k inputs
  std::vector<int> bits;                              // any-precision widths
  std::vector<int> batches;
  int iters = 50;
  double outlier_frac = 0.0035;                       // mixed24a fp16 outliers (fraction of weights)
  bool anyprec = true, mixed24a = true, fp16 = true;   // fp16: our dense GEMV beside cuBLAS (batch <= 8)
  bool uniform = true;                                 // uniform w4 / w8 / w3 g128 (RTN / GPTQ)
  bool quik = true;                                    // QUIK W4A8 / W8A8, k / 16 outlier columns
};

void run_kernel_bench(const KernelBenchOptions& o, std::ostream& out);

}  // namespace lowbit::cuda
