// The one table of packed (quantized) linear-weight formats (STYLE habit 1).
//
// A PackedWeight (model/weight_set.h) says which format it is by FormatId (formats/format_id.h); everything else about a format — the
// integer parameters it requires and their valid ranges, the tensors ("parts") that store it with their exact
// dtypes and shapes, the value ranges inside those parts, and the CPU LinearOp that runs it — is found through
// its row here. Readers (io/lowbit_file) and the model loader never look at a format's fields themselves: they
// call validate_packed() once at the entry point and make_packed_linear() to run it. The CUDA backend reads the row's
// `gpu` field to decide whether a model runs there and how, and builds the format's GPU weight view with a switch
// over FormatId (backend_cuda/dispatch/device_weight.h); kernels within a family are chosen by
// backend_cuda/dispatch/kernel_choice.h. Rows, indexed by FormatId: uniform, anyprec, mixed24, mixed24a, quik.
// Adding a format: docs/ARCHITECTURE.md.
//
// Stored bits: the exact number of bits a weight occupies in a file is the sum over its parts of
// numel * dtype bits, with the shapes the format prescribes (padding in the last word of a packed row and shared
// parts such as g_idx included): nothing a file holds for the weight is left out of avg_bits_per_weight.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend_cpu/linear.h"
#include "core/dtype.h"
#include "formats/format_id.h"
#include "model/weight_set.h"

namespace lowbit {

// Written in PackedParam::max where the bound is the weight's own k (input features), e.g. group_size.
inline constexpr int64_t kParamMaxIsK = -1;

// An integer parameter every weight of the format must carry, with its inclusive valid range.
struct PackedParam {
  std::string_view name;
  int64_t min;
  int64_t max;                  // kParamMaxIsK: at most k
  std::string_view meaning;
};

// A tensor that stores part of a packed weight.
struct PackedPart {
  std::string_view name;        // stored in a .lowbit file as "<weight name>.<part name>"
  DType dtype;                  // exact; no conversion on load
  std::string_view shape;       // in the format's notation, for messages and docs ("[n, G]")
  // The part is present iff (params[present_if_param] & present_if_mask) == present_if_value; always present
  // when the name is empty. (A mask lets one bit-set parameter, such as anyprec's `widths`, key several parts.)
  std::string_view present_if_param;
  int64_t present_if_mask;
  int64_t present_if_value;
};

using PackedParams = std::map<std::string, int64_t>;

// How the CUDA backend runs a format.
enum class GpuSupport : uint8_t {
  None,          // no GPU path: a model holding such a weight runs on the CPU
  Dequantized,   // decoded once at load into an fp16 copy that the dense kernels run (no memory saved)
  Packed,        // kernels over the stored bytes (no dequantized copy kept)
};
const char* gpu_support_name(GpuSupport g);

struct PackedFormat {
  FormatId id;                  // == its index in packed_formats()
  std::string_view name;        // format_name(id): the spelling in .lowbit metadata
  std::span<const PackedParam> params;
  std::span<const PackedPart> parts;
  // Exact shape of a present part for a weight of logical shape [n, k] whose params are already range-checked.
  std::vector<int64_t> (*part_shape)(std::string_view part, int64_t n, int64_t k, const PackedParams& params);
  // Checks what dtype and shape cannot bound (zero points, group indices, padding bits, finite scales), on a
  // weight whose params and part shapes are already valid. Throws lowbit::Error("<where>: <problem>").
  void (*check_values)(const PackedWeight& w, const std::string& where);
  // The CPU LinearOp (bias [n] or nullptr, not owned).
  std::unique_ptr<LinearOp> (*make_linear)(const PackedWeight& w, const float* bias, const std::string& where);
  GpuSupport gpu;
  std::string_view gpu_kernels;   // the GPU kernel family that runs it (for docs, `inspect` and messages)
  // For a Packed format whose GPU kernels serve only some of its parameter settings: why a weight with these
  // (range-checked) params stays on the CPU, or nullptr when the GPU runs it. nullptr hook: every setting runs.
  const char* (*gpu_refuses)(const PackedParams& params);
};
// Why the GPU does not run this weight (its format has no GPU path, or its row's gpu_refuses names a setting), or
// nullptr when it does.
const char* gpu_refusal(const PackedWeight& w);

// Every packed format, indexed by FormatId.
std::span<const PackedFormat> packed_formats();
// The row of a format. An id outside the enum (memory corruption, a bad cast) fails loudly.
const PackedFormat& packed_format(FormatId id);
// The row of a format named in a file. Fails with "<where>: unknown packed weight format '<name>' (known: uniform,
// ...)". Only the .lowbit reader parses names.
const PackedFormat& packed_format_named(std::string_view name, const std::string& where);

bool packed_part_present(const PackedPart& part, const PackedParams& params);

// Checks the logical shape, that every required parameter is present and in range (and no unknown one is), and
// that exactly the present parts exist with the exact dtype and shape. Cheap: reads no tensor data.
void check_packed_structure(const PackedWeight& w, const std::string& where);
// check_packed_structure + the format's value checks (one pass over the small parts). Every reader calls this
// once per weight before anything decodes it.
void validate_packed(const PackedWeight& w, const std::string& where);

// The fp16 outliers some formats keep beside their codes (parts outlier_rowptr i32 [n+1], outlier_col i32 or i16
// (uint16 bits) [nnz], outlier_val f16 [nnz], param nnz): row pointers from 0 to nnz, non-decreasing; columns in
// [0, k) and strictly increasing within a row; finite values. For a weight whose structure is already checked.
void check_outlier_csr(const PackedWeight& w, const std::string& where);

// Exact bits the weight occupies when stored (see the file comment). Checks the structure first.
uint64_t packed_stored_bits(const PackedWeight& w, const std::string& where);

// Validates, then builds the format's CPU LinearOp. bias: [n] or nullptr, not owned.
std::unique_ptr<LinearOp> make_packed_linear(const PackedWeight& w, const float* bias, const std::string& where);

// ---- per-format hooks named by the table rows (each defined in its format's folder) -------------------------
// uniform (formats/uniform/layout.h): part shapes are defined beside the table (format_table.cpp), the value
// checks in formats/uniform/unpack_ref.cpp, the LinearOp in formats/uniform/linear.cpp.
std::vector<int64_t> uniform_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params);
void uniform_check_values(const PackedWeight& w, const std::string& where);
// anyprec (formats/anyprec/layout.h): part shapes beside the table, value checks in formats/anyprec/unpack_ref.cpp,
// the LinearOp in formats/anyprec/linear.cpp.
std::vector<int64_t> anyprec_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params);
void anyprec_check_values(const PackedWeight& w, const std::string& where);
// mixed24 (formats/mixed24/layout.h): shapes beside the table, checks in formats/mixed24/unpack_ref.cpp.
std::vector<int64_t> mixed24_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params);
void mixed24_check_values(const PackedWeight& w, const std::string& where);
// mixed24a (formats/mixed24a/layout.h): shapes and checks in formats/mixed24a/unpack_ref.cpp.
std::vector<int64_t> mixed24a_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params);
void mixed24a_check_values(const PackedWeight& w, const std::string& where);
// quik (formats/quik/layout.h): shapes and checks in formats/quik/unpack_ref.cpp.
std::vector<int64_t> quik_part_shape(std::string_view part, int64_t n, int64_t k, const PackedParams& params);
void quik_check_values(const PackedWeight& w, const std::string& where);

}  // namespace lowbit
