// Process-wide settings and what this build and machine offer.
#pragma once
#include <string>

namespace lowbit::api {

// CPU threads for the forward pass, quantization and BLAS (OpenMP + OpenBLAS share one pool). n >= 1; the default
// is every core. Process-wide: it applies to every Model and to quantize().
void set_cpu_threads(int n);

// Whether this lowbit was compiled with its CUDA backend.
bool built_with_cuda();
// Whether a usable GPU is present; when not, *why (if given) says why in one line ("no CUDA device", "this lowbit was
// built without CUDA", ...).
bool cuda_available(std::string* why = nullptr);
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)", or "" when cuda_available() is false.
std::string cuda_device_name();

}  // namespace lowbit::api
