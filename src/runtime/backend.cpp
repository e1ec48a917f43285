#include "runtime/backend.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/rss.h"
#include "formats/format_table.h"
#include "runtime/cpu_backend.h"

namespace lowbit {

Sequence::~Sequence() = default;
Decoder::~Decoder() = default;
BatchCache::~BatchCache() = default;

BatchCache::BatchCache(int slots, int capacity, int blocks, int block_size)
    : capacity_(capacity), block_(block_size), blocks_(blocks), tables_(static_cast<size_t>(std::max(slots, 0))) {
  LOWBIT_CHECK(slots >= 1 && capacity >= 1 && block_size >= 1 && blocks >= 1, "batch cache: ", slots, " slots of ",
               capacity, " positions, ", blocks, " blocks of ", block_size);
  for (auto& t : tables_) t.reserve(static_cast<size_t>(blocks_for(capacity)));
  free_.resize(static_cast<size_t>(blocks));
  for (int i = 0; i < blocks; ++i) free_[static_cast<size_t>(i)] = blocks - 1 - i;   // block 0 on top
}

size_t BatchCache::checked(int slot) const {
  LOWBIT_CHECK(slot >= 0 && slot < slots(), "batch cache: slot ", slot, " of ", slots());
  return static_cast<size_t>(slot);
}

bool BatchCache::reserve(int slot, int positions) {
  std::vector<int32_t>& t = tables_[checked(slot)];
  LOWBIT_CHECK(positions >= 0 && positions <= capacity_, "batch cache: ", positions, " positions exceed the ",
               capacity_, " of a sequence");
  const size_t need = static_cast<size_t>(blocks_for(positions));
  if (need <= t.size()) return true;
  if (need - t.size() > free_.size()) return false;
  while (t.size() < need) {
    t.push_back(free_.back());
    free_.pop_back();
  }
  table_changed(slot);
  return true;
}

void BatchCache::clear(int slot) {
  set_length(slot, 0);
  std::vector<int32_t>& t = tables_[checked(slot)];
  if (t.empty()) return;
  while (!t.empty()) {
    free_.push_back(t.back());
    t.pop_back();
  }
  table_changed(slot);
}

void BatchCache::truncate(int slot, int length) {
  const int len = this->length(slot);
  LOWBIT_CHECK(length >= 0 && length <= len, "batch cache: truncate slot ", slot, " to ", length, " of ", len);
  set_length(slot, length);
}

void BatchCache::check_room(int slot, int positions) const {
  LOWBIT_CHECK(positions <= reserved(slot), "batch cache: slot ", slot, " needs ", positions, " positions and has ",
               reserved(slot), " reserved (BatchCache::reserve first)");
}
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
