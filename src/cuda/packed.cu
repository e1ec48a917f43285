// DevicePackedWeight (parts uploaded as stored), the large-batch path (dequantize + cuBLAS) and the dispatcher.
#include "cuda/packed.h"

#include "formats/anyprec/layout.h"
#include "formats/mixed24a/layout.h"

namespace lowbit::cuda {

void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error ", static_cast<int>(st), " (", cublasGetStatusString(st), ") in ", what);
}

DevicePackedWeight::DevicePackedWeight(const PackedWeight& w)
    : format_(w.format), n_(w.shape.at(0)), k_(w.shape.at(1)), params_(w.params) {
  LOWBIT_CHECK(format_ == "anyprec" || format_ == "mixed24a", "CUDA backend: packed format '", format_,
               "' has no GPU kernel yet (anyprec and mixed24a do)");
  for (const auto& [name, view] : w.parts) parts_.emplace(name, DeviceBuffer<uint8_t>(view.data, view.nbytes));
}

const uint8_t* DevicePackedWeight::part(const std::string& name) const {
  const auto it = parts_.find(name);
  LOWBIT_CHECK(it != parts_.end(), "CUDA backend: packed ", format_, " weight lacks part '", name, "'");
  return it->second.get();
}

uint32_t DevicePackedWeight::served_widths() const {
  return format_ == "anyprec" ? static_cast<uint32_t>(params_.at("widths")) : 0u;
}

uint64_t DevicePackedWeight::bytes() const {
  uint64_t b = 0;
  for (const auto& [name, buf] : parts_) b += buf.bytes();
  return b;
}

uint64_t DevicePackedWeight::bytes_read(int bits) const {
  if (format_ != "anyprec") return bytes();
  const auto has = [&](const std::string& p) { return parts_.count(p) ? parts_.at(p).bytes() : 0; };
  const int planes = static_cast<int>(params_.at("planes"));
  return has("planes") / static_cast<uint64_t>(planes) * static_cast<uint64_t>(bits) + has("lut" + std::to_string(bits)) +
         has("outlier_rowptr") + has("outlier_col") + has("outlier_val");
}

AnyPrecDevice DevicePackedWeight::anyprec() const {
  LOWBIT_CHECK(format_ == "anyprec", "CUDA backend: an anyprec view of a ", format_, " weight");
  AnyPrecDevice d;
  d.n = n_;
  d.k = k_;
  d.words = anyprec_words_per_row(k_);
  d.planes = static_cast<int>(params_.at("planes"));
  d.widths = static_cast<uint32_t>(params_.at("widths"));
  d.plane_data = reinterpret_cast<const uint32_t*>(part("planes"));
  for (int b = kAnyPrecMinBits; b <= d.planes; ++b)
    if ((d.widths >> b) & 1u) d.lut[b] = reinterpret_cast<const __half*>(part("lut" + std::to_string(b)));
  if (params_.at("sparse") == 1) {
    d.nnz = params_.at("nnz");
    d.rowptr = reinterpret_cast<const int32_t*>(part("outlier_rowptr"));
    d.col = reinterpret_cast<const int32_t*>(part("outlier_col"));
    d.val = reinterpret_cast<const __half*>(part("outlier_val"));
  }
  return d;
}

Mixed24ADevice DevicePackedWeight::mixed24a() const {
  LOWBIT_CHECK(format_ == "mixed24a", "CUDA backend: a mixed24a view of a ", format_, " weight");
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
  if (params_.at("sparse") == 1) {
    d.nnz = params_.at("nnz");
    d.rowptr = reinterpret_cast<const int32_t*>(part("outlier_rowptr"));
    d.col = reinterpret_cast<const uint16_t*>(part("outlier_col"));
    d.val = reinterpret_cast<const __half*>(part("outlier_val"));
  }
  return d;
}

namespace {
__global__ void f32_to_f16_kernel(const float* __restrict__ in, __half* __restrict__ out, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __float2half_rn(in[i]);
}
}  // namespace

void f32_to_f16(const float* in, __half* out, int64_t count, cudaStream_t s) {
  if (count == 0) return;
  f32_to_f16_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, s>>>(in, out, count);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

GemmContext::GemmContext(cudaStream_t s) : stream_(s) {
  cublas_check(cublasCreate(&handle_), "cublasCreate");
  cublas_check(cublasSetStream(handle_, s), "cublasSetStream");
}

GemmContext::~GemmContext() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

__half* GemmContext::weight_scratch(size_t elements) {
  if (wbuf_.size() < elements) wbuf_ = DeviceBuffer<__half>(elements);
  return wbuf_.get();
}

__half* GemmContext::act_scratch(size_t elements) {
  if (abuf_.size() < elements) abuf_ = DeviceBuffer<__half>(elements);
  return abuf_.get();
}

void packed_matmul(const DevicePackedWeight& w, int bits, const float* x, int64_t m, float* y, GemmContext& ctx,
                   OutlierMode mode) {
  LOWBIT_CHECK(m >= 1, "packed_matmul: batch ", m);
  const bool ap = w.format() == "anyprec";
  int b = bits;
  if (ap && b == 0) b = static_cast<int>(31 - __builtin_clz(w.served_widths()));
  if (m <= kMaxGemvBatch) {
    if (ap) anyprec_gemv(w.anyprec(), b, x, static_cast<int>(m), y, ctx.stream(), mode);
    else mixed24a_gemv(w.mixed24a(), x, static_cast<int>(m), y, ctx.stream(), mode);
    return;
  }
  __half* wh = ctx.weight_scratch(static_cast<size_t>(w.n() * w.k()));
  if (ap) anyprec_dequant_f16(w.anyprec(), b, wh, ctx.stream());
  else mixed24a_dequant_f16(w.mixed24a(), wh, ctx.stream());
  dense_f16_matmul(wh, w.n(), w.k(), x, m, y, ctx);
}

void dense_f16_matmul(const __half* w, int64_t n, int64_t k, const float* x, int64_t m, float* y, GemmContext& ctx) {
  __half* xh = ctx.act_scratch(static_cast<size_t>(m * k));
  f32_to_f16(x, xh, m * k, ctx.stream());
  // Row-major y [m, n] = x [m, k] · Wᵀ is column-major yᵀ [n, m] = (W as column-major [k, n])ᵀ · (x as [k, m]).
  const float alpha = 1.0f, beta = 0.0f;
  cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                            static_cast<int>(k), &alpha, w, CUDA_R_16F, static_cast<int>(k), xh, CUDA_R_16F,
                            static_cast<int>(k), &beta, y, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "dense_f16_matmul");
}

}  // namespace lowbit::cuda
