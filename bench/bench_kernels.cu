#include "bench/bench_kernels.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include <cublasLt.h>

#include "bench/bench_e2e.h"
#include "backend_cuda/dispatch/kernel_choice.h"
#include "backend_cuda/dispatch/packed.h"
#include "backend_cuda/mixed24a/cusparse_outliers.h"
#include "backend_cuda/quik/quik_fused.h"
#include "backend_cuda/uniform/uniform_fused.h"
#include "core/knobs.h"

namespace lowbit::cuda {
namespace {

// cuBLASLt's FP8 GEMM (e4m3 x e4m3, fp32 accumulation, fp16 out, "TN"): the plain FP8 rate QUIK's GEMM is held
// against (its shapes need m, n, k multiples of 16). Returns the median time in us, or a negative value when
// cuBLASLt has no algorithm for the shape.
double fp8_gemm_us(int64_t n, int64_t k, int64_t m, int iters, cudaStream_t s, const std::function<double(int, const std::function<void(int)>&)>& time) {
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return -1;
  DeviceBuffer<uint8_t> a(static_cast<size_t>(n * k)), b(static_cast<size_t>(m * k)), ws(size_t{32} << 20);
  DeviceBuffer<__half> c(static_cast<size_t>(m * n));
  fill_random_bytes(a.get(), n * k, 31);
  fill_random_bytes(b.get(), m * k, 32);
  // (Random bytes include e4m3 NaN patterns; the values do not change the tensor cores' time.)
  LOWBIT_CUDA_CHECK(cudaMemset(c.get(), 0, c.bytes()));
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  double us = -1;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const size_t ws_bytes = ws.bytes();
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found) == CUBLAS_STATUS_SUCCESS && found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    us = time(iters, [&](int) {
      cublasLtMatmul(lt, op, &alpha, a.get(), la, b.get(), lb, &beta, c.get(), lc, c.get(), lc, &heur.algo, ws.get(), ws_bytes, s);
    });
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  return us;
}

// Keeps the stream busy for ~`cycles` so that the host has enqueued the timed work before the start event
// fires: the events then time the GPU work alone, not the host's launch/cuBLAS-heuristics overhead.
__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// Median time (us) of f(i) over iters launches, one event pair each, each behind a short spin kernel; i rotates
// the weight copies.
template <typename F>
double median_us(int iters, F f) {
  cudaEvent_t a, b;
  LOWBIT_CUDA_CHECK(cudaEventCreate(&a));
  LOWBIT_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f(i);   // warm-up
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    spin_kernel<<<1, 1>>>(100000);   // ~50 us
    LOWBIT_CUDA_CHECK(cudaEventRecord(a));
    f(i);
    LOWBIT_CUDA_CHECK(cudaEventRecord(b));
    LOWBIT_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  LOWBIT_CUDA_CHECK(cudaEventDestroy(a));
  LOWBIT_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Copies so that one pass over all of them is >= 4x the L2 (at least 2).
int rotation(uint64_t bytes_per_copy) {
  int l2 = 0;
  LOWBIT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const uint64_t want = 4ull * static_cast<uint64_t>(l2);
  return static_cast<int>(std::clamp<uint64_t>((want + bytes_per_copy - 1) / bytes_per_copy, 2, 64));
}

// The runtime's choice for one (format, shape, width, batch) group (kernel_choice.h, as packed_matmul asks it), printed
// above the group's timing rows: the kernel it takes, then each candidate passed over with its reason, one line each.
KernelChoice print_choice(const std::string& what, const LinearProblem& p, std::ostream& out) {
  const KernelChoice c = choose_kernel(p, runtime_gpu());
  out << "choice for " << what << " " << p.n << "x" << p.k << " batch " << p.m << ": " << kernel_name(c.kernel) << "\n";
  for (const auto& [k, why] : c.rejected) out << "    not " << kernel_name(k) << ": " << why << "\n";
  return c;
}

// The fused any-precision GEMM kind of a kernel of the choice.
bool is_gemm_kind(Kernel k, GemmKernel kind) {
  switch (kind) {
    case GemmKernel::TwoTiles: return k == Kernel::AnyPrecTwoTiles;
    case GemmKernel::Staged: return k == Kernel::AnyPrecStaged;
    case GemmKernel::WgmmaWs: return k == Kernel::AnyPrecWgmmaWs;
  }
  return false;
}

// One GEMV path as the benchmark runs it; chosen(): the one packed_matmul takes when its choice is `runtime` (the
// CUDA-core kernels need no scratch, the tensor-core ones run pre-split exactly when kPreSplitInRuntime).
struct Variant {
  GemvPath path;
  bool presplit;
  const char* name;
  bool chosen(GemvPath runtime) const { return path == runtime && (path == GemvPath::Scalar || presplit == kPreSplitInRuntime); }
};

// The runtime's choice per format, shape and batch, kept for the summary tables printed after the raw rows.
struct SummaryCell {
  std::string format;
  int64_t n, k, m;
  double us, cublas_us, copy_fraction;
};

// One markdown table per format: rows the shapes, columns the batches; cells "us (x cuBLAS fp16, of copy bw)".
void print_summary(const std::vector<SummaryCell>& cells, const std::vector<int64_t>& batches, std::ostream& out) {
  std::vector<std::string> formats;
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const SummaryCell& c : cells) {
    if (std::find(formats.begin(), formats.end(), c.format) == formats.end()) formats.push_back(c.format);
    if (std::find(shapes.begin(), shapes.end(), std::make_pair(c.n, c.k)) == shapes.end()) shapes.emplace_back(c.n, c.k);
  }
  char buf[128];
  out << "\nsummary: the path the runtime takes (*), us (speedup over cuBLAS fp16 at the same batch, weight bytes read\n"
         "per second as a fraction of the copy bandwidth)\n";
  for (const std::string& f : formats) {
    out << "\n" << f << "\n\n| shape (n x k) |";
    for (int64_t m : batches) out << " batch " << m << " |";
    out << "\n|---|";
    for (size_t i = 0; i < batches.size(); ++i) out << "---|";
    out << "\n";
    for (const auto& [n, k] : shapes) {
      out << "| " << n << "x" << k << " |";
      for (int64_t m : batches) {
        const auto c = std::find_if(cells.begin(), cells.end(), [&](const SummaryCell& x) {
          return x.format == f && x.n == n && x.k == k && x.m == m;
        });
        if (c == cells.end()) {
          out << " - |";
          continue;
        }
        std::snprintf(buf, sizeof buf, " %.1f (%.2fx, %.2f) |", c->us, c->cublas_us / c->us, c->copy_fraction);
        out << buf;
      }
      out << "\n";
    }
  }
}

}  // namespace

void run_kernel_bench(const KernelBenchOptions& o, std::ostream& out) {
  char line[512];
  const double bw = device_copy_bandwidth();
  std::snprintf(line, sizeof line, "device: %s\ncopy bandwidth (device-to-device, bytes read + written): %.0f GB/s\n",
                device_name().c_str(), bw / 1e9);
  out << line;
  out << "times: median of " << o.iters << " launches (CUDA events around each, queued behind a spin kernel so host\n"
         "overhead is excluded), weights rotated through copies >= 4x the L2\n";
  out << "* = the kernel the runtime takes (kernel_choice.h); above each group of rows, \"choice for <format> <n>x<k> batch\n"
         "<m>: <kernel>\" names it, then one indented \"not <kernel>: <reason>\" line per candidate passed over\n";
  out << "shape (n x k) | kernel | batch | us | cuBLAS fp16 us | speedup | weight GB/s | of copy bw\n";
  cudaStream_t s = nullptr;
  GemmContext ctx(s);
  std::vector<SummaryCell> summary;
  for (const auto& [n, k] : o.shapes) {
    // Baseline: cuBLAS fp16 (fp32 accumulation, fp16 out), the same batches, rotated weights.
    const uint64_t wbytes = static_cast<uint64_t>(n * k) * 2;
    const int rot_h = rotation(wbytes);
    std::vector<DeviceBuffer<__half>> wh;
    for (int i = 0; i < rot_h; ++i) {
      wh.emplace_back(static_cast<size_t>(n * k));
      fill_random_half(wh.back().get(), n * k, 1000 + static_cast<uint64_t>(i), -0.05f, 0.05f);
    }
    const int64_t mmax = *std::max_element(o.batches.begin(), o.batches.end());
    DeviceBuffer<__half> xh(static_cast<size_t>(mmax * k)), yh(static_cast<size_t>(mmax * n));
    fill_random_half(xh.get(), mmax * k, 7, -1.0f, 1.0f);
    DeviceBuffer<float> xf(static_cast<size_t>(mmax * k)), yf(static_cast<size_t>(mmax * n));
    fill_random_float(xf.get(), mmax * k, 8, -1.0f, 1.0f);
    std::vector<double> base;
    for (int64_t m : o.batches) {
      const float alpha = 1.0f, beta = 0.0f;
      base.push_back(median_us(o.iters, [&](int i) {
        cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, wh[static_cast<size_t>(i % rot_h)].get(), CUDA_R_16F,
                                  static_cast<int>(k), xh.get(), CUDA_R_16F, static_cast<int>(k), &beta, yh.get(),
                                  CUDA_R_16F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "bench cuBLAS");
      }));
      std::snprintf(line, sizeof line, "%lldx%lld | cuBLAS fp16 | %lld | %.1f | %.1f | 1.00 | %.0f | %.2f\n",
                    static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m), base.back(),
                    base.back(), static_cast<double>(wbytes) / (base.back() * 1e-6) / 1e9,
                    static_cast<double>(wbytes) / (base.back() * 1e-6) / bw);
      out << line << std::flush;
    }
    auto row = [&](const std::string& kernel, int64_t m, double us, double b_us, uint64_t bytes) {
      std::snprintf(line, sizeof line, "%lldx%lld | %s | %lld | %.1f | %.1f | %.2f | %.0f | %.2f\n",
                    static_cast<long long>(n), static_cast<long long>(k), kernel.c_str(), static_cast<long long>(m), us,
                    b_us, b_us / us, static_cast<double>(bytes) / (us * 1e-6) / 1e9,
                    static_cast<double>(bytes) / (us * 1e-6) / bw);
      out << line << std::flush;
    };
    // The dequantize kernel of the large-batch path alone: bytes read (packed) + written (fp16), against the copy.
    auto dequant_row = [&](const std::string& format, uint64_t read, const std::function<void(int)>& f) {
      const double us = median_us(o.iters, f);
      const double bytes = static_cast<double>(read) + 2.0 * static_cast<double>(n * k);
      std::snprintf(line, sizeof line, "%lldx%lld | %s dequantize to fp16 alone (bytes read + written) | - | %.1f | - | - | %.0f | %.2f\n",
                    static_cast<long long>(n), static_cast<long long>(k), format.c_str(), us, bytes / (us * 1e-6) / 1e9,
                    bytes / (us * 1e-6) / bw);
      out << line << std::flush;
    };
    // The runtime's choice at this shape and batch, kept for the summary under `format`.
    auto record = [&](const std::string& format, int64_t m, double us, double b_us, uint64_t bytes) {
      summary.push_back({format, n, k, m, us, b_us, static_cast<double>(bytes) / (us * 1e-6) / bw});
    };
    // A path's row, marked * and recorded where it is the runtime's choice.
    auto path_row = [&](const std::string& format, const std::string& kernel, bool chosen, int64_t m, double us, double b_us,
                        uint64_t bytes) {
      row(kernel + (chosen ? " *" : ""), m, us, b_us, bytes);
      if (chosen) record(format, m, us, b_us, bytes);
    };
    const std::string f16 = "fp16 (the runtime's linear, fp32 x and out)";
    if (o.fp16)
      for (size_t bi = 0; bi < o.batches.size(); ++bi) {
        const int64_t m = o.batches[bi];
        if (!dense_gemv_fits(wh[0].get(), n, k, m, xf.get())) continue;
        // fp16 weights at batch 1..8: cuBLAS as the runtime calls it (fp32 x converted to fp16 by a kernel of its
        // own, fp32 out), and our GEMV (fp32 x, fp32 out) at each rows-per-warp form; * on the default.
        const Kernel choice = print_choice("fp16", {std::nullopt, n, k, m, 0, kPreSplitInRuntime}, out).kernel;
        const double cub = median_us(o.iters, [&](int i) {
          dense_f16_matmul(wh[static_cast<size_t>(i % rot_h)].get(), n, k, xf.get(), m, yf.get(), ctx);
        });
        const bool ours = choice == Kernel::DenseGemv;
        path_row(f16, "fp16 cuBLAS, fp32 x converted, fp32 out", choice == Kernel::Cublas, m, cub, base[bi], wbytes);
        for (int r : {1, 2, 4}) {
          const double us = median_us(o.iters, [&](int i) {
            dense_f16_gemv(wh[static_cast<size_t>(i % rot_h)].get(), n, k, xf.get(), static_cast<int>(m), nullptr, yf.get(), s, r);
          });
          path_row(f16, "fp16 GEMV, " + std::to_string(r) + " rows per warp", ours && r == dense_gemv_rows_per_warp(n, static_cast<int>(m)),
                   m, us, base[bi], wbytes);
        }
      }
    wh.clear();
    if (o.anyprec && k % 32 == 0) {
      const int rot = rotation(static_cast<uint64_t>(n * k));   // 8 planes = 1 byte per weight
      std::vector<DevicePackedWeight> w;
      for (int i = 0; i < rot; ++i) w.push_back(DevicePackedWeight::random_anyprec(n, k, 50 + static_cast<uint64_t>(i)));
      DeviceBuffer<uint8_t> xfrag(anyprec_xfrag_bytes(k));
      for (int b : o.bits) {
        {
          __half* wd = ctx.weight_scratch(static_cast<size_t>(n * k));
          dequant_row("anyprec " + std::to_string(b) + "-bit", w[0].bytes_read(b),
                      [&](int i) { anyprec_dequant_f16(w[static_cast<size_t>(i % rot)].anyprec(), b, wd, s); });
        }
        for (size_t bi = 0; bi < o.batches.size(); ++bi) {
          const int64_t m = o.batches[bi];
          const std::string ap = "anyprec " + std::to_string(b) + "-bit";
          const Kernel choice = print_choice(ap, {FormatId::AnyPrec, n, k, m, b, kPreSplitInRuntime}, out).kernel;
          if (m > kMaxGemvBatch) {
            __half* wd = ctx.weight_scratch(static_cast<size_t>(n * k));
            const double us = median_us(o.iters, [&](int i) {
              anyprec_dequant_f16(w[static_cast<size_t>(i % rot)].anyprec(), b, wd, s);
              dense_f16_matmul(wd, n, k, xf.get(), m, yf.get(), ctx);
            });
            path_row(ap, ap + " (dequant+cuBLAS)", choice == Kernel::DequantCublas, m, us, base[bi], w[0].bytes_read(b));
            {
              // Every fused kernel that runs at this batch and width; * on the choice's.
              const bool tiles = m <= 2 * kMaxGemvBatch;
              for (GemmKernel kind : {GemmKernel::TwoTiles, GemmKernel::Staged, GemmKernel::WgmmaWs}) {
                if ((kind == GemmKernel::TwoTiles && !tiles) || !anyprec_gemm_serves(b, kind)) continue;
                const double fus = median_us(o.iters, [&](int i) { anyprec_gemm(w[static_cast<size_t>(i % rot)].anyprec(), b, xf.get(), m, yf.get(), ctx, kind); });
                path_row(ap, ap + " (fused GEMM, " + gemm_kernel_name(kind) + ")", is_gemm_kind(choice, kind), m,
                         fus, base[bi], w[0].bytes_read(b));
              }
            }
            continue;
          }
          // Every GEMV path, each labelled; * marks the one the runtime takes (packed_matmul: the choice, with x
          // pre-split when kPreSplitInRuntime; the split kernel's time is included in the pre-split rows).
          static const Variant variants[] = {{GemvPath::Scalar, false, " (CUDA cores)"},
                                             {GemvPath::TensorCore, false, " (tensor cores)"},
                                             {GemvPath::TensorCore, true, " (tensor cores, x pre-split)"},
                                             {GemvPath::TensorCoreRegisterLut, true, " (tensor cores, register tables)"},
                                             {GemvPath::TensorCoreRegisterLutStream, true, " (tensor cores, register tables, streamed)"},
                                             {GemvPath::TensorCoreInt8LutStream, true, " (int8 tensor cores, int8 tables, streamed)"},
                                             {GemvPath::TensorCoreSharedLutStream, true, " (tensor cores, shared tables, streamed)"}};
          const GemvPath runtime = gemv_path_of(choice);
          for (const Variant& v : variants) {
            if (is_register_table(v.path) && b > 4) continue;
            if (is_streamed(v.path) && !anyprec_stream_fits(n, k, static_cast<int>(m))) continue;
            if (v.path == GemvPath::TensorCoreInt8LutStream && (b > 4 || !anyprec_i8_fits(n, k, static_cast<int>(m)))) continue;
            if (v.path == GemvPath::TensorCoreSharedLutStream && (b < 5 || !anyprec_lut_stream_fits(n, k, static_cast<int>(m)))) continue;
            const double us = median_us(o.iters, [&](int i) {
              anyprec_gemv(w[static_cast<size_t>(i % rot)].anyprec(), b, xf.get(), static_cast<int>(m), yf.get(), s,
                           OutlierMode::Fused, v.path, v.presplit ? xfrag.get() : nullptr);
            });
            path_row(ap, ap + v.name, v.chosen(runtime), m, us, base[bi], w[0].bytes_read(b));
          }
        }
      }
      // Mixed widths (anyprec_gemv_mixed: each row at its own width, the planes of the widest read once) for the mixes
      // 3/4/8 and 3/8 whose widths are all among the widths asked, rows given the widths round robin, at the batches
      // from the mix's size to 8.
      // Beside them, in the same run: the runtime's GEMV at each width of the mix with every row at it (the widest
      // is the ratio's baseline), the single-width kernel with the mixed one's arithmetic (tensor cores, shared tables,
      // x pre-split) at the widest, and one runtime GEMV per width over its own rows (what a step costs without the
      // mixed kernel). Bytes read: the widest width's.
      for (const std::vector<int>& mix : {std::vector<int>{3, 4, 8}, std::vector<int>{3, 8}}) {
        if (!std::all_of(mix.begin(), mix.end(), [&](int b) { return std::find(o.bits.begin(), o.bits.end(), b) != o.bits.end(); }))
          continue;
        const int widest = *std::max_element(mix.begin(), mix.end());
        std::string mname;
        for (int b : mix) {
          if (!mname.empty()) mname += '/';
          mname += std::to_string(b);
        }
        const uint64_t bytes = w[0].bytes_read(widest);
        for (size_t bi = 0; bi < o.batches.size(); ++bi) {
          const int64_t m = o.batches[bi];
          if (m < static_cast<int64_t>(mix.size()) || m > kMaxGemvBatch) continue;   // every width of the mix present
          std::vector<int32_t> row_bits(static_cast<size_t>(m));
          std::vector<int64_t> rows_at(9, 0);   // rows at each width
          for (int64_t r = 0; r < m; ++r) {
            row_bits[static_cast<size_t>(r)] = mix[static_cast<size_t>(r) % mix.size()];
            ++rows_at[static_cast<size_t>(row_bits[static_cast<size_t>(r)])];
          }
          const DeviceBuffer<int32_t> bits_d(row_bits);
          double widest_us = 0;
          for (int b : mix) {
            const double us = median_us(o.iters, [&](int i) { packed_matmul(w[static_cast<size_t>(i % rot)], b, xf.get(), m, yf.get(), ctx); });
            row("anyprec " + std::to_string(b) + "-bit, the runtime's GEMV, every row at " + std::to_string(b) + " bits", m, us,
                base[bi], w[0].bytes_read(b));
            if (b == widest) widest_us = us;
          }
          const double twin_us = median_us(o.iters, [&](int i) {
            anyprec_gemv(w[static_cast<size_t>(i % rot)].anyprec(), widest, xf.get(), static_cast<int>(m), yf.get(), s,
                         OutlierMode::Fused, GemvPath::TensorCore, xfrag.get());
          });
          row("anyprec " + std::to_string(widest) + "-bit (tensor cores, x pre-split), every row at " + std::to_string(widest) + " bits",
              m, twin_us, base[bi], bytes);
          const double per_width_us = median_us(o.iters, [&](int i) {
            for (int b : mix) packed_matmul(w[static_cast<size_t>(i % rot)], b, xf.get(), rows_at[static_cast<size_t>(b)], yf.get(), ctx);
          });
          row("anyprec mix " + mname + ", one runtime GEMV per width over its rows", m, per_width_us, base[bi], bytes);
          struct MixedForm {
            GemvPath path;
            bool presplit;
            const char* name;
          };
          for (const MixedForm& f : {MixedForm{GemvPath::Scalar, false, "CUDA cores"}, MixedForm{GemvPath::TensorCore, false, "tensor cores"},
                                     MixedForm{GemvPath::TensorCore, true, "tensor cores, x pre-split"}}) {
            const double us = median_us(o.iters, [&](int i) {
              anyprec_gemv_mixed(w[static_cast<size_t>(i % rot)].anyprec(), widest, bits_d.get(), xf.get(), static_cast<int>(m), yf.get(), s,
                                 f.path, f.presplit ? xfrag.get() : nullptr);
            });
            const std::string kernel = "anyprec mix " + mname + " (mixed-width GEMV, " + f.name + ")";
            row(kernel, m, us, base[bi], bytes);
            std::snprintf(line, sizeof line, "%lldx%lld | %s: %.2fx the %d-bit runtime GEMV, %.2fx one GEMV per width | %lld | - | - | - | - | -\n",
                          static_cast<long long>(n), static_cast<long long>(k), kernel.c_str(), us / widest_us, widest, us / per_width_us,
                          static_cast<long long>(m));
            out << line << std::flush;
          }
        }
      }
    }
    if (o.uniform) {
      // GPTQ / RTN w4, w8 and w3, groups of 128, asymmetric: the formats users bring most. Above batch 8 both the
      // mixed-input GEMM (w4 / w8, Hopper) and dequantize + cuBLAS are timed.
      for (int ub : {4, 8, 3}) {
        const int rot = rotation(static_cast<uint64_t>(n * k) * static_cast<uint64_t>(ub) / 8);
        std::vector<DevicePackedWeight> w;
        for (int i = 0; i < rot; ++i) w.push_back(DevicePackedWeight::random_uniform(n, k, ub, 128, 90 + static_cast<uint64_t>(i)));
        const std::string uf = "uniform w" + std::to_string(ub) + " g128";
        const uint64_t ubytes = w[0].bytes_read(0);
        {
          __half* wd = ctx.weight_scratch(static_cast<size_t>(n * k));
          dequant_row(uf, ubytes, [&](int i) { uniform_dequant_f16(w[static_cast<size_t>(i % rot)].uniform(), wd, s); });
        }
        for (size_t bi = 0; bi < o.batches.size(); ++bi) {
          const int64_t m = o.batches[bi];
          const Kernel choice = print_choice(uf, {FormatId::Uniform, n, k, m, ub, kPreSplitInRuntime, 128}, out).kernel;
          if (m <= kMaxGemvBatch) {
            const double us = median_us(o.iters, [&](int i) {
              uniform_gemv(w[static_cast<size_t>(i % rot)].uniform(), xf.get(), static_cast<int>(m), yf.get(), s);
            });
            path_row(uf, uf + (uniform_gemv_tensor_core(w[0].uniform()) ? " (fp16 tensor cores)"
                               : uniform_gemv_chunked(w[0].uniform()) ? " (CUDA cores, chunked)" : " (CUDA cores, per column)"),
                     choice == Kernel::UniformGemv, m, us, base[bi], ubytes);
            continue;
          }
#ifdef LOWBIT_WITH_CUTLASS
          if (uniform_gemm_serves(w[0].uniform())) {   // each token tile; * on the one the runtime takes at this m
            const int runtime_tile = uniform_fused_tile(m, n) == UniformFusedTile::T128 ? 128 : 256;
            for (const auto& [tile, name] : {std::pair{128, "128-token tile"}, std::pair{256, "256-token tile"}}) {
              const double us = median_us(o.iters, [&](int i) {
                uniform_gemm(w[static_cast<size_t>(i % rot)].uniform(), xf.get(), m, yf.get(), ctx, tile);
              });
              path_row(uf, uf + " (mixed-input wgmma GEMM, " + name + ", x to fp16 included)",
                       choice == Kernel::UniformFused && tile == runtime_tile, m, us, base[bi], ubytes);
            }
          }
#endif
          __half* wd = ctx.weight_scratch(static_cast<size_t>(n * k));
          const double us = median_us(o.iters, [&](int i) {
            uniform_dequant_f16(w[static_cast<size_t>(i % rot)].uniform(), wd, s);
            dense_f16_matmul(wd, n, k, xf.get(), m, yf.get(), ctx);
          });
          path_row(uf, uf + " (dequant+cuBLAS)", choice == Kernel::DequantCublas, m, us, base[bi], ubytes);
        }
      }
    }
    if (o.quik) {
      // QUIK W4A8 / W8A8 / W4 with FP8 activations with k / 16 fp16 outlier columns, the per-token activation
      // quantization included; above batch 8 also the outliers summed in the epilogue instead of their fp16 GEMM.
      struct QuikForm {
        int wbits;
        bool fp8;
        const char* name;
      };
      for (const QuikForm& qfm : {QuikForm{4, false, "QUIK W4A8"}, QuikForm{8, false, "QUIK W8A8"}, QuikForm{4, true, "QUIK W4-FP8"}}) {
        const int wb = qfm.wbits;
        const int rot = rotation(static_cast<uint64_t>(n * k) * static_cast<uint64_t>(wb) / 8);
        std::vector<DevicePackedWeight> w;
        for (int i = 0; i < rot; ++i)
          w.push_back(DevicePackedWeight::random_quik(n, k, wb, k / 16, 110 + static_cast<uint64_t>(i), 8, qfm.fp8));
        const std::string qf = qfm.name;
        const char* gemm_name = qfm.fp8 ? "cuBLASLt FP8 GEMM" : "cuBLAS int8 GEMM";
        for (size_t bi = 0; bi < o.batches.size(); ++bi) {
          const int64_t m = o.batches[bi];
          if (wb == 4 && !qfm.fp8 && m % 16 == 0 && n % 16 == 0 && k % 16 == 0) {   // the plain FP8 GEMM, once per shape and batch
            const double f8 = fp8_gemm_us(n, k, m, o.iters, s, [&](int it, const std::function<void(int)>& f) { return median_us(it, f); });
            if (f8 > 0) row("FP8 cuBLASLt GEMM (e4m3 x e4m3, fp32 accumulation, fp16 out)", m, f8, base[bi], static_cast<uint64_t>(n * k));
          }
#ifdef LOWBIT_WITH_CUTLASS
          if (!qfm.fp8 && m > kMaxGemvBatch && quik_fused_available() && quik_fused_fits(n, w[0].quik().kbp)) {
            // The parts of the fused form alone: the CUTLASS GEMM (unit scales: the same work) and the outliers' fp16
            // GEMM accumulating into y.
            const QuikDevice& q0 = w[0].quik();
            DeviceBuffer<int8_t> xq(static_cast<size_t>(m * q0.kbp));
            DeviceBuffer<__half> xo(static_cast<size_t>(m * q0.no));
            fill_random_bytes(reinterpret_cast<uint8_t*>(xq.get()), m * q0.kbp, 34);
            LOWBIT_CUDA_CHECK(cudaMemset(xo.get(), 0, xo.bytes()));
            QuikFusedArgs fa;
            fa.kind = wb == 8 ? QuikFusedKind::W8A8 : QuikFusedKind::W4A8;
            fa.x = xq.get(), fa.m = m, fa.n = n, fa.k = q0.kbp, fa.y = yf.get();
            const size_t ws_bytes = quik_fused_workspace_bytes(fa);
            DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 16));
            const double g = median_us(o.iters, [&](int i) {
              const QuikDevice& q = w[static_cast<size_t>(i % rot)].quik();
              fa.w = wb == 8 ? static_cast<const void*>(q.wq8) : static_cast<const void*>(q.wq4);
              quik_fused_gemm(fa, ws.get(), ws_bytes, s);
            });
            row(qf + ": the fused CUTLASS GEMM alone", m, g, base[bi], static_cast<uint64_t>(n * q0.kbp));
            const float one = 1.0f;
            const double og = median_us(o.iters, [&](int i) {
              cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                        static_cast<int>(q0.no), &one, w[static_cast<size_t>(i % rot)].quik().outlier_w,
                                        CUDA_R_16F, static_cast<int>(q0.no), xo.get(), CUDA_R_16F, static_cast<int>(q0.no),
                                        &one, yf.get(), CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT),
                           "bench outlier GEMM");
            });
            row(qf + ": the outliers' fp16 GEMM alone (y += it)", m, og, base[bi], static_cast<uint64_t>(n * q0.no) * 2);
          }
#endif
          if (wb == 8 && !qfm.fp8 && m > kMaxGemvBatch) {   // the int8 GEMM alone: what QUIK's GEMM form adds to it
            const int64_t kb = k - k / 16, ldc = (n + 3) / 4 * 4;
            DeviceBuffer<int8_t> xq(static_cast<size_t>(m * kb));
            DeviceBuffer<int32_t> acc(static_cast<size_t>(m * ldc));
            fill_random_bytes(reinterpret_cast<uint8_t*>(xq.get()), m * kb, 33);
            const int32_t one = 1, zero = 0;
            const double us8 = median_us(o.iters, [&](int i) {
              cublas_check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                        static_cast<int>(kb), &one, w[static_cast<size_t>(i % rot)].quik().wq8, CUDA_R_8I,
                                        static_cast<int>(w[0].quik().kbp), xq.get(), CUDA_R_8I, static_cast<int>(kb), &zero,
                                        acc.get(), CUDA_R_32I, static_cast<int>(ldc), CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT),
                           "bench int8 GEMM");
            });
            row("cuBLAS int8 GEMM alone (int32 out, the base columns)", m, us8, base[bi], static_cast<uint64_t>(n * kb));
          }
          const Kernel choice = print_choice(qf, {FormatId::Quik, n, k, m, 0, kPreSplitInRuntime}, out).kernel;
          const double us = median_us(o.iters, [&](int i) {
            quik_matmul(w[static_cast<size_t>(i % rot)].quik(), xf.get(), m, yf.get(), ctx);
          });
          const std::string lib_name = std::string(" (") + gemm_name + ", outlier GEMM, epilogue)";
          const std::string fused_name = " (fused CUTLASS GEMM, then the outliers' GEMM into y)";
          const bool fused = quik_gemm_fused(w[0].quik(), m);
          path_row(qf, qf + (m <= kMaxGemvBatch ? std::string(qfm.fp8 ? " (FP8 GEMV)" : " (dp4a GEMV)")
                             : fused ? fused_name : lib_name),
                   choice == Kernel::QuikGemv || choice == Kernel::QuikGemm, m, us, base[bi], w[0].bytes());
          if (m > kMaxGemvBatch) {   // the other GEMM form (where both serve), timed beside it
            set_knob(Knob::QuikFused, fused ? 0 : 1);
            const bool other_fused = quik_gemm_fused(w[0].quik(), m);
            const double other = median_us(o.iters, [&](int i) {
              quik_matmul(w[static_cast<size_t>(i % rot)].quik(), xf.get(), m, yf.get(), ctx);
            });
            reset_knob(Knob::QuikFused);
            if (other_fused != fused) path_row(qf, qf + (other_fused ? fused_name : lib_name), false, m, other, base[bi], w[0].bytes());
          }
          if (m > kMaxGemvBatch && m <= 512) {   // ~100x slower above 512 tokens: not worth the run's time
            const double in_epi = median_us(o.iters, [&](int i) {
              quik_gemm(w[static_cast<size_t>(i % rot)].quik(), xf.get(), m, yf.get(), ctx, nullptr, OutlierPass::Epilogue);
            });
            path_row(qf, qf + " (" + gemm_name + ", outliers in the epilogue)", false, m, in_epi, base[bi], w[0].bytes());
          }
        }
      }
    }
    if (o.mixed24a && k % 64 == 0) {
      const int rot = rotation(static_cast<uint64_t>(n * k) * 3 / 8);
      std::vector<DevicePackedWeight> w;
      std::vector<Mixed24ADevice> full, dense;
      for (int i = 0; i < rot; ++i) {
        w.push_back(DevicePackedWeight::random_mixed24a(n, k, o.outlier_frac, 70 + static_cast<uint64_t>(i)));
        full.push_back(w.back().mixed24a());
        dense.push_back(w.back().mixed24a_dense());
      }
      const uint64_t all_bytes = w[0].bytes(), dense_bytes = all_bytes - w[0].outlier_bytes();
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.2g%%", 100.0 * o.outlier_frac);
      const std::string m24 = std::string("2/4/16 + ") + pct + " outliers";
      DeviceBuffer<uint8_t> xfrag(mixed24a_xfrag_bytes(k));
      // The outliers as cuSPARSE adds them (the paper's choice), beside our fused and CSR passes.
      std::vector<std::unique_ptr<CusparseOutliers>> sparse;
      if (full[0].rowptr != nullptr) {
        try {
          for (const Mixed24ADevice& f : full) sparse.push_back(std::make_unique<CusparseOutliers>(f));
        } catch (const Error& e) {
          out << "# cuSPARSE outlier rows skipped: " << e.what() << "\n";
          sparse.clear();
        }
      }
      {
        __half* wd = ctx.weight_scratch(static_cast<size_t>(n * k));
        dequant_row("2/4/16", dense_bytes, [&](int i) { mixed24a_dequant_f16(dense[static_cast<size_t>(i % rot)], wd, s); });
        dequant_row(m24, all_bytes, [&](int i) { mixed24a_dequant_f16(full[static_cast<size_t>(i % rot)], wd, s); });
      }
      for (size_t bi = 0; bi < o.batches.size(); ++bi) {
        const int64_t m = o.batches[bi];
        const Kernel choice = print_choice("2/4/16", {FormatId::Mixed24A, n, k, m, 0, kPreSplitInRuntime}, out).kernel;
        if (m <= kMaxGemvBatch) {
          // As the runtime runs it (packed_matmul): the path chosen with the pre-split scratch, passed explicitly.
          const GemvPath runtime = gemv_path_of(choice);
          static const Variant variants[] = {{GemvPath::Scalar, false, " (CUDA cores)"},
                                             {GemvPath::TensorCore, false, " (tensor cores)"},
                                             {GemvPath::TensorCore, true, " (tensor cores, x pre-split)"},
                                             {GemvPath::TensorCoreStream, true, " (tensor cores, streamed)"},
                                             {GemvPath::Dp2aStream, true, " (integer dot products, streamed)"},
                                             {GemvPath::Int8MmaStream, true, " (int8 tensor cores, streamed)"}};
          for (const Variant& v : variants) {
            if (v.path == GemvPath::TensorCoreStream && !mixed24a_stream_fits(n, k, static_cast<int>(m))) continue;
            if (v.path == GemvPath::Dp2aStream && !mixed24a_dp_fits(n, k, static_cast<int>(m))) continue;
            if (v.path == GemvPath::Int8MmaStream && !mixed24a_mma_fits(n, k, static_cast<int>(m))) continue;
            const double p_us = median_us(o.iters, [&](int i) {
              mixed24a_gemv(dense[static_cast<size_t>(i % rot)], xf.get(), static_cast<int>(m), yf.get(), s,
                            OutlierMode::Fused, v.path, v.presplit ? xfrag.get() : nullptr);
            });
            row(std::string("2/4/16 no outliers") + v.name + (v.chosen(runtime) ? " *" : ""), m, p_us, base[bi], dense_bytes);
          }
          if (full[0].rowptr != nullptr) {
            void* frag = kPreSplitInRuntime && mixed24a_path_takes_xfrag(runtime) ? xfrag.get() : nullptr;
            const double f_us = median_us(o.iters, [&](int i) {
              mixed24a_gemv(full[static_cast<size_t>(i % rot)], xf.get(), static_cast<int>(m), yf.get(), s, OutlierMode::Fused,
                            runtime, frag);
            });
            // The runtime's path with its outliers fused (the * above marks that path's dense row): the summary's cell.
            row("2/4/16 + outliers fused", m, f_us, base[bi], all_bytes);
            record(m24, m, f_us, base[bi], all_bytes);
            const double c_us = median_us(o.iters, [&](int i) {
              mixed24a_gemv(full[static_cast<size_t>(i % rot)], xf.get(), static_cast<int>(m), yf.get(), s, OutlierMode::SpMV,
                            runtime, frag);
            });
            row("2/4/16 + outliers CSR SpMV", m, c_us, base[bi], all_bytes);
            if (!sparse.empty()) {
              // The dense GEMV (the runtime's path, the weight without its outliers) then cuSPARSE's y += A x.
              const double sp_us = median_us(o.iters, [&](int i) {
                const size_t r = static_cast<size_t>(i % rot);
                mixed24a_gemv(dense[r], xf.get(), static_cast<int>(m), yf.get(), s, OutlierMode::Fused, runtime, frag);
                sparse[r]->add(xf.get(), static_cast<int>(m), yf.get(), s);
              });
              row(std::string("2/4/16 + outliers cuSPARSE ") + (m == 1 ? "SpMV" : "SpMM") +
                      (sparse[0]->values_fp16() ? " (fp16 values)" : " (fp32 values)"),
                  m, sp_us, base[bi], all_bytes);
            }
          }
        } else {
          __half* wd = ctx.weight_scratch(static_cast<size_t>(n * k));
          const double us = median_us(o.iters, [&](int i) {
            mixed24a_dequant_f16(full[static_cast<size_t>(i % rot)], wd, s);
            dense_f16_matmul(wd, n, k, xf.get(), m, yf.get(), ctx);
          });
          const bool tiles = m <= 2 * kMaxGemvBatch && mixed24a_stream_fits(n, k, kMaxGemvBatch);
          path_row(m24, "2/4/16 + outliers (dequant+cuBLAS)", choice == Kernel::DequantCublas, m, us, base[bi], all_bytes);
          if (tiles) {
            const double t_us = median_us(o.iters, [&](int i) {
              mixed24a_gemv_two_tiles(full[static_cast<size_t>(i % rot)], xf.get(), static_cast<int>(m), yf.get(), s, xfrag.get());
            });
            path_row(m24, "2/4/16 + outliers (fused, two-tile GEMV)", choice == Kernel::Mixed24aTwoTiles, m, t_us, base[bi],
                     all_bytes);
          }
        }
      }
    }
  }
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int64_t> batches(o.batches.begin(), o.batches.end());
  print_summary(summary, batches, out);
}

}  // namespace lowbit::cuda
