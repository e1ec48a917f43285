#include "backend_cuda/mixed24a/cusparse_outliers.h"

#include <cusparse.h>

#include <map>
#include <vector>

namespace lowbit::cuda {
namespace {

void check(cusparseStatus_t st, const char* what) {
  LOWBIT_CHECK(st == CUSPARSE_STATUS_SUCCESS, "cuSPARSE: ", what, " failed: ", cusparseGetErrorString(st));
}

// Stored column c of a 2/4/16 weight -> x's original column (MixedOutlierEntry's mapping).
__global__ void original_columns_kernel(const uint16_t* col, const uint16_t* perm, int64_t nnz, int32_t* out) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < nnz) out[e] = 16 * static_cast<int32_t>(perm[col[e] / 16]) + col[e] % 16;
}

__global__ void half_to_float_kernel(const __half* v, int64_t nnz, float* out) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < nnz) out[e] = __half2float(v[e]);
}

}  // namespace

struct CusparseOutliers::Impl {
  int64_t n = 0, k = 0, nnz = 0;
  cusparseHandle_t handle = nullptr;
  cusparseSpMatDescr_t a = nullptr;
  DeviceBuffer<int32_t> cols;
  DeviceBuffer<float> vals32;   // only where fp16 A is refused
  std::map<int, DeviceBuffer<uint8_t>> work;   // per batch: the external buffer cuSPARSE asked for
  ~Impl() {
    if (a != nullptr) cusparseDestroySpMat(a);
    if (handle != nullptr) cusparseDestroy(handle);
  }
};

namespace {

// y [m, n] += A x [m, k] on h's stream (SpMV at m = 1, SpMM above), or, with bytes != nullptr, only the size of the
// external buffer that takes (x and y then may be any pointers). CUSPARSE_STATUS_NOT_SUPPORTED passes through.
cusparseStatus_t spmm(cusparseHandle_t h, cusparseSpMatDescr_t a, int64_t n, int64_t k, int m, const float* x, float* y, void* buf,
                      size_t* bytes) {
  const float one = 1.0f;
  const auto op = CUSPARSE_OPERATION_NON_TRANSPOSE;
  void* xp = const_cast<float*>(x);
  cusparseStatus_t st;
  if (m == 1) {
    cusparseDnVecDescr_t xv, yv;
    check(cusparseCreateDnVec(&xv, k, xp, CUDA_R_32F), "cusparseCreateDnVec");
    check(cusparseCreateDnVec(&yv, n, y, CUDA_R_32F), "cusparseCreateDnVec");
    st = bytes != nullptr ? cusparseSpMV_bufferSize(h, op, &one, a, xv, &one, yv, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, bytes)
                          : cusparseSpMV(h, op, &one, a, xv, &one, yv, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, buf);
    cusparseDestroyDnVec(xv);
    cusparseDestroyDnVec(yv);
  } else {
    cusparseDnMatDescr_t xm, ym;   // x [m, k] row-major = k x m column-major; y [m, n] = n x m column-major
    check(cusparseCreateDnMat(&xm, k, m, k, xp, CUDA_R_32F, CUSPARSE_ORDER_COL), "cusparseCreateDnMat");
    check(cusparseCreateDnMat(&ym, n, m, n, y, CUDA_R_32F, CUSPARSE_ORDER_COL), "cusparseCreateDnMat");
    st = bytes != nullptr ? cusparseSpMM_bufferSize(h, op, op, &one, a, xm, &one, ym, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, bytes)
                          : cusparseSpMM(h, op, op, &one, a, xm, &one, ym, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, buf);
    cusparseDestroyDnMat(xm);
    cusparseDestroyDnMat(ym);
  }
  return st;
}

// The buffer size of y += A x for m columns.
cusparseStatus_t buffer_size(cusparseHandle_t h, cusparseSpMatDescr_t a, int64_t n, int64_t k, int m, size_t& bytes) {
  float dummy = 0.0f;
  return spmm(h, a, n, k, m, &dummy, &dummy, nullptr, &bytes);
}

}  // namespace

CusparseOutliers::CusparseOutliers(const Mixed24ADevice& w) : impl_(std::make_unique<Impl>()) {
  LOWBIT_CHECK(w.rowptr != nullptr && w.nnz > 0, "cuSPARSE outliers: the weight (", w.n, "x", w.k, ") has no outliers");
  Impl& d = *impl_;
  d.n = w.n, d.k = w.k, d.nnz = w.nnz;
  check(cusparseCreate(&d.handle), "cusparseCreate");
  d.cols = DeviceBuffer<int32_t>(static_cast<size_t>(w.nnz));
  const unsigned blocks = static_cast<unsigned>((w.nnz + 255) / 256);
  original_columns_kernel<<<blocks, 256>>>(w.col, w.perm, w.nnz, d.cols.get());
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  auto make = [&](const void* vals, cudaDataType t) {
    if (d.a != nullptr) cusparseDestroySpMat(d.a);
    check(cusparseCreateCsr(&d.a, w.n, w.k, w.nnz, const_cast<int32_t*>(w.rowptr), d.cols.get(), const_cast<void*>(vals),
                            CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, t),
          "cusparseCreateCsr");
  };
  make(w.val, CUDA_R_16F);
  size_t bytes = 0;
  // fp16 values with fp32 x and y where cuSPARSE takes them (SpMV and SpMM both), else fp32 values.
  if (buffer_size(d.handle, d.a, d.n, d.k, 1, bytes) != CUSPARSE_STATUS_SUCCESS ||
      buffer_size(d.handle, d.a, d.n, d.k, 2, bytes) != CUSPARSE_STATUS_SUCCESS) {
    fp16_ = false;
    d.vals32 = DeviceBuffer<float>(static_cast<size_t>(w.nnz));
    half_to_float_kernel<<<blocks, 256>>>(w.val, w.nnz, d.vals32.get());
    LOWBIT_CUDA_CHECK(cudaGetLastError());
    make(d.vals32.get(), CUDA_R_32F);
  }
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
}

CusparseOutliers::~CusparseOutliers() = default;

void CusparseOutliers::add(const float* x, int m, float* y, cudaStream_t s) {
  LOWBIT_CHECK(m >= 1, "cuSPARSE outliers: batch ", m);
  Impl& d = *impl_;
  check(cusparseSetStream(d.handle, s), "cusparseSetStream");
  auto it = d.work.find(m);
  if (it == d.work.end()) {
    size_t bytes = 0;
    check(buffer_size(d.handle, d.a, d.n, d.k, m, bytes), m == 1 ? "cusparseSpMV_bufferSize" : "cusparseSpMM_bufferSize");
    it = d.work.emplace(m, DeviceBuffer<uint8_t>(bytes)).first;
  }
  check(spmm(d.handle, d.a, d.n, d.k, m, x, y, it->second.get(), nullptr), m == 1 ? "cusparseSpMV" : "cusparseSpMM");
}

}  // namespace lowbit::cuda
