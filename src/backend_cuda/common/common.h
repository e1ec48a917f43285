// The CUDA backend's plumbing: error checks that become one-line lowbit::Error messages, an owning device buffer,
// and the device query the CLI and the GPU tests use to decide (out loud) whether a GPU is there.
// Compiled only when the CUDA toolkit is found (LOWBIT_WITH_CUDA); this header is plain C++ plus the runtime API.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace lowbit::cuda {

[[noreturn]] void fail_cuda(cudaError_t e, const char* what, const char* file, int line);

#define LOWBIT_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    const cudaError_t lowbit_cuda_err_ = (expr);                                             \
    if (lowbit_cuda_err_ != cudaSuccess) ::lowbit::cuda::fail_cuda(lowbit_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// True when a usable CUDA device is present; otherwise false and *why says what is missing (no driver, no device).
bool device_available(std::string* why = nullptr);
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" for the current device.
std::string device_name();
// Multiprocessors of the current device.
int device_sm_count();
bool sm90_or_newer();   // the current device is Hopper or newer (PDL, thread-block clusters)
// The current device runs sm_90a code (compute capability 9.0 exactly): the wgmma kernels, built for sm_90a alone.
bool sm90a_available();
// Whether kernels of the decode chain are launched with programmatic dependent launch (cuda/launch.cuh): the device
// is sm_90+ and LOWBIT_PDL is not "0". set_pdl() overrides it (on only where supported): benchmarks time the decode
// step both ways in one run, tests compare the two. A captured CUDA graph keeps the mode it was captured in.
// Kernel classes (a mask): which launches take the attribute; LOWBIT_PDL_MASK in the environment replaces the default.
enum PdlClass : unsigned {
  kPdlOps = 1,        // norms, RoPE, attention, SwiGLU, argmax, conversions (gpu_ops.cu, packed.cu)
  kPdlXfrag = 2,      // the activation-fragment kernels before the tensor-core GEMVs
  kPdlRegLut = 4,     // any-precision register-table tensor-core GEMV
  kPdlTcTable = 8,    // any-precision shared-table tensor-core GEMV
  kPdlScalar = 16,    // any-precision CUDA-core GEMVs and the outlier SpMV
  kPdlMixed = 32,     // 2/4/16 GEMVs
  kPdlDense = 64,     // the fp16 dense GEMV (dense_gemv.cu)
  kPdlAll = 127,
  // The default, from `lowbit bench --e2e` on the H100: with the shared-table tensor-core
  // GEMV also PDL-launched, any-precision 4-bit decode at batch 8 fell from 1,289 to 901 tokens/s; with the 2/4/16
  // GEMVs, 2/4/16 batch 1 from 232 to 216; the CUDA-core GEMVs gained nothing.
  kPdlDefault = kPdlOps | kPdlXfrag | kPdlRegLut | kPdlDense,
};
bool pdl_enabled(unsigned cls = kPdlAll);
void set_pdl(bool on);
void set_pdl_mask(unsigned mask);
unsigned pdl_mask();
// The classes launched with PDL now (the mask, or 0 when PDL is off): what a captured graph must be keyed on.
inline unsigned pdl_launch_classes() { return pdl_enabled() ? pdl_mask() : 0u; }


// A run-time value (a width, a batch, rows per warp) picking a kernel instantiation: calls
// f(std::integral_constant<int, v>{}) for the one v among Values equal to `value`, and returns whether there was one
// (nothing is called otherwise).
template <int... Values, typename F>
bool dispatch_int(int value, F&& f) {
  return ((value == Values && (f(std::integral_constant<int, Values>{}), true)) || ...);
}

// An owning, move-only device allocation of `count` elements of T (uninitialised).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0) LOWBIT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), count_ * sizeof(T)));
  }
  DeviceBuffer(const T* host, size_t count) : DeviceBuffer(count) { upload(host, count); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.data(), host.size()) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  void upload(const T* host, size_t count) {
    LOWBIT_CHECK(count <= count_, "DeviceBuffer: upload of ", count, " elements into ", count_);
    if (count > 0) LOWBIT_CUDA_CHECK(cudaMemcpy(ptr_, host, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(count_);
    if (count_ > 0) LOWBIT_CUDA_CHECK(cudaMemcpy(h.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  void release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
  }
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

}  // namespace lowbit::cuda
