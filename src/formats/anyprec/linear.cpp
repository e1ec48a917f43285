// AnyPrecLinear: the CPU LinearOp for an "anyprec" packed weight. One object serves every stored width; each call
// names the width it wants.
//
// forward(): rows are decoded on the fly, a block at a time, from the first b planes and lut_b (no dequantized
// copy of the matrix is kept): for each word of a tile and each of its four bytes, the b plane bytes are spread to
// eight one-byte lanes (a 256-entry table) and shifted into place, giving 8 codes per step — the CPU form of the
// GPU kernel's bit transpose. The decoded block then meets the activations in one sgemm (m > 1) or a dot (m = 1).
//
// forward_ref(): the oracle. Each code is read bit by bit through anyprec_slot (the layout's definition), its
// value looked up in the fp16 LUT (outliers by search of the row's CSR), accumulated in double.
#include <cblas.h>
#include <omp.h>

#include <array>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "formats/anyprec/layout.h"
#include "formats/pack_util.h"

namespace lowbit {
namespace {

// spread[v]: byte lane i (bits 8i..8i+7) holds bit i of v.
constexpr std::array<uint64_t, 256> make_spread() {
  std::array<uint64_t, 256> t{};
  for (int v = 0; v < 256; ++v)
    for (int i = 0; i < 8; ++i) t[static_cast<size_t>(v)] |= static_cast<uint64_t>((v >> i) & 1) << (8 * i);
  return t;
}
constexpr std::array<uint64_t, 256> kSpread = make_spread();

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

class AnyPrecLinear final : public LinearOp {
 public:
  AnyPrecLinear(const PackedWeight& w, const float* bias)
      : LinearOp(w.shape[0], w.shape[1]),
        planes_(static_cast<int>(w.params.at("planes"))),
        widths_(static_cast<uint32_t>(w.params.at("widths"))),
        words_(anyprec_words_per_row(k_)),
        plane_data_(w.parts.at("planes").data),
        bias_(bias) {
    for (int b = kAnyPrecMinBits; b <= planes_; ++b)
      if ((widths_ >> b) & 1u) {
        lut_[static_cast<size_t>(b)] = w.parts.at("lut" + std::to_string(b)).data;
        view_bytes_[static_cast<size_t>(b)] = anyprec_view_bits(w, b) / 8;
      }
    if (w.params.at("sparse") == 1) {
      const int64_t nnz = w.params.at("nnz");
      rowptr_.resize(static_cast<size_t>(n_ + 1));
      col_.resize(static_cast<size_t>(nnz));
      val_.resize(static_cast<size_t>(nnz));
      std::memcpy(rowptr_.data(), w.parts.at("outlier_rowptr").data, rowptr_.size() * 4);
      std::memcpy(col_.data(), w.parts.at("outlier_col").data, col_.size() * 4);
      for (int64_t i = 0; i < nnz; ++i) val_[static_cast<size_t>(i)] = f16_to_f32(element<uint16_t>(w.parts.at("outlier_val"), i));
    }
  }

  uint32_t served_widths() const override { return widths_; }
  uint64_t weight_bytes(int bits) const override { return view_bytes_[static_cast<size_t>(width(bits))]; }

  void forward(const float* x, int64_t m, float* y, int bits) const override {
    const int b = width(bits);
    const int64_t rows_per_block = m == 1 ? 16 : 64;
    const int64_t blocks = (n_ + rows_per_block - 1) / rows_per_block;
#pragma omp parallel if (n_ * k_ * (m == 1 ? 1 : 8) >= (1 << 16))
    {
      std::vector<float> buf(static_cast<size_t>(rows_per_block * k_));
      float lut[256];
#pragma omp for schedule(dynamic, 1)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t r0 = blk * rows_per_block, rows = std::min(rows_per_block, n_ - r0);
        for (int64_t i = 0; i < rows; ++i) decode_row(r0 + i, b, lut, buf.data() + i * k_);
        if (m == 1) {
          for (int64_t i = 0; i < rows; ++i)
            y[r0 + i] = cblas_sdot(static_cast<int>(k_), buf.data() + i * k_, 1, x, 1);
        } else {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(rows),
                      static_cast<int>(k_), 1.0f, x, static_cast<int>(k_), buf.data(), static_cast<int>(k_), 0.0f,
                      y + r0, static_cast<int>(n_));
        }
        if (bias_ != nullptr)
          for (int64_t t = 0; t < m; ++t)
            for (int64_t i = 0; i < rows; ++i) y[t * n_ + r0 + i] += bias_[r0 + i];
      }
    }
  }

  void forward_ref(const float* x, int64_t m, float* y, int bits) const override {
    const int b = width(bits);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t r = 0; r < n_; ++r) {
        double acc = bias_ != nullptr ? bias_[r] : 0.0;
        for (int64_t c = 0; c < k_; ++c) acc += static_cast<double>(x[t * k_ + c]) * value_ref(r, c, b);
        y[t * n_ + r] = static_cast<float>(acc);
      }
  }

 private:
  int width(int bits) const {
    const int b = bits == 0 ? planes_ : bits;
    LOWBIT_CHECK(b >= kAnyPrecMinBits && b <= planes_ && ((widths_ >> b) & 1u), "anyprec linear: width ", bits,
                 " is not served by this weight");
    return b;
  }

  const uint8_t* plane_row(int j, int64_t r) const {
    return plane_data_ + static_cast<size_t>((j * n_ + r) * words_) * 4;
  }

  // Row r of the b-bit view into out[k].
  void decode_row(int64_t r, int b, float* lut, float* out) const {
    const uint8_t* lut16 = lut_[static_cast<size_t>(b)] + static_cast<size_t>(r << b) * 2;
    for (int i = 0; i < (1 << b); ++i) {
      uint16_t h;
      std::memcpy(&h, lut16 + 2 * i, 2);
      lut[i] = f16_to_f32(h);
    }
    const uint8_t* rows[kAnyPrecMaxBits];
    for (int j = 0; j < b; ++j) rows[j] = plane_row(j, r);
    for (int64_t w0 = 0; w0 < words_; w0 += 32) {
      const int64_t nw = std::min<int64_t>(32, words_ - w0), c_tile = w0 * 32;
      for (int64_t t = 0; t < nw; ++t) {
        uint32_t word[kAnyPrecMaxBits];
        for (int j = 0; j < b; ++j) word[j] = load_u32(rows[j] + (w0 + t) * 4);
        for (int u = 0; u < 4; ++u) {
          uint64_t codes = 0;
          for (int j = 0; j < b; ++j) codes |= kSpread[(word[j] >> (8 * u)) & 0xffu] << (b - 1 - j);
          const int64_t c0 = c_tile + u * 8 * nw + 8 * t;
          if (c0 + 8 <= k_) {
            for (int i = 0; i < 8; ++i) out[c0 + i] = lut[(codes >> (8 * i)) & 0xffu];
          } else {
            for (int i = 0; c0 + i < k_; ++i) out[c0 + i] = lut[(codes >> (8 * i)) & 0xffu];
          }
        }
      }
    }
    if (!rowptr_.empty())
      for (int32_t i = rowptr_[static_cast<size_t>(r)]; i < rowptr_[static_cast<size_t>(r + 1)]; ++i)
        out[col_[static_cast<size_t>(i)]] = val_[static_cast<size_t>(i)];
  }

  double value_ref(int64_t r, int64_t c, int b) const {
    if (!rowptr_.empty())
      for (int32_t i = rowptr_[static_cast<size_t>(r)]; i < rowptr_[static_cast<size_t>(r + 1)]; ++i)
        if (col_[static_cast<size_t>(i)] == c) return val_[static_cast<size_t>(i)];
    const PlaneSlot s = anyprec_slot(c, words_);
    uint32_t code = 0;
    for (int j = 0; j < b; ++j) code = (code << 1) | ((load_u32(plane_row(j, r) + s.word * 4) >> s.bit) & 1u);
    uint16_t h;
    std::memcpy(&h, lut_[static_cast<size_t>(b)] + static_cast<size_t>((r << b) + code) * 2, 2);
    return f16_to_f32(h);
  }

  int planes_;
  uint32_t widths_;
  int64_t words_;                               // words per plane row
  const uint8_t* plane_data_;                   // [planes, n, words] uint32, not owned (mapped file)
  std::array<const uint8_t*, kAnyPrecMaxBits + 1> lut_{};   // width -> [n, 2^width] fp16, not owned
  std::array<uint64_t, kAnyPrecMaxBits + 1> view_bytes_{};    // width -> bytes its view reads (anyprec_view_bits)
  const float* bias_;
  std::vector<int32_t> rowptr_, col_;           // outliers (CSR), copied
  std::vector<float> val_;
};

}  // namespace

std::unique_ptr<LinearOp> make_anyprec_linear(const PackedWeight& w, const float* bias, const std::string& where) {
  LOWBIT_CHECK(w.format == FormatId::AnyPrec, where, ": make_anyprec_linear given format '", format_name(w.format), "'");
  return std::make_unique<AnyPrecLinear>(w, bias);
}

}  // namespace lowbit
