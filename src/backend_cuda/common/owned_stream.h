// A non-blocking CUDA stream owned for one scope (created on construction, destroyed with it): the quantizer's
// passes and workers each run on their own.
#pragma once
#include <cuda_runtime.h>

#include "backend_cuda/common/common.h"

namespace lowbit::cuda {

class OwnedStream {
 public:
  OwnedStream() { LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~OwnedStream() { cudaStreamDestroy(s_); }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace lowbit::cuda
