// DevicePackedWeight: a packed weight's parts uploaded as stored, its per-format views, the int8 tables derived from
// the any-precision LUTs at upload, and random weights of the real layouts for benchmarks.
#include "backend_cuda/dispatch/device_weight.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "backend_cuda/anyprec/int8_tables.h"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/uniform/uniform.h"
#include "formats/anyprec/layout.h"
#include "formats/format_table.h"
#include "formats/mixed24a/layout.h"

namespace lowbit::cuda {
DevicePackedWeight::DevicePackedWeight(const PackedWeight& w)
    : format_(w.format), n_(w.shape.at(0)), k_(w.shape.at(1)), params_(w.params) {
  LOWBIT_CHECK(packed_format(format_).gpu == GpuSupport::Packed, "CUDA backend: packed format '", format_name(format_),
               "' has no GPU kernel yet (uniform, anyprec, mixed24a and quik do)");
  if (const char* why = gpu_refusal(w)) fail("CUDA backend: this ", format_name(format_), " weight stays on the CPU: ", why);
  if (format_ == FormatId::Quik) {
    upload_quik(w);
    return;
  }
  for (const auto& [name, view] : w.parts) parts_.emplace(name, DeviceBuffer<uint8_t>(view.data, view.nbytes));
  if (format_ == FormatId::AnyPrec) derive_int8_tables();
  if (format_ == FormatId::Uniform) derive_uniform_mn_operands();
}

// The mixed-input GEMM's scales and zero terms, MN-major (uniform.h): 4 bytes per row and group, made once here so
// that no call allocates or transposes.
void DevicePackedWeight::derive_uniform_mn_operands() {
  const UniformDevice u = uniform();
  if (!uniform_gemm_serves(u)) return;
  const size_t bytes = static_cast<size_t>(u.n * u.G) * sizeof(__half);
  auto& s = parts_.emplace("derived_s_mn", DeviceBuffer<uint8_t>(bytes)).first->second;
  auto& z = parts_.emplace("derived_z_mn", DeviceBuffer<uint8_t>(bytes)).first->second;
  uniform_mn_operands(u, reinterpret_cast<__half*>(s.get()), reinterpret_cast<__half*>(z.get()), nullptr);
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
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
  if (format_ == FormatId::Uniform) {   // the GEMV reads the parts as stored, not the GEMM's derived ones
    uint64_t b = bytes();
    for (const char* p : {"derived_s_mn", "derived_z_mn"})
      if (parts_.count(p)) b -= parts_.at(p).bytes();
    return b;
  }
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

UniformDevice DevicePackedWeight::uniform() const {
  LOWBIT_CHECK(format_ == FormatId::Uniform, "CUDA backend: a uniform view of a ", format_name(format_), " weight");
  UniformDevice d;
  d.n = n_;
  d.k = k_;
  d.bits = static_cast<int>(params_.at("bits"));
  d.words = (k_ * d.bits + 31) / 32;
  d.gs = params_.at("group_size");
  d.G = (k_ + d.gs - 1) / d.gs;
  d.qweight = reinterpret_cast<const uint32_t*>(part("qweight"));
  d.scales = reinterpret_cast<const __half*>(part("scales"));
  if (params_.at("symmetric") == 0) d.zeros = part("zeros");
  if (params_.at("act_order") == 1) d.g_idx = reinterpret_cast<const int32_t*>(part("g_idx"));
  if (parts_.count("derived_s_mn") != 0) {
    d.scales_mn = reinterpret_cast<const __half*>(part("derived_s_mn"));
    d.zero_terms_mn = reinterpret_cast<const __half*>(part("derived_z_mn"));
  }
  return d;
}

void DevicePackedWeight::upload_quik(const PackedWeight& w) {
  const int64_t no = params_.at("outliers"), kb = k_ - no, kbp = (kb + 31) / 32 * 32;
  const int wbits = static_cast<int>(params_.at("wbits"));
  for (const auto& [name, view] : w.parts)
    if (name != "qweight8" && name != "qweight4") parts_.emplace(name, DeviceBuffer<uint8_t>(view.data, view.nbytes));
  // Rows padded with zero codes (a zero weight code adds nothing to the integer sums).
  const int64_t row_in = wbits == 8 ? kb : (kb + 1) / 2, row_out = wbits == 8 ? kbp : kbp / 2;
  const uint8_t* src = w.parts.at(wbits == 8 ? "qweight8" : "qweight4").data;
  std::vector<uint8_t> padded(static_cast<size_t>(n_ * row_out), 0);
  for (int64_t r = 0; r < n_; ++r)
    std::copy(src + r * row_in, src + (r + 1) * row_in, padded.begin() + r * row_out);
  parts_.emplace("derived_wq", DeviceBuffer<uint8_t>(padded));
  // The base columns: the complement of the (increasing) outlier columns.
  std::vector<int32_t> base;
  base.reserve(static_cast<size_t>(kb));
  const int32_t* out = reinterpret_cast<const int32_t*>(w.parts.at("outlier_idx").data);
  quik_outliers_.assign(out, out + no);
  for (int64_t c = 0, o = 0; c < k_; ++c) {
    if (o < no && out[o] == c) { ++o; continue; }
    base.push_back(static_cast<int32_t>(c));
  }
  parts_.emplace("derived_base_idx", DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(base.data()), base.size() * 4));
}

QuikDevice DevicePackedWeight::quik() const {
  LOWBIT_CHECK(format_ == FormatId::Quik, "CUDA backend: a quik view of a ", format_name(format_), " weight");
  QuikDevice d;
  d.n = n_;
  d.k = k_;
  d.no = params_.at("outliers");
  d.kb = k_ - d.no;
  d.kbp = (d.kb + 31) / 32 * 32;
  d.wbits = static_cast<int>(params_.at("wbits"));
  d.abits = static_cast<int>(params_.at("abits"));
  d.act_fp8 = params_.at("act_fp8") == 1;
  if (d.wbits == 8) d.wq8 = reinterpret_cast<const int8_t*>(part("derived_wq"));
  else d.wq4 = part("derived_wq");
  d.scale = reinterpret_cast<const __half*>(part("scale"));
  d.wreduced = reinterpret_cast<const float*>(part("wreduced"));
  if (d.kb > 0) d.base_idx = reinterpret_cast<const int32_t*>(part("derived_base_idx"));
  if (d.no > 0) {
    d.outlier_idx = reinterpret_cast<const int32_t*>(part("outlier_idx"));
    d.outlier_w = reinterpret_cast<const __half*>(part("outlier_w"));
  }
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

DevicePackedWeight DevicePackedWeight::random_uniform(int64_t n, int64_t k, int bits, int64_t group, uint64_t seed) {
  LOWBIT_CHECK(bits >= 2 && bits <= 8 && group >= 1, "random uniform weight: ", bits, " bits, group ", group);
  DevicePackedWeight w;
  w.format_ = FormatId::Uniform;
  w.n_ = n;
  w.k_ = k;
  const int64_t gs = std::min(group, k), G = (k + gs - 1) / gs, words = (k * bits + 31) / 32;
  w.params_ = {{"bits", bits}, {"group_size", gs}, {"symmetric", 0}, {"act_order", 0}};
  uint64_t sd = seed;
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, int64_t>>{{"qweight", 4 * n * words}, {"zeros", n * G}}) {
    auto& b = w.parts_.emplace(name, DeviceBuffer<uint8_t>(static_cast<size_t>(bytes))).first->second;
    fill_random_bytes(b.get(), bytes, ++sd);
  }
  auto& s = w.parts_.emplace("scales", DeviceBuffer<uint8_t>(static_cast<size_t>(2 * n * G))).first->second;
  fill_random_half(reinterpret_cast<__half*>(s.get()), n * G, ++sd, 1e-4f, 1e-3f);
  w.derive_uniform_mn_operands();
  return w;
}

DevicePackedWeight DevicePackedWeight::random_quik(int64_t n, int64_t k, int wbits, int64_t outliers, uint64_t seed,
                                                   int abits, bool act_fp8) {
  LOWBIT_CHECK((wbits == 4 || wbits == 8) && (abits == 4 || abits == 8 || abits == 16) &&
                   (!act_fp8 || (wbits == 4 && abits == 8)) && outliers >= 0 && outliers <= k,
               "random quik weight: W", wbits, "A", abits, act_fp8 ? " FP8" : "", ", ", outliers, " outliers of ", k);
  DevicePackedWeight w;
  w.format_ = FormatId::Quik;
  w.n_ = n;
  w.k_ = k;
  w.params_ = {{"wbits", wbits}, {"abits", abits}, {"act_fp8", act_fp8 ? 1 : 0}, {"outliers", outliers}};
  const int64_t kb = k - outliers, kbp = (kb + 31) / 32 * 32;
  uint64_t sd = seed;
  const int64_t code_bytes = wbits == 8 ? n * kbp : n * kbp / 2;
  auto& q = w.parts_.emplace("derived_wq", DeviceBuffer<uint8_t>(static_cast<size_t>(code_bytes))).first->second;
  fill_random_bytes(q.get(), code_bytes, ++sd);
  auto& sc = w.parts_.emplace("scale", DeviceBuffer<uint8_t>(static_cast<size_t>(2 * n))).first->second;
  fill_random_half(reinterpret_cast<__half*>(sc.get()), n, ++sd, 1e-3f, 2e-3f);
  auto& wr = w.parts_.emplace("wreduced", DeviceBuffer<uint8_t>(static_cast<size_t>(4 * n))).first->second;
  fill_random_float(reinterpret_cast<float*>(wr.get()), n, ++sd, -1.0f, 1.0f);
  std::vector<int32_t> out(static_cast<size_t>(outliers)), base(static_cast<size_t>(kb));
  std::iota(out.begin(), out.end(), 0);
  std::iota(base.begin(), base.end(), static_cast<int32_t>(outliers));
  w.parts_.emplace("outlier_idx", DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(out.data()), out.size() * 4));
  w.quik_outliers_ = out;
  w.parts_.emplace("derived_base_idx", DeviceBuffer<uint8_t>(reinterpret_cast<const uint8_t*>(base.data()), base.size() * 4));
  auto& ow = w.parts_.emplace("outlier_w", DeviceBuffer<uint8_t>(static_cast<size_t>(2 * n * outliers))).first->second;
  fill_random_half(reinterpret_cast<__half*>(ow.get()), n * outliers, ++sd, -0.05f, 0.05f);
  return w;
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

}  // namespace lowbit::cuda
