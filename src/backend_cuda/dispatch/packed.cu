// DevicePackedWeight (parts uploaded as stored), the large-batch path (dequantize + cuBLAS) and the dispatcher.
#include "backend_cuda/dispatch/packed.h"

#include "core/knobs.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend_cuda/anyprec/int8_tables.h"
#include "backend_cuda/common/launch.cuh"
#include "formats/anyprec/layout.h"
#include "formats/format_table.h"
#include "formats/mixed24a/layout.h"

namespace lowbit::cuda {

void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error ", static_cast<int>(st), " (", cublasGetStatusString(st), ") in ", what);
}

DevicePackedWeight::DevicePackedWeight(const PackedWeight& w)
    : format_(w.format), n_(w.shape.at(0)), k_(w.shape.at(1)), params_(w.params) {
  LOWBIT_CHECK(packed_format(format_).gpu == GpuSupport::Packed, "CUDA backend: packed format '", format_name(format_),
               "' has no GPU kernel yet (anyprec and mixed24a do; QUIK models run with --device cpu)");
  for (const auto& [name, view] : w.parts) parts_.emplace(name, DeviceBuffer<uint8_t>(view.data, view.nbytes));
  if (format_ == FormatId::AnyPrec) derive_int8_tables();
}

const uint8_t* DevicePackedWeight::part(const std::string& name) const {
  const auto it = parts_.find(name);
  LOWBIT_CHECK(it != parts_.end(), "CUDA backend: packed ", format_name(format_), " weight lacks part '", name, "'");
  return it->second.get();
}

uint32_t DevicePackedWeight::served_widths() const {
  return format_ == FormatId::AnyPrec ? static_cast<uint32_t>(params_.at("widths")) : 0u;
}

uint64_t DevicePackedWeight::bytes() const {
  uint64_t b = 0;
  for (const auto& [name, buf] : parts_) b += buf.bytes();
  return b;
}

uint64_t DevicePackedWeight::bytes_read(int bits) const {
  if (format_ != FormatId::AnyPrec) return bytes();
  const auto has = [&](const std::string& p) { return parts_.count(p) ? parts_.at(p).bytes() : 0; };
  const int planes = static_cast<int>(params_.at("planes"));
  return has("planes") / static_cast<uint64_t>(planes) * static_cast<uint64_t>(bits) + has("lut" + std::to_string(bits)) +
         outlier_bytes();
}

uint64_t DevicePackedWeight::outlier_bytes() const {
  uint64_t b = 0;
  for (const char* p : {"outlier_rowptr", "outlier_col", "outlier_val"})
    if (parts_.count(p)) b += parts_.at(p).bytes();
  return b;
}

template <typename View>
void DevicePackedWeight::view_outliers(View& d) const {
  if (params_.at("sparse") != 1) return;
  d.nnz = params_.at("nnz");
  d.rowptr = reinterpret_cast<const int32_t*>(part("outlier_rowptr"));
  d.col = reinterpret_cast<decltype(d.col)>(part("outlier_col"));   // int32 (anyprec) or uint16 (mixed24a) columns
  d.val = reinterpret_cast<const __half*>(part("outlier_val"));
}

AnyPrecDevice DevicePackedWeight::anyprec() const {
  LOWBIT_CHECK(format_ == FormatId::AnyPrec, "CUDA backend: an anyprec view of a ", format_name(format_), " weight");
  AnyPrecDevice d;
  d.n = n_;
  d.k = k_;
  d.words = anyprec_words_per_row(k_);
  d.planes = static_cast<int>(params_.at("planes"));
  d.widths = static_cast<uint32_t>(params_.at("widths"));
  d.plane_data = reinterpret_cast<const uint32_t*>(part("planes"));
  for (int b = kAnyPrecMinBits; b <= d.planes; ++b)
    if ((d.widths >> b) & 1u) d.lut[b] = reinterpret_cast<const __half*>(part("lut" + std::to_string(b)));
  for (int b = kAnyPrecMinBits; b <= 4 && b <= d.planes; ++b)
    if ((d.widths >> b) & 1u) {
      d.lut8[b] = reinterpret_cast<const int8_t*>(part("derived_lut8_" + std::to_string(b)));
      d.lut8_scale[b] = reinterpret_cast<const float*>(part("derived_lut8s_" + std::to_string(b)));
      if (b == 4) d.lut8_lo4 = reinterpret_cast<const int8_t*>(part("derived_lut8lo_4"));
    }
  view_outliers(d);
  return d;
}

Mixed24ADevice DevicePackedWeight::mixed24a() const {
  LOWBIT_CHECK(format_ == FormatId::Mixed24A, "CUDA backend: a mixed24a view of a ", format_name(format_), " weight");
  Mixed24ADevice d;
  d.n = n_;
  d.k = k_;
  d.perm = reinterpret_cast<const uint16_t*>(part("perm"));
  d.qa = reinterpret_cast<const uint4*>(part("qa"));
  d.qb = reinterpret_cast<const uint32_t*>(part("qb"));
  d.meta2 = reinterpret_cast<const uint16_t*>(part("meta2"));
  d.meta4 = part("meta4");
  d.ss2 = reinterpret_cast<const __half*>(part("ss2"));
  d.sm2 = reinterpret_cast<const __half*>(part("sm2"));
  d.ss4 = reinterpret_cast<const __half*>(part("ss4"));
  d.sm4 = reinterpret_cast<const __half*>(part("sm4"));
  view_outliers(d);
  return d;
}

namespace {
__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ float unit_random(uint64_t seed, int64_t i) {   // [0, 1)
  return static_cast<float>(splitmix(seed * 0x100000001ull + static_cast<uint64_t>(i)) >> 40) * 0x1p-24f;
}
__global__ void fill_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = static_cast<uint8_t>(splitmix(seed * 0x100000001ull + static_cast<uint64_t>(i)));
}
__global__ void fill_half_kernel(__half* p, int64_t n, uint64_t seed, float lo, float hi) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = __float2half_rn(lo + (hi - lo) * unit_random(seed, i));
}
__global__ void fill_float_kernel(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = lo + (hi - lo) * unit_random(seed, i);
}
unsigned grid_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }
__global__ void f32_to_f16_kernel(const float* __restrict__ in, __half* __restrict__ out, int64_t count) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2half_rn(in[i]);
}
// One row's int8 table per thread (int8_tables.h), rows n .. n16 - 1 zero; lo: the second pieces (4 bits), or null.
// 4 bits: both pieces stored in i8_split16's form.
template <int E>
__global__ void int8_tables_kernel(const __half* __restrict__ lut, int64_t n, int64_t n16, int8_t* __restrict__ q,
                                   float* __restrict__ scale, int8_t* __restrict__ lo) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= n16) return;
  float c[E];
  int8_t t[E], u[E];
#pragma unroll
  for (int e = 0; e < E; ++e) c[e] = r < n ? __half2float(lut[r * E + e]) : 0.0f;
  scale[r] = lo != nullptr ? i8_table_row2(c, E, t, u) : i8_table_row(c, E, t);
  if constexpr (E == 16) {   // both pieces in the GEMV's two-PRMT form
    int8_t v[E];
    i8_split16(t, v);
    i8_split16(u, t);
#pragma unroll
    for (int e = 0; e < E; ++e) u[e] = t[e], t[e] = v[e];
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    q[r * E + e] = t[e];
    if (lo != nullptr) lo[r * E + e] = u[e];
  }
}
}  // namespace

void DevicePackedWeight::derive_int8_tables() {
  const int planes = static_cast<int>(params_.at("planes"));
  const uint32_t widths = static_cast<uint32_t>(params_.at("widths"));
  const int64_t n16 = (n_ + 15) / 16 * 16;
  for (int b = kAnyPrecMinBits; b <= 4 && b <= planes; ++b) {
    if (((widths >> b) & 1u) == 0) continue;
    const std::string tb = "derived_lut8_" + std::to_string(b), sb = "derived_lut8s_" + std::to_string(b);
    parts_.erase(tb);
    parts_.erase(sb);
    parts_.erase("derived_lut8lo_4");
    auto& q = parts_.emplace(tb, DeviceBuffer<uint8_t>(static_cast<size_t>(n16 << b))).first->second;
    auto& sc = parts_.emplace(sb, DeviceBuffer<uint8_t>(static_cast<size_t>(4 * n16))).first->second;
    const auto* lut = reinterpret_cast<const __half*>(part("lut" + std::to_string(b)));
    auto* qp = reinterpret_cast<int8_t*>(q.get());
    auto* sp = reinterpret_cast<float*>(sc.get());
    if (b == 2) int8_tables_kernel<4><<<grid_for(n16), 256>>>(lut, n_, n16, qp, sp, nullptr);
    else if (b == 3) int8_tables_kernel<8><<<grid_for(n16), 256>>>(lut, n_, n16, qp, sp, nullptr);
    else {
      auto& lo = parts_.emplace("derived_lut8lo_4", DeviceBuffer<uint8_t>(static_cast<size_t>(n16 << 4))).first->second;
      int8_tables_kernel<16><<<grid_for(n16), 256>>>(lut, n_, n16, qp, sp, reinterpret_cast<int8_t*>(lo.get()));
    }
    LOWBIT_CUDA_CHECK(cudaGetLastError());
  }
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));   // the tables are complete before any stream's GEMV reads them
}

void fill_random_bytes(void* p, int64_t nbytes, uint64_t seed, cudaStream_t s) {
  if (nbytes > 0) fill_bytes_kernel<<<grid_for(nbytes), 256, 0, s>>>(static_cast<uint8_t*>(p), nbytes, seed);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}
void fill_random_half(__half* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t s) {
  if (count > 0) fill_half_kernel<<<grid_for(count), 256, 0, s>>>(p, count, seed, lo, hi);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}
void fill_random_float(float* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t s) {
  if (count > 0) fill_float_kernel<<<grid_for(count), 256, 0, s>>>(p, count, seed, lo, hi);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

DevicePackedWeight DevicePackedWeight::random_anyprec(int64_t n, int64_t k, uint64_t seed) {
  LOWBIT_CHECK(k % 32 == 0, "random anyprec weight: k = ", k, " is not a multiple of 32");
  DevicePackedWeight w;
  w.format_ = FormatId::AnyPrec;
  w.n_ = n;
  w.k_ = k;
  w.params_ = {{"planes", 8}, {"widths", 0x1FC}, {"sparse", 0}, {"nnz", 0}};
  auto& planes = w.parts_.emplace("planes", DeviceBuffer<uint8_t>(static_cast<size_t>(8 * n * k / 8))).first->second;
  fill_random_bytes(planes.get(), static_cast<int64_t>(planes.bytes()), seed);
  for (int b = 2; b <= 8; ++b) {
    auto& lut = w.parts_.emplace("lut" + std::to_string(b), DeviceBuffer<uint8_t>(static_cast<size_t>(2 * (n << b)))).first->second;
    fill_random_half(reinterpret_cast<__half*>(lut.get()), n << b, seed + static_cast<uint64_t>(b), -0.05f, 0.05f);
  }
  w.derive_int8_tables();
  return w;
}

std::unique_ptr<DevicePackedWeight> DevicePackedWeight::concat_rows(const std::vector<const DevicePackedWeight*>& ws) {
  if (ws.empty() || ws[0]->format_ != FormatId::AnyPrec) return nullptr;
  const DevicePackedWeight& f = *ws[0];
  int64_t N = 0;
  // The parts are read with cudaMemcpy on the legacy stream: the caller has synchronised whatever wrote them.
  for (const DevicePackedWeight* w : ws) {
    if (w->format_ != FormatId::AnyPrec || w->k_ != f.k_ || w->parts_.size() != f.parts_.size()) return nullptr;
    for (const auto& [name, buf] : f.parts_)
      if (w->parts_.count(name) == 0) return nullptr;
    for (const char* p : {"planes", "widths", "sparse"})
      if (w->params_.at(p) != f.params_.at(p)) return nullptr;
    for (const auto& [name, buf] : w->parts_)
      if (name != "planes" && name.rfind("lut", 0) != 0 && name.rfind("outlier_", 0) != 0 && name.rfind("derived_", 0) != 0)
        return nullptr;   // unknown part
    N += w->n_;
  }
  std::unique_ptr<DevicePackedWeight> out(new DevicePackedWeight());
  out->format_ = FormatId::AnyPrec;
  out->n_ = N;
  out->k_ = f.k_;
  out->params_ = f.params_;
  const int64_t P = f.params_.at("planes"), row_bytes = anyprec_words_per_row(f.k_) * 4;
  auto copy = [](uint8_t* dst, const uint8_t* src, int64_t bytes) {
    if (bytes > 0) LOWBIT_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice));
  };
  DeviceBuffer<uint8_t> planes(static_cast<size_t>(P * N * row_bytes));
  for (int64_t p = 0, done = 0; p < P; ++p, done = 0)
    for (const DevicePackedWeight* w : ws) {
      copy(planes.get() + (p * N + done) * row_bytes, w->part("planes") + p * w->n_ * row_bytes, w->n_ * row_bytes);
      done += w->n_;
    }
  out->parts_.emplace("planes", std::move(planes));
  for (const auto& [name, buf] : f.parts_) {   // per-row LUTs and the outliers' columns / values: concatenated
    if (name == "planes" || name == "outlier_rowptr" || name.rfind("derived_", 0) == 0) continue;
    size_t total = 0;
    for (const DevicePackedWeight* w : ws) total += w->parts_.at(name).bytes();
    DeviceBuffer<uint8_t> cat(total);
    size_t at = 0;
    for (const DevicePackedWeight* w : ws) {
      copy(cat.get() + at, w->part(name), static_cast<int64_t>(w->parts_.at(name).bytes()));
      at += w->parts_.at(name).bytes();
    }
    out->parts_.emplace(name, std::move(cat));
  }
  if (f.params_.at("sparse") == 1) {   // row pointers shifted by the entries of the weights before
    std::vector<int32_t> rowptr(1, 0);
    for (const DevicePackedWeight* w : ws) {
      std::vector<int32_t> r(static_cast<size_t>(w->n_ + 1));
      LOWBIT_CUDA_CHECK(cudaMemcpy(r.data(), w->part("outlier_rowptr"), r.size() * 4, cudaMemcpyDeviceToHost));
      const int32_t base = rowptr.back();
      LOWBIT_CHECK(r[0] == 0 && static_cast<int64_t>(base) + r.back() < (int64_t{1} << 31),
                   "concat_rows: outlier row pointers do not start at 0 or overflow int32");
      for (size_t i = 1; i < r.size(); ++i) rowptr.push_back(base + r[i]);
    }
    out->params_["nnz"] = rowptr.back();
    out->parts_.emplace("outlier_rowptr", DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(rowptr.data()), rowptr.size() * 4));
  }
  out->derive_int8_tables();
  return out;
}

DevicePackedWeight DevicePackedWeight::random_mixed24a(int64_t n, int64_t k, double outlier_frac, uint64_t seed) {
  LOWBIT_CHECK(k % 64 == 0, "random mixed24a weight: k = ", k, " is not a multiple of 64");
  const int64_t U = k / 64, G = k / 16, RG = (n + 15) / 16;
  DevicePackedWeight w;
  w.format_ = FormatId::Mixed24A;
  w.n_ = n;
  w.k_ = k;
  std::vector<uint16_t> perm(static_cast<size_t>(G));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<uint32_t>(seed)));
  w.parts_.emplace("perm", DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(perm.data()), perm.size() * 2));
  uint64_t sd = seed;
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, int64_t>>{
           {"qa", 16 * n * U}, {"qb", 4 * n * U}, {"meta2", 2 * n * U}, {"meta4", n * U}}) {
    auto& b = w.parts_.emplace(name, DeviceBuffer<uint8_t>(static_cast<size_t>(bytes))).first->second;
    fill_random_bytes(b.get(), bytes, ++sd);
  }
  for (const auto& [name, count, lo, hi] : std::vector<std::tuple<std::string, int64_t, float, float>>{
           {"ss2", RG * 3 * U, 1e-4f, 1e-3f}, {"sm2", RG * 3 * U, 1e-3f, 2e-3f},
           {"ss4", RG * U, 1e-4f, 1e-3f}, {"sm4", RG * U, 1e-3f, 2e-3f}}) {
    auto& b = w.parts_.emplace(name, DeviceBuffer<uint8_t>(static_cast<size_t>(2 * count))).first->second;
    fill_random_half(reinterpret_cast<__half*>(b.get()), count, ++sd, lo, hi);
  }
  const int64_t per_row = static_cast<int64_t>(outlier_frac * static_cast<double>(k) + 0.5);
  w.params_ = {{"sparse", per_row > 0 ? 1 : 0}, {"nnz", n * per_row}};
  if (per_row > 0) {   // the same count in every row, one column drawn in each of per_row equal stretches of the row
    std::vector<int32_t> rp(static_cast<size_t>(n + 1));
    for (int64_t r = 0; r <= n; ++r) rp[static_cast<size_t>(r)] = static_cast<int32_t>(r * per_row);
    std::vector<uint16_t> col(static_cast<size_t>(n * per_row));
    std::mt19937 rng(static_cast<uint32_t>(seed + 99));
    const int64_t stretch = k / per_row;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < per_row; ++i)
        col[static_cast<size_t>(r * per_row + i)] = static_cast<uint16_t>(i * stretch + static_cast<int64_t>(rng() % static_cast<uint32_t>(stretch)));
    w.parts_.emplace("outlier_rowptr", DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(rp.data()), rp.size() * 4));
    w.parts_.emplace("outlier_col", DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(col.data()), col.size() * 2));
    auto& v = w.parts_.emplace("outlier_val", DeviceBuffer<uint8_t>(static_cast<size_t>(2 * n * per_row))).first->second;
    fill_random_half(reinterpret_cast<__half*>(v.get()), n * per_row, ++sd, -0.1f, 0.1f);
  }
  return w;
}

Mixed24ADevice DevicePackedWeight::mixed24a_dense() const {
  Mixed24ADevice d = mixed24a();
  d.rowptr = nullptr;
  d.col = nullptr;
  d.val = nullptr;
  d.nnz = 0;
  return d;
}

void f32_to_f16(const float* in, __half* out, int64_t count, cudaStream_t s) {
  if (count == 0) return;
  launch_pdl(kPdlOps, f32_to_f16_kernel, static_cast<unsigned>((count + 255) / 256), 256, 0, s, in, out, count);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

GemmContext::GemmContext(cudaStream_t s) : stream_(s), cublas_ws_(32u << 20) {
  cublas_check(cublasCreate(&handle_), "cublasCreate");
  cublas_check(cublasSetStream(handle_, s), "cublasSetStream");
  cublas_check(cublasSetWorkspace(handle_, cublas_ws_.get(), cublas_ws_.bytes()), "cublasSetWorkspace");
}

GemmContext::~GemmContext() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

__half* GemmContext::weight_scratch(size_t elements) {
  if (wbuf_.size() < elements) {
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream_));   // the old buffer may still be read by queued work
    wbuf_ = DeviceBuffer<__half>(elements);
    ++generation_;
  }
  return wbuf_.get();
}

__half* GemmContext::act_scratch(size_t elements) {
  if (abuf_.size() < elements) {
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    abuf_ = DeviceBuffer<__half>(elements);
    ++generation_;
  }
  return abuf_.get();
}

namespace {
int served_width(const DevicePackedWeight& w, int bits) {   // anyprec: 0 = the widest
  return bits == 0 && w.format() == FormatId::AnyPrec ? static_cast<int>(31 - __builtin_clz(w.served_widths())) : bits;
}
LinearProblem problem_of(const DevicePackedWeight& w, int bits, int64_t m) {
  return {w.format(), w.n(), w.k(), m, served_width(w, bits), kPreSplitInRuntime};
}
}  // namespace

const GpuInfo& runtime_gpu() {
  static const GpuInfo g = [] {
    GpuInfo i;
    int dev = 0;
    LOWBIT_CUDA_CHECK(cudaGetDevice(&dev));
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&i.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&i.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
    i.sms = device_sm_count();
    i.sm90a_kernels = true;   // the library always carries its sm_90a build (CMakeLists.txt: lowbit_cuda_sm90a)
    return i;
  }();
  return g;
}

GemvPath gemv_path_of(Kernel k) {
  switch (k) {
    case Kernel::AnyPrecInt8Stream: return GemvPath::TensorCoreInt8LutStream;
    case Kernel::AnyPrecRegLutStream: return GemvPath::TensorCoreRegisterLutStream;
    case Kernel::AnyPrecRegLut: return GemvPath::TensorCoreRegisterLut;
    case Kernel::AnyPrecSharedLutStream: return GemvPath::TensorCoreSharedLutStream;
    case Kernel::AnyPrecSharedLut: return GemvPath::TensorCore;
    case Kernel::AnyPrecCudaCores: return GemvPath::Scalar;
    case Kernel::Mixed24aDp: return GemvPath::Dp2aStream;
    case Kernel::Mixed24aInt8Mma: return GemvPath::Int8MmaStream;
    case Kernel::Mixed24aTcStream: return GemvPath::TensorCoreStream;
    case Kernel::Mixed24aTc: return GemvPath::TensorCore;
    case Kernel::Mixed24aCudaCores: return GemvPath::Scalar;
    case Kernel::DenseGemv:
    case Kernel::Cublas:
    case Kernel::AnyPrecTwoTiles:
    case Kernel::AnyPrecWgmmaWs:
    case Kernel::AnyPrecStaged:
    case Kernel::Mixed24aTwoTiles:
    case Kernel::DequantCublas: break;
  }
  return GemvPath::Auto;
}

GemvPath anyprec_auto_path(int64_t n, int64_t k, int m, int bits, bool presplit) {
  return gemv_path_of(choose_kernel({FormatId::AnyPrec, n, k, m, bits, presplit}, runtime_gpu()).kernel);
}

GemvPath mixed24a_auto_path(int64_t n, int64_t k, int m, bool presplit) {
  return gemv_path_of(choose_kernel({FormatId::Mixed24A, n, k, m, 0, presplit}, runtime_gpu()).kernel);
}

bool packed_runs_int8_gemv(const DevicePackedWeight& w, int bits, int64_t m) {
  if (m < 1 || m > kMaxGemvBatch) return false;
  const Kernel k = choose_kernel(problem_of(w, bits, m), runtime_gpu()).kernel;
  return k == Kernel::AnyPrecInt8Stream || k == Kernel::Mixed24aDp || k == Kernel::Mixed24aInt8Mma;
}

// 2..3 bits only: at 4 bits the epilogue measured slower (H200, Llama-2-7B 4-bit: batch 1 325.3 against 327.0 tok/s,
// batch 8 2,238.5 against 2,253.8, same run).
bool packed_swiglu_fuses(const DevicePackedWeight& w, int bits, int64_t m) {
  return fold_swiglu_enabled() && w.format() == FormatId::AnyPrec && w.n() % 32 == 0 && served_width(w, bits) <= 3 &&
         packed_runs_int8_gemv(w, bits, m);
}

void packed_matmul_swiglu(const DevicePackedWeight& w, int bits, const float* x, int64_t m, float* h, GemmContext& ctx,
                          const float* x_max, unsigned* h_max_bits) {
  LOWBIT_CHECK(packed_swiglu_fuses(w, bits, m) && h_max_bits != nullptr, "packed_matmul_swiglu: not served for ", w.n(), "x", w.k(),
               " at batch ", m, " (packed_swiglu_fuses)");
  void* xfrag = ctx.act_scratch((anyprec_xfrag_bytes(w.k()) + 1) / 2);
  anyprec_gemv_i8(w.anyprec(), served_width(w, bits), x, static_cast<int>(m), h, ctx.stream(), true, xfrag, x_max, h_max_bits);
}

bool packed_group_runs(const std::vector<const DevicePackedWeight*>& ws, int64_t m) {
  if (!group_gemv_enabled() || ws.size() < 2 || ws.size() > 3 || m < 1 || m > kMaxGemvBatch) return false;
  for (const DevicePackedWeight* w : ws)
    if (w == nullptr || w->format() != FormatId::Mixed24A || w->k() != ws[0]->k() || !packed_runs_int8_gemv(*w, 0, m))
      return false;
  return true;
}

void packed_matmul_group(const std::vector<const DevicePackedWeight*>& ws, const float* x, int64_t m, const std::vector<float*>& ys,
                         GemmContext& ctx, const float* x_max) {
  LOWBIT_CHECK(packed_group_runs(ws, m) && ys.size() == ws.size(), "packed_matmul_group: not served for these ", ws.size(),
               " weights at batch ", m, " (packed_group_runs)");
  std::vector<Mixed24ADevice> d;
  for (const DevicePackedWeight* w : ws) d.push_back(w->mixed24a());
  void* xfrag = ctx.act_scratch((mixed24a_xfrag_bytes(ws[0]->k()) + 1) / 2);
  mixed24a_gemv_group(d.data(), static_cast<int>(d.size()), x, static_cast<int>(m), ys.data(), ctx.stream(), OutlierMode::Fused,
                      xfrag, x_max);
}

void packed_matmul(const DevicePackedWeight& w, int bits, const float* x, int64_t m, float* y, GemmContext& ctx,
                   OutlierMode mode, const float* x_max) {
  LOWBIT_CHECK(m >= 1, "packed_matmul: batch ", m);
  const int b = served_width(w, bits);
  const Kernel kernel = choose_kernel(problem_of(w, bits, m), runtime_gpu()).kernel;
  const int mi = static_cast<int>(std::min<int64_t>(m, INT32_MAX));
  // The tensor-core paths read pre-split activations from the context's scratch (sized before any graph capture by
  // the uncaptured step that precedes it).
  switch (kernel) {
    case Kernel::AnyPrecInt8Stream:   // outliers always fused
      anyprec_gemv_i8(w.anyprec(), b, x, mi, y, ctx.stream(), true, ctx.act_scratch((anyprec_xfrag_bytes(w.k()) + 1) / 2), x_max);
      return;
    case Kernel::AnyPrecRegLutStream:
    case Kernel::AnyPrecRegLut:
    case Kernel::AnyPrecSharedLutStream:
    case Kernel::AnyPrecSharedLut:
    case Kernel::AnyPrecCudaCores: {
      const GemvPath path = gemv_path_of(kernel);
      void* xfrag = kPreSplitInRuntime && is_tensor_core(path) ? ctx.act_scratch((anyprec_xfrag_bytes(w.k()) + 1) / 2) : nullptr;
      anyprec_gemv(w.anyprec(), b, x, mi, y, ctx.stream(), mode, path, xfrag);
      return;
    }
    case Kernel::Mixed24aDp:
    case Kernel::Mixed24aInt8Mma:
    case Kernel::Mixed24aTcStream:
    case Kernel::Mixed24aTc:
    case Kernel::Mixed24aCudaCores: {
      const GemvPath path = gemv_path_of(kernel);
      void* xfrag = kPreSplitInRuntime && mixed24a_path_takes_xfrag(path) ? ctx.act_scratch((mixed24a_xfrag_bytes(w.k()) + 1) / 2) : nullptr;
      mixed24a_gemv(w.mixed24a(), x, mi, y, ctx.stream(), mode, path, xfrag, x_max);
      return;
    }
    case Kernel::AnyPrecTwoTiles: return anyprec_gemm(w.anyprec(), b, x, m, y, ctx, GemmKernel::TwoTiles);
    case Kernel::AnyPrecWgmmaWs: return anyprec_gemm(w.anyprec(), b, x, m, y, ctx, GemmKernel::WgmmaWs);
    case Kernel::AnyPrecStaged: return anyprec_gemm(w.anyprec(), b, x, m, y, ctx, GemmKernel::Staged);
    case Kernel::Mixed24aTwoTiles:
      return mixed24a_gemv_two_tiles(w.mixed24a(), x, mi, y, ctx.stream(), ctx.act_scratch((mixed24a_xfrag_bytes(w.k()) + 1) / 2));
    case Kernel::DequantCublas: {
      __half* wh = ctx.weight_scratch(static_cast<size_t>(w.n() * w.k()));
      if (w.format() == FormatId::AnyPrec) anyprec_dequant_f16(w.anyprec(), b, wh, ctx.stream());
      else mixed24a_dequant_f16(w.mixed24a(), wh, ctx.stream());
      return dense_f16_matmul(wh, w.n(), w.k(), x, m, y, ctx);
    }
    case Kernel::DenseGemv:
    case Kernel::Cublas: break;
  }
  fail("packed_matmul: kernel '", kernel_name(kernel), "' chosen for a ", format_name(w.format()), " weight");
}

namespace {
bool& producer_xmax_state() {   // from the knob on first use
  static bool on = knob_bool(Knob::ProducerXmax);
  return on;
}
bool& fold_swiglu_state() {
  static bool on = knob_bool(Knob::FoldSwiglu);
  return on;
}
bool& group_gemv_state() {
  static bool on = knob_bool(Knob::GroupGemv);
  return on;
}
int& i8_pack_state() {
  static int mode = [] {
    const int64_t v = knob_int(Knob::I8Pack);
    return v == 0 || v == 1 ? static_cast<int>(v) : -1;
  }();
  return mode;
}
bool& gemv_balance_state() {
  static bool on = knob_bool(Knob::GemvBalance);
  return on;
}
}  // namespace

bool group_gemv_enabled() { return group_gemv_state(); }
bool gemv_balance_enabled() { return gemv_balance_state(); }
int i8_pack_mode() { return i8_pack_state(); }
void set_i8_pack_mode(int mode) { i8_pack_state() = mode < 0 ? -1 : mode > 0 ? 1 : 0; }
void set_gemv_balance(bool on) { gemv_balance_state() = on; }
void set_group_gemv(bool on) { group_gemv_state() = on; }
// The switches kernel_choice.h reads go through the knob registry itself.
bool fused_gemm_enabled() { return knob_bool(Knob::FusedGemm); }
void set_fused_gemm(bool on) { set_knob(Knob::FusedGemm, on); }
bool int8_tables_enabled() { return knob_bool(Knob::Int8Tables); }
void set_int8_tables(bool on) { set_knob(Knob::Int8Tables, on); }
bool producer_xmax_enabled() { return producer_xmax_state(); }
void set_producer_xmax(bool on) { producer_xmax_state() = on; }
bool fold_swiglu_enabled() { return fold_swiglu_state(); }
void set_fold_swiglu(bool on) { fold_swiglu_state() = on; }

bool narrow_rows(int64_t n, int64_t k, int m, int bits) {
  static const int sms = device_sm_count();
  return m <= kNarrowMaxBatch && n < 4LL * 32 * sms && (k <= 4096 || bits >= 6);
}

void dense_f16_matmul(const __half* w, int64_t n, int64_t k, const float* x, int64_t m, float* y, GemmContext& ctx) {
  __half* xh = ctx.act_scratch(static_cast<size_t>(m * k));
  f32_to_f16(x, xh, m * k, ctx.stream());
  dense_f16_matmul_h(w, n, k, xh, m, y, ctx);
}

void dense_f16_matmul_h(const __half* w, int64_t n, int64_t k, const __half* xh, int64_t m, float* y, GemmContext& ctx) {
  // Row-major y [m, n] = x [m, k] · Wᵀ is column-major yᵀ [n, m] = (W as column-major [k, n])ᵀ · (x as [k, m]).
  const float alpha = 1.0f, beta = 0.0f;
  cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                            static_cast<int>(k), &alpha, w, CUDA_R_16F, static_cast<int>(k), xh, CUDA_R_16F,
                            static_cast<int>(k), &beta, y, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "dense_f16_matmul");
}

}  // namespace lowbit::cuda
