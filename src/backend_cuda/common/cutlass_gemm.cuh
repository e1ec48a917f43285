// What every CUTLASS 3 GEMM of the backend does around its kernel (quik_fused.cu, uniform_fused.cu): the device's SM
// count for the persistent tile scheduler, queried once per device rather than per call, and the checked sequence
// can_implement -> initialize -> run, each failure one line naming the GEMM and its shape.
// Included only by the sm_90a sources built with CUTLASS (LOWBIT_WITH_CUTLASS).
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "backend_cuda/common/common.h"
#include "core/error.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"

namespace lowbit::cuda {

template <class Kernel>
cutlass::KernelHardwareInfo cutlass_hardware_info() {
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex mu;
  static std::map<int, cutlass::KernelHardwareInfo> known;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(dev);
  if (it == known.end()) it = known.emplace(dev, cutlass::KernelHardwareInfo::make_kernel_hardware_info<Kernel>(dev)).first;
  return it->second;
}

// The backend's GEMM orientation: A the weights [n, k] K-major, B the tokens [m, k] K-major, D the output y [m, n]
// row-major, which is the GEMM's column-major [n, m] (M = n, N = m).
template <class GemmKernel>
struct WeightsTokensStrides {
  typename GemmKernel::StrideA a;
  typename GemmKernel::StrideB b;
  typename GemmKernel::StrideD d;
};
template <class GemmKernel>
WeightsTokensStrides<GemmKernel> weights_tokens_strides(int64_t M, int64_t N, int64_t K) {
  return {{K, cute::_1{}, M * K}, {K, cute::_1{}, N * K}, {cute::_1{}, M, M * N}};
}

// `what` names the GEMM and its shape in the one-line errors.
template <class Gemm>
void cutlass_run(const typename Gemm::Arguments& args, void* ws, size_t ws_bytes, cudaStream_t st, const std::string& what) {
  LOWBIT_CHECK(Gemm::get_workspace_size(args) <= ws_bytes, what, ": workspace of ", ws_bytes, " bytes");
  Gemm gemm;
  LOWBIT_CHECK(gemm.can_implement(args) == cutlass::Status::kSuccess, what, " is not implementable");
  LOWBIT_CHECK(gemm.initialize(args, ws, st) == cutlass::Status::kSuccess, what, ": initialize failed");
  LOWBIT_CHECK(gemm.run(st) == cutlass::Status::kSuccess, what, ": launch failed");
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
