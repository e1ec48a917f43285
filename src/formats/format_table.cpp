// The packed-format table and the generic checks every format shares. See format_table.h.
#include "formats/format_table.h"

#include <algorithm>
#include <limits>
#include <set>

#include "core/error.h"
#include "formats/pack_util.h"
#include "formats/anyprec/layout.h"
#include "formats/mixed24/layout.h"
#include "formats/mixed24a/layout.h"
#include "formats/quik/layout.h"
#include "formats/uniform/layout.h"

namespace lowbit {
namespace {

// ---- uniform: integer codes + fp16 scale (+ u8 zero point) per row and group (formats/uniform/layout.h) ----
constexpr int64_t kUniformMaxBits = 8;   // codes and zero points are held one per byte (UniformQuantized, zeros U8)
constexpr PackedParam kUniformParams[] = {
    {"bits", 2, kUniformMaxBits, "bits per code"},
    {"group_size", 1, kParamMaxIsK, "input columns sharing one scale (and zero); k = one group per output row"},
    {"symmetric", 0, 1, "1: no zeros part, the zero point is 2^(bits-1)"},
    {"act_order", 0, 1, "1: the g_idx part gives each input column's group (GPTQ act-order)"},
};
// qweight holds uint32 words; safetensors has no U32, so they are stored as I32 with the same bits.
constexpr PackedPart kUniformParts[] = {
    {"qweight", DType::I32, "[n, ceil(k*bits/32)]", "", 0, 0},
    {"scales", DType::F16, "[n, G]", "", 0, 0},
    {"zeros", DType::U8, "[n, G]", "symmetric", 1, 0},
    {"g_idx", DType::I32, "[k]", "act_order", 1, 1},
};
static_assert(kUniformParams[0].max <= 8, "uniform codes and zero points must fit one byte");
static_assert(dtype_info(DType::I32).block_bytes == 4, "qweight rows are 32-bit words");

// ---- anyprec: bitplanes of nested k-means codes + one fp16 LUT per served width (formats/anyprec/layout.h) ----
constexpr PackedParam kAnyPrecParams[] = {
    {"planes", 2, kAnyPrecMaxBits, "bitplanes stored = the widest served width (the parent)"},
    {"widths", 4, 510, "bit set of the served widths: bit b set = a b-bit view exists (2 <= b <= planes)"},
    {"sparse", 0, 1, "1: fp16 outliers in CSR (outlier_rowptr, outlier_col, outlier_val) override the LUT value"},
    {"nnz", 0, int64_t{1} << 40, "number of outliers (0 unless sparse; at most n*k)"},
};
constexpr PackedPart kAnyPrecParts[] = {
    {"planes", DType::I32, "[planes, n, ceil(k/32)]", "", 0, 0},
    {"lut2", DType::F16, "[n, 4]", "widths", 1 << 2, 1 << 2},
    {"lut3", DType::F16, "[n, 8]", "widths", 1 << 3, 1 << 3},
    {"lut4", DType::F16, "[n, 16]", "widths", 1 << 4, 1 << 4},
    {"lut5", DType::F16, "[n, 32]", "widths", 1 << 5, 1 << 5},
    {"lut6", DType::F16, "[n, 64]", "widths", 1 << 6, 1 << 6},
    {"lut7", DType::F16, "[n, 128]", "widths", 1 << 7, 1 << 7},
    {"lut8", DType::F16, "[n, 256]", "widths", 1 << 8, 1 << 8},
    {"outlier_rowptr", DType::I32, "[n + 1]", "sparse", 1, 1},
    {"outlier_col", DType::I32, "[nnz]", "sparse", 1, 1},
    {"outlier_val", DType::F16, "[nnz]", "sparse", 1, 1},
};

// ---- mixed24: 2/4-bit groups of 16 input columns, two-order 2-bit scales, 2-bit-only outliers ----------------
constexpr PackedParam kMixed24Params[] = {
    {"groups4", 0, kParamMaxIsK, "number of 4-bit input-column groups (the rest are 2-bit)"},
    {"sparse", 0, 1, "1: fp16 outliers in CSR with 16-bit column indices, only inside 2-bit groups"},
    {"nnz", 0, int64_t{1} << 40, "number of outliers (0 unless sparse; at most n*k)"},
};
constexpr PackedPart kMixed24Parts[] = {
    {"group_bits", DType::U8, "[G]", "", 0, 0},
    {"qweight", DType::I32, "[n, G2 + 2 G4]", "", 0, 0},
    {"meta2", DType::I32, "[n, ceil(6 G2 / 32)]", "", 0, 0},
    {"ss2", DType::F16, "[ceil(n/16), G2]", "", 0, 0},
    {"sm2", DType::F16, "[ceil(n/16), G2]", "", 0, 0},
    {"scale4", DType::F16, "[n, G4]", "", 0, 0},
    {"zero4", DType::I32, "[n, ceil(4 G4 / 32)]", "", 0, 0},
    {"outlier_rowptr", DType::I32, "[n + 1]", "sparse", 1, 1},
    {"outlier_col", DType::I16, "[nnz]", "sparse", 1, 1},
    {"outlier_val", DType::F16, "[nnz]", "sparse", 1, 1},
};

// ---- mixed24a: the memory-aligned 2/4-bit layout (sec. 3.3): units [2,2,2,4] of permuted groups ----------------
constexpr PackedParam kMixed24AParams[] = {
    {"sparse", 0, 1, "1: fp16 outliers in CSR with 16-bit stored-column indices; the dense code there is its zero"},
    {"nnz", 0, int64_t{1} << 40, "number of outliers (0 unless sparse; at most n*k)"},
};
constexpr PackedPart kMixed24AParts[] = {
    {"perm", DType::I16, "[G]", "", 0, 0},
    {"qa", DType::I32, "[n, U, 4]", "", 0, 0},
    {"qb", DType::I32, "[n, U]", "", 0, 0},
    {"meta2", DType::I16, "[n, U]", "", 0, 0},
    {"meta4", DType::U8, "[n, U]", "", 0, 0},
    {"ss2", DType::F16, "[ceil(n/16), 3U]", "", 0, 0},
    {"sm2", DType::F16, "[ceil(n/16), 3U]", "", 0, 0},
    {"ss4", DType::F16, "[ceil(n/16), U]", "", 0, 0},
    {"sm4", DType::F16, "[ceil(n/16), U]", "", 0, 0},
    {"outlier_rowptr", DType::I32, "[n + 1]", "sparse", 1, 1},
    {"outlier_col", DType::I16, "[nnz]", "sparse", 1, 1},
    {"outlier_val", DType::F16, "[nnz]", "sparse", 1, 1},
};

// ---- quik: signed symmetric integer weights for an int8/int4 tensor-core GEMM + fp16 outlier input columns -------
constexpr PackedParam kQuikParams[] = {
    {"wbits", 4, 8, "weight code bits: 4 (qweight4, two per byte) or 8 (qweight8)"},
    {"abits", 4, 16, "activation bits at run time: 4 or 8 (per-token asymmetric integers), 16 (not quantized)"},
    {"act_fp8", 0, 1, "1: activations FP8-E4M3 with a per-token scale (wbits 4, abits 8)"},
    {"outliers", 0, kParamMaxIsK, "fp16 outlier input columns"},
};
constexpr PackedPart kQuikParts[] = {
    {"qweight8", DType::I8, "[n, k - outliers]", "wbits", 8, 8},
    {"qweight4", DType::U8, "[n, ceil((k - outliers) / 2)]", "wbits", 4, 4},
    {"scale", DType::F16, "[n]", "", 0, 0},
    {"wreduced", DType::F32, "[n]", "", 0, 0},
    {"outlier_idx", DType::I32, "[outliers]", "", 0, 0},
    {"outlier_w", DType::F16, "[n, outliers]", "", 0, 0},
};

// The QUIK GPU kernels run every activation form the format stores (integer, FP8, A16); only a weight without its
// activation parameters stays on the CPU (whose reader then names what is missing).
const char* quik_gpu_refuses(const PackedParams& p) {
  if (p.find("act_fp8") == p.end() || p.find("abits") == p.end()) return "its activation parameters are missing";
  return nullptr;
}

constexpr PackedFormat kPackedFormats[] = {
    {FormatId::Uniform, format_name(FormatId::Uniform), kUniformParams, kUniformParts, &uniform_part_shape,
     &uniform_check_values, &make_uniform_linear, GpuSupport::Packed,
     "backend_cuda/uniform: CUDA-core GEMV over the stored bit streams (every width), dequantize + cuBLAS", nullptr},
    {FormatId::AnyPrec, format_name(FormatId::AnyPrec), kAnyPrecParams, kAnyPrecParts, &anyprec_part_shape,
     &anyprec_check_values, &make_anyprec_linear, GpuSupport::Packed,
     "backend_cuda/anyprec: bitplane GEMVs (int8 / fp16 tensor cores, CUDA cores), fused GEMMs, dequantize + cuBLAS",
     nullptr},
    {FormatId::Mixed24, format_name(FormatId::Mixed24), kMixed24Params, kMixed24Parts, &mixed24_part_shape,
     &mixed24_check_values, &make_mixed24_linear, GpuSupport::Dequantized, "fp16 copy: dense GEMV / cuBLAS", nullptr},
    {FormatId::Mixed24A, format_name(FormatId::Mixed24A), kMixed24AParams, kMixed24AParts, &mixed24a_part_shape,
     &mixed24a_check_values, &make_mixed24a_linear, GpuSupport::Packed,
     "backend_cuda/mixed24a: integer-dot and int8 / fp16 tensor-core GEMVs, two-tile GEMV, dequantize + cuBLAS",
     nullptr},
    {FormatId::Quik, format_name(FormatId::Quik), kQuikParams, kQuikParts, &quik_part_shape, &quik_check_values,
     &make_quik_linear, GpuSupport::Packed,
     "backend_cuda/quik: per-token int8 / FP8 / fp16 activations, GEMV (exact integer sums), cuBLAS int8 / cuBLASLt FP8 "
     "/ fp16 GEMM, outlier GEMM, epilogue",
     &quik_gpu_refuses},
};
static_assert(std::size(kPackedFormats) == kFormatCount, "one row per FormatId");

// Compile-time consistency of the table: unique format names, unique part and parameter names within a format,
// and every conditional part keyed on a parameter the format declares.
constexpr bool table_is_consistent() {
  for (size_t i = 0; i < std::size(kPackedFormats); ++i) {
    const PackedFormat& f = kPackedFormats[i];
    // (The hooks are addresses of functions, never null; comparing them in a constant expression is not portable:
    // GCC rejects it under -fsanitize=undefined.)
    if (f.name.empty() || static_cast<size_t>(f.id) != i || f.name != format_name(f.id)) return false;
    if ((f.gpu == GpuSupport::None) != f.gpu_kernels.empty()) return false;
    for (size_t j = 0; j < i; ++j)
      if (kPackedFormats[j].name == f.name) return false;
    for (size_t a = 0; a < f.params.size(); ++a) {
      if (f.params[a].max != kParamMaxIsK && f.params[a].max < f.params[a].min) return false;
      for (size_t b = 0; b < a; ++b)
        if (f.params[a].name == f.params[b].name) return false;
    }
    for (size_t a = 0; a < f.parts.size(); ++a) {
      for (size_t b = 0; b < a; ++b)
        if (f.parts[a].name == f.parts[b].name) return false;
      if (f.parts[a].present_if_param.empty()) continue;
      bool declared = false;
      for (const PackedParam& p : f.params) declared = declared || p.name == f.parts[a].present_if_param;
      if (!declared) return false;
    }
  }
  return true;
}
static_assert(table_is_consistent(), "kPackedFormats: rows out of FormatId order, duplicate names, or a part keyed on an undeclared parameter");

std::string known_formats() {
  std::string out;
  for (const PackedFormat& f : kPackedFormats) {
    if (!out.empty()) out += ", ";
    out += f.name;
  }
  return out;
}

std::string param_names(const PackedFormat& f) {
  std::string out;
  for (const PackedParam& p : f.params) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

std::string part_names(const PackedFormat& f) {
  std::string out;
  for (const PackedPart& p : f.parts) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

const PackedPart* find_part(const PackedFormat& f, std::string_view name) {
  for (const PackedPart& p : f.parts)
    if (p.name == name) return &p;
  return nullptr;
}

uint64_t numel_of(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

std::span<const PackedFormat> packed_formats() { return kPackedFormats; }

const char* gpu_support_name(GpuSupport g) {
  switch (g) {
    case GpuSupport::None: return "none (CPU only)";
    case GpuSupport::Dequantized: return "fp16 copy";
    case GpuSupport::Packed: return "packed kernels";
  }
  return "(invalid)";
}

const PackedFormat& packed_format(FormatId id) {
  const auto i = static_cast<size_t>(id);
  LOWBIT_CHECK(i < std::size(kPackedFormats), "invalid packed weight format id ", i, " (known: ", known_formats(), ")");
  return kPackedFormats[i];
}

const char* gpu_refusal(const PackedWeight& w) {
  const PackedFormat& f = packed_format(w.format);
  if (f.gpu == GpuSupport::None) return "its format has no GPU kernels";
  return f.gpu_refuses != nullptr ? f.gpu_refuses(w.params) : nullptr;
}

const PackedFormat& packed_format_named(std::string_view name, const std::string& where) {
  const std::optional<FormatId> id = parse_format_name(name);
  if (!id) fail(where, ": unknown packed weight format '", name, "' (known: ", known_formats(), ")");
  return packed_format(*id);
}

bool packed_part_present(const PackedPart& part, const PackedParams& params) {
  if (part.present_if_param.empty()) return true;
  const auto it = params.find(std::string(part.present_if_param));
  return it != params.end() && (it->second & part.present_if_mask) == part.present_if_value;
}

// ---- uniform part shapes (the packed layout of formats/uniform/layout.h) --------------------------------------
std::vector<int64_t> uniform_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params) {
  const int64_t bits = params.at("bits");
  const int64_t groups = (k + params.at("group_size") - 1) / params.at("group_size");
  if (part == "qweight") return {n, (k * bits + 31) / 32};  // each row's bit stream padded to whole words
  if (part == "scales" || part == "zeros") return {n, groups};
  if (part == "g_idx") return {k};
  fail("uniform_part_shape: no part '", part, "'");  // unreachable: callers pass names from the table
}

// ---- anyprec part shapes (formats/anyprec/layout.h) -----------------------------------------------------------
std::vector<int64_t> anyprec_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params) {
  if (part == "planes") return {params.at("planes"), n, anyprec_words_per_row(k)};
  if (part.size() == 4 && part.substr(0, 3) == "lut") return {n, int64_t{1} << (part[3] - '0')};
  if (part == "outlier_rowptr") return {n + 1};
  if (part == "outlier_col" || part == "outlier_val") return {params.at("nnz")};
  fail("anyprec_part_shape: no part '", part, "'");  // unreachable: callers pass names from the table
}

// ---- mixed24 part shapes (formats/mixed24/layout.h) -----------------------------------------------------------
std::vector<int64_t> mixed24_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params) {
  const int64_t G = (k + kMixedGroup - 1) / kMixedGroup, G4 = params.at("groups4"), G2 = G - G4;
  const int64_t RG = (n + kMixedRowGroup - 1) / kMixedRowGroup;
  if (part == "group_bits") return {G};
  if (part == "qweight") return {n, G2 + 2 * G4};
  if (part == "meta2") return {n, (6 * G2 + 31) / 32};
  if (part == "ss2" || part == "sm2") return {RG, G2};
  if (part == "scale4") return {n, G4};
  if (part == "zero4") return {n, (4 * G4 + 31) / 32};
  if (part == "outlier_rowptr") return {n + 1};
  if (part == "outlier_col" || part == "outlier_val") return {params.at("nnz")};
  fail("mixed24_part_shape: no part '", part, "'");  // unreachable
}

void check_packed_structure(const PackedWeight& w, const std::string& where) {
  const PackedFormat& f = packed_format(w.format);
  // Logical shape: [n, k], both positive and small enough that n*k and k*bits cannot overflow.
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  LOWBIT_CHECK(w.shape.size() == 2 && w.shape[0] > 0 && w.shape[1] > 0 && w.shape[0] < kMaxDim &&
                   w.shape[1] < kMaxDim,
               where, ": ", f.name, " weight needs a logical shape [n, k] of positive sizes below 2^31, got ",
               shape_str(w.shape));
  const int64_t n = w.shape[0], k = w.shape[1];

  for (const PackedParam& p : f.params) {
    const auto it = w.params.find(std::string(p.name));
    LOWBIT_CHECK(it != w.params.end(), where, ": ", f.name, " weight has no parameter '", p.name, "' (",
                 p.meaning, ")");
    const int64_t max = p.max == kParamMaxIsK ? k : p.max;
    LOWBIT_CHECK(it->second >= p.min && it->second <= max, where, ": parameter ", p.name, " = ", it->second,
                 " is out of range [", p.min, ", ", max, "]", p.max == kParamMaxIsK ? " (k)" : "");
  }
  for (const auto& [name, value] : w.params) {
    const bool known = std::any_of(f.params.begin(), f.params.end(), [&](const PackedParam& p) { return p.name == name; });
    LOWBIT_CHECK(known, where, ": unknown parameter '", name, "' for format ", f.name, " (it takes ", param_names(f),
                 ")");
  }

  for (const auto& [name, view] : w.parts) {
    const PackedPart* part = find_part(f, name);
    LOWBIT_CHECK(part != nullptr, where, ": unknown part '", name, "' for format ", f.name, " (parts: ",
                 part_names(f), ")");
    LOWBIT_CHECK(packed_part_present(*part, w.params), where, ": part ", name, " must be absent when ",
                 part->present_if_param, " = ", w.params.at(std::string(part->present_if_param)));
  }
  for (const PackedPart& part : f.parts) {
    if (!packed_part_present(part, w.params)) continue;
    const auto it = w.parts.find(std::string(part.name));
    LOWBIT_CHECK(it != w.parts.end(), where, ": missing part ", part.name, " (", dtype_info(part.dtype).name, " ",
                 part.shape, ")");
    const TensorView& v = it->second;
    LOWBIT_CHECK(v.dtype == part.dtype, where, ": part ", part.name, " has dtype ", dtype_info(v.dtype).name,
                 ", format ", f.name, " needs ", dtype_info(part.dtype).name);
    const std::vector<int64_t> shape = f.part_shape(part.name, n, k, w.params);
    LOWBIT_CHECK(v.shape == shape, where, ": part ", part.name, " has shape ", shape_str(v.shape), ", format ",
                 f.name, " needs ", part.shape, " = ", shape_str(shape));
    const uint64_t bytes = dtype_bytes(part.dtype, numel_of(shape));
    LOWBIT_CHECK(v.nbytes == bytes && (bytes == 0 || v.data != nullptr), where, ": part ", part.name, " holds ",
                 v.nbytes, " bytes, its shape needs ", bytes);
  }
}

void check_outlier_csr(const PackedWeight& w, const std::string& where) {
  const int64_t n = w.shape[0], k = w.shape[1], nnz = w.params.at("nnz");
  const TensorView& rp = w.parts.at("outlier_rowptr");
  const TensorView& col = w.parts.at("outlier_col");
  const TensorView& val = w.parts.at("outlier_val");
  auto column = [&](int64_t i) -> int64_t {
    return col.dtype == DType::I16 ? int64_t{element<uint16_t>(col, i)} : int64_t{element<int32_t>(col, i)};
  };
  LOWBIT_CHECK(element<int32_t>(rp, 0) == 0 && element<int32_t>(rp, n) == nnz, where,
               ": part outlier_rowptr must start at 0 and end at nnz = ", nnz);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t a = element<int32_t>(rp, r), e = element<int32_t>(rp, r + 1);
    LOWBIT_CHECK(a <= e && e <= nnz, where, ": part outlier_rowptr [", r + 1, "] = ", e,
                 " is below the previous entry or past nnz");
    for (int64_t i = a; i < e; ++i) {
      const int64_t c = column(i);
      LOWBIT_CHECK(c >= 0 && c < k && (i == a || c > column(i - 1)), where, ": part outlier_col [", i, "] = ", c,
                   " is outside [0, k) or not increasing within row ", r);
      LOWBIT_CHECK((element<uint16_t>(val, i) & 0x7c00u) != 0x7c00u, where, ": part outlier_val [", i, "] is not finite");
    }
  }
}

void validate_packed(const PackedWeight& w, const std::string& where) {
  check_packed_structure(w, where);
  packed_format(w.format).check_values(w, where);
}

uint64_t packed_stored_bits(const PackedWeight& w, const std::string& where) {
  check_packed_structure(w, where);
  const PackedFormat& f = packed_format(w.format);
  uint64_t bits = 0;
  for (const PackedPart& part : f.parts) {
    if (!packed_part_present(part, w.params)) continue;
    bits += 8 * dtype_bytes(part.dtype, numel_of(f.part_shape(part.name, w.shape[0], w.shape[1], w.params)));
  }
  return bits;
}

std::unique_ptr<LinearOp> make_packed_linear(const PackedWeight& w, const float* bias, const std::string& where) {
  const PackedFormat& f = packed_format(w.format);  // fails loudly on an unknown name
  validate_packed(w, where);
  return f.make_linear(w, bias, where);
}

}  // namespace lowbit
