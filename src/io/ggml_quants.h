// Dequantization of ggml block formats found in GGUF files (reference scalar code; bit-exact with ggml's
// dequantize_row_* functions). Block structs are declared in ggml_quants.cpp with static_asserted sizes that
// match kDTypeTable.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace lowbit {

// Converts n elements of type t starting at src to fp32. Plain float types (F32/F16/BF16/F64) are supported too.
// n must be a multiple of the type's block size (throws lowbit::Error otherwise or for an unsupported type).
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes n fp32 values to Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 (ggml reference rounding); used by tests to build
// GGUF fixtures and to round-trip check dequantization. Other types throw.
void quantize_row_ref(DType t, const float* src, void* dst, int64_t n);

}  // namespace lowbit
