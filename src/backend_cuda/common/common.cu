#include "backend_cuda/common/common.h"

#include "core/knobs.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "backend_cuda/common/launch.cuh"

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

bool sm90a_available() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;   // sm_90a code runs on compute capability 9.0 only
  }();
  return ok;
}

bool sm90_or_newer() {
  static const bool ok = [] {
    int dev = 0, major = 0;
    LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  return ok;
}

namespace {
bool pdl_supported() { return sm90_or_newer(); }   // griddepcontrol and the launch attribute
}  // namespace

namespace {
struct PdlState {
  bool on;
  unsigned mask;
};
static_assert(kPdlDefault == 0x47, "LOWBIT_PDL_MASK's default in core/knobs.cpp must equal kPdlDefault");
PdlState& pdl_state() {   // from the knobs on first use
  static PdlState st{pdl_supported() && knob_bool(Knob::Pdl), static_cast<unsigned>(knob_int(Knob::PdlMask))};
  return st;
}
}  // namespace

bool pdl_enabled(unsigned cls) {
  const PdlState& st = pdl_state();
  return st.on && (st.mask & cls) != 0;
}

void set_pdl(bool on) { pdl_state().on = on && pdl_supported(); }
void set_pdl_mask(unsigned mask) { pdl_state().mask = mask; }
unsigned pdl_mask() { return pdl_state().mask; }

}  // namespace lowbit::cuda
