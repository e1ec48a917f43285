// Packed weights on the device, stored exactly as in the file (no dequantized copy is kept): DevicePackedWeight owns
// the parts, and hands each format's kernels their view (AnyPrecDevice, Mixed24ADevice, UniformDevice, QuikDevice). Formats whose row in the
// format table (formats/format_table.h) says GpuSupport::Packed are served; others are refused with their name.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend_cuda/common/common.h"
#include "model/weight_set.h"

namespace lowbit::cuda {

// Device views (non-owning) of one packed weight, one per format.
struct AnyPrecDevice {
  int64_t n = 0, k = 0, words = 0;         // words = 32-bit words per plane row
  int planes = 0;                           // parent width P
  uint32_t widths = 0;                      // bit b: width b served
  const uint32_t* plane_data = nullptr;     // [P, n, words]
  const __half* lut[9] = {};                // lut[b]: [n, 2^b] for every served b
  // Derived at upload for the served widths 2..4 (int8_tables.h; the int8 GEMV, GemvPath::TensorCoreInt8LutStream):
  // lut8[b] [n16, 2^b] int8 centroids and lut8_scale[b] [n16] their row scales, n16 = n rounded up to 16 (zeros).
  // 4 bits in two pieces (int8_tables.h, i8_table_row2): lut8[4] the hi and lut8_lo4 the lo bytes, each in i8_split16's form.
  const int8_t* lut8[5] = {};
  const float* lut8_scale[5] = {};
  const int8_t* lut8_lo4 = nullptr;
  const int32_t* rowptr = nullptr;          // CSR of outliers, or null
  const int32_t* col = nullptr;
  const __half* val = nullptr;
  int64_t nnz = 0;
};

struct Mixed24ADevice {
  int64_t n = 0, k = 0;
  const uint16_t* perm = nullptr;           // [k/16]
  const uint4* qa = nullptr;                // [n, U]
  const uint32_t* qb = nullptr;             // [n, U]
  const uint16_t* meta2 = nullptr;          // [n, U]
  const uint8_t* meta4 = nullptr;           // [n, U]
  const __half* ss2 = nullptr;              // [RG, 3U]
  const __half* sm2 = nullptr;
  const __half* ss4 = nullptr;              // [RG, U]
  const __half* sm4 = nullptr;
  const int32_t* rowptr = nullptr;          // CSR of outliers (stored columns), or null
  const uint16_t* col = nullptr;
  const __half* val = nullptr;
  int64_t nnz = 0;
};

struct UniformDevice {
  int64_t n = 0, k = 0;
  int bits = 0;
  int64_t words = 0;                        // 32-bit words per row of qweight: ceil(k * bits / 32)
  int64_t gs = 0, G = 0;                    // group size (k: per channel) and groups per row
  const uint32_t* qweight = nullptr;        // [n, words] each row's codes as one little-endian bit stream
  const __half* scales = nullptr;           // [n, G]
  const uint8_t* zeros = nullptr;           // [n, G], or null (symmetric: z = 2^(bits-1))
  const int32_t* g_idx = nullptr;           // [k] group of each column (act-order), or null (group = c / gs)
  // Derived at upload where the mixed-input GEMM serves the weight (uniform_gemm_serves), else null:
  const __half* scales_mn = nullptr;        // [G, n] the scales, rows fastest
  const __half* zero_terms_mn = nullptr;    // [G, n] fp16(-z * scale)
};

// QUIK (formats/quik/layout.h), every activation form (integer abits 4 / 8, FP8 with W4, A16). The codes are re-laid at upload with each row padded to kbp
// (a multiple of 32) so that every row starts 16-byte aligned: the same bytes per row plus the padding (zero codes),
// not a second copy.
struct QuikDevice {
  int64_t n = 0, k = 0, kb = 0, kbp = 0, no = 0;   // kb base columns, padded to kbp; no outlier columns
  int wbits = 8, abits = 8;                 // abits 16: activations not quantized
  bool act_fp8 = false;                     // FP8-E4M3 activations (wbits 4, abits 8)
  const int8_t* wq8 = nullptr;              // wbits 8: [n, kbp]
  const uint8_t* wq4 = nullptr;             // wbits 4: [n, kbp / 2], base column 2j in the low nibble of byte j
  const __half* scale = nullptr;            // [n] sw
  const float* wreduced = nullptr;          // [n]
  const int32_t* base_idx = nullptr;        // [kb] original index of each base column (increasing)
  const int32_t* outlier_idx = nullptr;     // [no]
  const __half* outlier_w = nullptr;        // [n, no]
};

// The parts of a packed weight copied to the device as stored (validated on the host first by the reader).
class DevicePackedWeight {
 public:
  explicit DevicePackedWeight(const PackedWeight& w);
  // Random weights of the real layouts generated on the device (benchmarks of shapes that are not on disk; content
  // does not change the work): an 8-bit anyprec parent serving 2..8 (k a multiple of 32), or a mixed24a weight with
  // a random group permutation and `outlier_frac` fp16 outliers per row (k a multiple of 64).
  static DevicePackedWeight random_anyprec(int64_t n, int64_t k, uint64_t seed);
  static DevicePackedWeight random_mixed24a(int64_t n, int64_t k, double outlier_frac, uint64_t seed);
  // A uniform weight of `bits` (2..8) with groups of `group` columns, asymmetric, without g_idx.
  static DevicePackedWeight random_uniform(int64_t n, int64_t k, int bits, int64_t group, uint64_t seed);
  // A QUIK weight (wbits 4 or 8; abits 4, 8 or 16; FP8 activations with W4A8) with `outliers` fp16 outlier columns
  // (the first ones: where they are does not change the work).
  static DevicePackedWeight random_quik(int64_t n, int64_t k, int wbits, int64_t outliers, uint64_t seed, int abits = 8,
                                        bool act_fp8 = false);
  // The rows of several anyprec weights stacked into one (q/k/v or gate/up as one GEMV, outputs side by side): the
  // same input width, parent, served widths and outlier presence required, else null. Planes [P, sum n, W], LUTs and
  // the CSR outliers concatenated in order.
  static std::unique_ptr<DevicePackedWeight> concat_rows(const std::vector<const DevicePackedWeight*>& ws);
  // The same weight without its outliers (a view sharing the parts): for timing the dense kernel alone.
  Mixed24ADevice mixed24a_dense() const;
  FormatId format() const { return format_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  uint32_t served_widths() const;           // anyprec: its widths; others 0
  uint64_t bytes() const;                   // device bytes held
  uint64_t bytes_read(int bits) const;      // bytes one GEMV at that width reads
  uint64_t outlier_bytes() const;           // bytes of the CSR outlier parts (0 without)
  AnyPrecDevice anyprec() const;            // throws unless format() == FormatId::AnyPrec
  Mixed24ADevice mixed24a() const;          // throws unless format() == FormatId::Mixed24A
  UniformDevice uniform() const;            // throws unless format() == FormatId::Uniform
  QuikDevice quik() const;                  // throws unless format() == FormatId::Quik
  // quik: the outlier columns, as uploaded (a host copy: which weights can share one activation quantization).
  const std::vector<int32_t>& quik_outlier_columns() const { return quik_outliers_; }

 private:
  DevicePackedWeight() = default;
  const uint8_t* part(const std::string& name) const;
  template <typename View>
  void view_outliers(View& d) const;   // the CSR outlier parts, when the weight has them
  // anyprec: the int8 tables of the served widths 2..4 (parts "derived_lut8_<b>", "derived_lut8s_<b>") from the fp16
  // LUTs; rebuilt, never concatenated, by concat_rows (their rows are padded to 16).
  void derive_int8_tables();
  void derive_uniform_mn_operands();   // where uniform_gemm_serves
  // quik: the codes with rows padded to a multiple of 32 columns ("derived_wq"; the stored qweight part is not
  // uploaded) and the base columns' indices ("derived_base_idx").
  void upload_quik(const PackedWeight& w);
  FormatId format_ = FormatId::AnyPrec;
  int64_t n_ = 0, k_ = 0;
  std::map<std::string, int64_t> params_;
  std::map<std::string, DeviceBuffer<uint8_t>> parts_;
  std::vector<int32_t> quik_outliers_;
};

// Device-side random fills (splitmix64 of seed and index): bytes, and fp16 / fp32 values uniform in [lo, hi).
void fill_random_bytes(void* p, int64_t nbytes, uint64_t seed, cudaStream_t s = nullptr);
void fill_random_half(__half* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t s = nullptr);
void fill_random_float(float* p, int64_t count, uint64_t seed, float lo, float hi, cudaStream_t s = nullptr);

}  // namespace lowbit::cuda
