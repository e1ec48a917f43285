#include "quantize/gptq.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

extern "C" {
// LAPACK (column-major) from OpenBLAS.
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);
}

namespace lowbit {

namespace {

// Row-major symmetric A [k, k] -> upper factor U (row-major) of A⁻¹ = Uᵀ U. Column-major 'L' on row-major storage
// is row-major 'U', so: potrf (A = Rᵀ R), potri (A⁻¹ in the upper triangle), symmetrize, potrf again.
bool inverse_upper_cholesky(std::vector<double>& a, int k) {
  int info = 0;
  const char lo = 'L';
  dpotrf_(&lo, &k, a.data(), &k, &info);
  if (info != 0) return false;
  dpotri_(&lo, &k, a.data(), &k, &info);
  if (info != 0) return false;
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < i; ++j) a[static_cast<size_t>(i) * k + j] = a[static_cast<size_t>(j) * k + i];
  dpotrf_(&lo, &k, a.data(), &k, &info);
  if (info != 0) return false;
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < i; ++j) a[static_cast<size_t>(i) * k + j] = 0.0;   // keep the upper factor only
  return true;
}

}  // namespace

GptqFactor gptq_factor(const std::vector<double>& h_in, int64_t k, const GptqOptions& o) {
  LOWBIT_CHECK(h_in.size() == static_cast<size_t>(k * k), "gptq: Hessian is ", h_in.size(), " values, expected ", k * k);
  LOWBIT_CHECK(o.percdamp > 0 && o.block_size > 0, "gptq: percdamp and block size must be positive");
  GptqFactor f;
  f.k = k;
  f.dead.assign(static_cast<size_t>(k), 0);
  std::vector<double> H(h_in);
  for (int64_t i = 0; i < k; ++i) {
    if (H[static_cast<size_t>(i * k + i)] == 0.0) {   // a column no calibration input ever activated
      H[static_cast<size_t>(i * k + i)] = 1.0;
      f.dead[static_cast<size_t>(i)] = 1;
    }
  }
  // Act-order: process columns by decreasing H_ii.
  f.perm.resize(static_cast<size_t>(k));
  std::iota(f.perm.begin(), f.perm.end(), 0);
  if (o.act_order)
    std::stable_sort(f.perm.begin(), f.perm.end(), [&](int64_t a, int64_t b) {
      return H[static_cast<size_t>(a * k + a)] > H[static_cast<size_t>(b * k + b)];
    });
  std::vector<double> Hp(static_cast<size_t>(k * k));
  double mean_diag = 0;
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j)
      Hp[static_cast<size_t>(i * k + j)] = H[static_cast<size_t>(f.perm[static_cast<size_t>(i)] * k + f.perm[static_cast<size_t>(j)])];
    mean_diag += Hp[static_cast<size_t>(i * k + i)];
  }
  mean_diag /= static_cast<double>(k);
  // U = upper Cholesky factor of (H + λI)⁻¹; raise λ tenfold until it factors (the GPTQ reference fails instead).
  f.damp = o.percdamp * mean_diag;
  for (int attempt = 0;; ++attempt) {
    f.u = Hp;
    for (int64_t i = 0; i < k; ++i) f.u[static_cast<size_t>(i * k + i)] += f.damp;
    if (inverse_upper_cholesky(f.u, static_cast<int>(k))) break;
    LOWBIT_CHECK(attempt < 6, "gptq: the Hessian is not positive definite even with damping ", f.damp);
    f.damp *= 10.0;
  }
  f.uf.assign(f.u.begin(), f.u.end());
  return f;
}

UniformQuantized gptq_quantize(const float* w_in, int64_t n, int64_t k, const std::vector<double>& h_in,
                               const GptqOptions& o, GptqStats* stats) {
  return gptq_quantize(w_in, n, k, h_in, gptq_factor(h_in, k, o), o, stats);
}

UniformQuantized gptq_quantize(const float* w_in, int64_t n, int64_t k, const std::vector<double>& h_in,
                               const GptqFactor& f, const GptqOptions& o, GptqStats* stats) {
  const UniformSpec& s = o.spec;
  validate_uniform_spec(s, k);
  check_weights_finite(w_in, n * k, "gptq");
  const int ki = static_cast<int>(k);
  const int maxq = (1 << s.bits) - 1;
  const int64_t gs = s.group_size > 0 ? std::min(s.group_size, k) : k;
  GptqStats st;

  LOWBIT_CHECK(f.k == k, "gptq: factor is for k = ", f.k, ", weight has k = ", k);
  std::vector<float> W(w_in, w_in + n * k);
  for (int64_t i = 0; i < k; ++i) {
    if (f.dead[static_cast<size_t>(i)]) {
      for (int64_t r = 0; r < n; ++r) W[static_cast<size_t>(r * k + i)] = 0.0f;
      ++st.dead_columns;
    }
  }

  UniformQuantized q;
  q.bits = s.bits;
  q.n = n;
  q.k = k;
  q.group_size = gs;
  q.symmetric = s.symmetric;
  const int64_t G = q.groups();
  q.codes.assign(static_cast<size_t>(n * k), 0);
  q.scales.assign(static_cast<size_t>(n * G), 0);
  if (!s.symmetric) q.zeros.assign(static_cast<size_t>(n * G), 0);

  // Static groups: parameters from the original column order, before any update.
  std::vector<GroupParams> static_params;
  if (o.static_groups) {
    static_params.resize(static_cast<size_t>(n * G));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t c0 = g * gs, c1 = std::min(k, c0 + gs);
        static_params[static_cast<size_t>(r * G + g)] = find_group_params(W.data() + r * k + c0, c1 - c0, 1, s);
      }
  }

  const std::vector<int64_t>& perm = f.perm;
  const std::vector<double>& U = f.u;
  const std::vector<float>& Uf = f.uf;
  st.damp = f.damp;
  // Wp [n, k] in processing order.
  std::vector<float> Wp(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < k; ++j) Wp[static_cast<size_t>(r * k + j)] = W[static_cast<size_t>(r * k + perm[static_cast<size_t>(j)])];

  std::vector<GroupParams> cur(static_cast<size_t>(n));   // the current group's parameters, per row
  const int64_t B = o.block_size;
  std::vector<float> err(static_cast<size_t>(n * B));
  for (int64_t i1 = 0; i1 < k; i1 += B) {
    const int64_t i2 = std::min(k, i1 + B), cnt = i2 - i1;
    // Rows are independent inside a block (the error of row r only feeds row r's later columns), so one parallel
    // region per block covers all its columns.
#pragma omp parallel for schedule(static) if (n * cnt >= (1 << 14))
    for (int64_t r = 0; r < n; ++r) {
      float* row = Wp.data() + r * k;
      GroupParams& p_cur = cur[static_cast<size_t>(r)];
      for (int64_t i = i1; i < i2; ++i) {
        const int64_t orig = perm[static_cast<size_t>(i)];
        // Group parameters: at the first column of each group in processing order (from the current, already
        // error-updated weights), or the static ones of the column's original group.
        if (!o.static_groups && i % gs == 0) {
          p_cur = find_group_params(row + i, std::min(gs, k - i), 1, s);
          const int64_t g = i / gs;
          q.scales[static_cast<size_t>(r * G + g)] = p_cur.scale_f16;
          if (!s.symmetric) q.zeros[static_cast<size_t>(r * G + g)] = static_cast<uint8_t>(p_cur.zero);
        }
        const GroupParams& p = o.static_groups ? static_params[static_cast<size_t>(r * G + orig / gs)] : p_cur;
        const int code = quantize_code(row[i], p, maxq);
        q.codes[static_cast<size_t>(r * k + orig)] = static_cast<uint8_t>(code);
        const float e = static_cast<float>((row[i] - dequant_code(code, p)) / U[static_cast<size_t>(i * k + i)]);
        err[static_cast<size_t>(r * B + (i - i1))] = e;
        // lazy update inside the block only; the trailing columns get one sgemm per block
        const float* urow = Uf.data() + i * k;
        for (int64_t j = i + 1; j < i2; ++j) row[j] -= e * urow[j];
      }
    }
    if (i2 < k)   // W[:, i2:] -= Err [n, cnt] · U[i1:i2, i2:]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(k - i2),
                  static_cast<int>(cnt), -1.0f, err.data(), static_cast<int>(B), Uf.data() + i1 * k + i2, ki, 1.0f,
                  Wp.data() + i2, ki);
  }
  if (o.static_groups) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < G; ++g) {
        q.scales[static_cast<size_t>(r * G + g)] = static_params[static_cast<size_t>(r * G + g)].scale_f16;
        if (!s.symmetric) q.zeros[static_cast<size_t>(r * G + g)] = static_cast<uint8_t>(static_params[static_cast<size_t>(r * G + g)].zero);
      }
  } else if (o.act_order && G > 1) {   // one group (per channel): every g_idx would be 0, so none is stored
    q.g_idx.resize(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) q.g_idx[static_cast<size_t>(perm[static_cast<size_t>(j)])] = static_cast<int32_t>(j / gs);
  }
  if (!h_in.empty()) st.hessian_error = hessian_weighted_error(w_in, q, h_in);
  if (stats) *stats = st;
  return q;
}

namespace {

// Σ_r d_rᵀ H d_r = Σ (D H) ⊙ D with D = W - Ŵ, as one dsymm per block of rows (a dsymv per row would stream all of
// H once per row: 19 MB x 576 rows for SmolLM2's down_proj). w_hat(r, c) is read block by block, so no full Ŵ is
// materialised.
template <typename WHat>
double weighted_error_by_row_blocks(const float* w, WHat w_hat, int64_t n, int64_t k, const std::vector<double>& h) {
  constexpr int64_t kRows = 256;
  std::vector<double> d(static_cast<size_t>(std::min(n, kRows) * k)), dh(d.size());
  double total = 0;
  for (int64_t r0 = 0; r0 < n; r0 += kRows) {
    const int64_t m = std::min(kRows, n - r0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c)
        d[static_cast<size_t>(r * k + c)] = static_cast<double>(w[(r0 + r) * k + c]) - w_hat(r0 + r, c);
    cblas_dsymm(CblasRowMajor, CblasRight, CblasUpper, static_cast<int>(m), static_cast<int>(k), 1.0, h.data(),
                static_cast<int>(k), d.data(), static_cast<int>(k), 0.0, dh.data(), static_cast<int>(k));
    total += cblas_ddot(static_cast<int>(m * k), d.data(), 1, dh.data(), 1);
  }
  return total;
}

}  // namespace

double hessian_weighted_error(const float* w, const UniformQuantized& q, const std::vector<double>& h) {
  return weighted_error_by_row_blocks(w, [&](int64_t r, int64_t c) { return q.dequant(r, c); }, q.n, q.k, h);
}

double hessian_weighted_error(const float* w, const float* w_hat, int64_t n, int64_t k, const std::vector<double>& h) {
  return weighted_error_by_row_blocks(w, [&](int64_t r, int64_t c) { return w_hat[r * k + c]; }, n, k, h);
}

}  // namespace lowbit
