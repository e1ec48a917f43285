#include "runtime/backend.h"

#include <chrono>

#include "core/error.h"
#include "core/rss.h"
#include "formats/format_table.h"
#include "runtime/cpu_backend.h"

namespace lowbit {

Sequence::~Sequence() = default;
Decoder::~Decoder() = default;
BatchCache::~BatchCache() = default;
Backend::~Backend() = default;

const char* device_option_name(Device d) {
  switch (d) {
    case Device::Auto: return "auto";
    case Device::Cpu: return "cpu";
    case Device::Cuda: return "cuda";
  }
  return "?";
}

std::unique_ptr<Backend> open_cpu_backend(WeightSet ws, const BackendOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadStats stats;
  stats.anon_rss_before_bytes = anon_rss_bytes();
  std::unique_ptr<Model> model = Model::load(std::move(ws));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const RssSnapshot after = read_rss();
  stats.peak_anon_rss_bytes = std::max(stats.anon_rss_before_bytes, after.anon_bytes);
  stats.vm_hwm_bytes = after.peak_rss_bytes;
  return std::make_unique<CpuBackend>(std::move(model), opts, stats);
}

std::string first_cpu_only_weight(const WeightSet& ws) {
  for (const auto& [name, pw] : ws.packed)
    if (gpu_refusal(pw) != nullptr) return name;
  return "";
}

std::unique_ptr<Backend> open_backend_with(const std::string& path, const BackendOptions& opts,
                                           const CudaBackendHooks* cuda) {
  if (opts.device == Device::Cuda) {
    LOWBIT_CHECK(cuda != nullptr, "--device cuda: this lowbit was built without CUDA");
    LOWBIT_CHECK(!opts.reference, "--device cuda: the reference forward (--reference) runs on the CPU");
    std::string why;
    LOWBIT_CHECK(cuda->available(&why), "--device cuda: ", why);
  }
  WeightSet ws = read_weights(path, opts.load);
  const std::string cpu_only = first_cpu_only_weight(ws);
  bool gpu = false;
  if (opts.device == Device::Cuda) {
    if (!cpu_only.empty()) {
      const PackedWeight& pw = ws.packed.at(cpu_only);
      fail("--device cuda: ", path, ": ", cpu_only, " is stored as ", format_name(pw.format), ", and ", gpu_refusal(pw),
           " (--device cpu runs it)");
    }
    gpu = true;
  } else if (opts.device == Device::Auto) {
    gpu = cuda != nullptr && !opts.reference && cpu_only.empty() && cuda->available(nullptr);
  }
  if (gpu) return cuda->open(std::move(ws), opts);
  return open_cpu_backend(std::move(ws), opts);
}

#ifndef LOWBIT_WITH_CUDA
// A build without CUDA: the CPU is the only device (the CUDA build defines open_backend in
// backend_cuda/model/cuda_backend.cu, passing its hooks).
std::unique_ptr<Backend> open_backend(const std::string& path, const BackendOptions& opts) {
  return open_backend_with(path, opts, nullptr);
}
#endif

}  // namespace lowbit
