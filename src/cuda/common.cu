#include "cuda/common.h"

#include <sstream>

namespace lowbit::cuda {

void fail_cuda(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA error: ", cudaGetErrorString(e), " (", what, " at ", file, ":", line, ")");
}

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = std::string("no usable CUDA driver/device: ") + cudaGetErrorString(e);
    cudaGetLastError();   // clear the sticky error so later calls are not poisoned
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "no CUDA device present";
    return false;
  }
  return true;
}

std::string device_name() {
  int dev = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  LOWBIT_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  std::ostringstream os;
  os.precision(1);
  os << p.name << " (sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, " << std::fixed
     << static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0) << " GiB)";
  return os.str();
}

int device_sm_count() {
  int dev = 0, sms = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

}  // namespace lowbit::cuda
