// Element types of tensors as they sit in model files. Each type is declared once, in kDTypeTable
// (STYLE habit 1): block size in elements and bytes per block. Plain types have block size 1.
// Packed lowbit formats (any-precision bitplanes, mixed 2/4, QUIK) are added to this table by later issues.
#pragma once
#include <cstdint>
#include <string_view>

namespace lowbit {

enum class DType : uint8_t {
  F32, F16, BF16, F64, I8, I16, I32, I64, U8, BOOL,
  // ggml block-quantized types (GGUF)
  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
  kCount
};

struct DTypeInfo {
  DType type;
  std::string_view name;   // as printed by `lowbit inspect`
  int block_elems;         // elements per block (1 for plain types)
  int block_bytes;         // bytes per block
  bool is_float;           // plain floating type usable as an fp tensor
};

inline constexpr DTypeInfo kDTypeTable[] = {
    {DType::F32, "F32", 1, 4, true},      {DType::F16, "F16", 1, 2, true},
    {DType::BF16, "BF16", 1, 2, true},    {DType::F64, "F64", 1, 8, true},
    {DType::I8, "I8", 1, 1, false},       {DType::I16, "I16", 1, 2, false},
    {DType::I32, "I32", 1, 4, false},     {DType::I64, "I64", 1, 8, false},
    {DType::U8, "U8", 1, 1, false},       {DType::BOOL, "BOOL", 1, 1, false},
    // ggml layouts: see src/io/ggml_quants.h for the block structs (sizes static_asserted there).
    {DType::Q4_0, "Q4_0", 32, 18, false}, {DType::Q4_1, "Q4_1", 32, 20, false},
    {DType::Q5_0, "Q5_0", 32, 22, false}, {DType::Q5_1, "Q5_1", 32, 24, false},
    {DType::Q8_0, "Q8_0", 32, 34, false}, {DType::Q2_K, "Q2_K", 256, 84, false},
    {DType::Q3_K, "Q3_K", 256, 110, false}, {DType::Q4_K, "Q4_K", 256, 144, false},
    {DType::Q5_K, "Q5_K", 256, 176, false}, {DType::Q6_K, "Q6_K", 256, 210, false},
    {DType::Q8_K, "Q8_K", 256, 292, false},
};
static_assert(sizeof(kDTypeTable) / sizeof(kDTypeTable[0]) == static_cast<size_t>(DType::kCount),
              "every DType needs exactly one row in kDTypeTable");

constexpr const DTypeInfo& dtype_info(DType t) { return kDTypeTable[static_cast<size_t>(t)]; }

// Bytes occupied by n elements of type t; returns UINT64_MAX when n is not a multiple of the block size.
constexpr uint64_t dtype_bytes(DType t, uint64_t n) {
  const DTypeInfo& info = dtype_info(t);
  if (n % static_cast<uint64_t>(info.block_elems) != 0) return UINT64_MAX;
  return n / static_cast<uint64_t>(info.block_elems) * static_cast<uint64_t>(info.block_bytes);
}

}  // namespace lowbit
