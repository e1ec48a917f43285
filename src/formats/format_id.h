// Which packed (quantized) linear-weight format a weight is stored in. Code everywhere switches on this enum — the
// compiler checks that every format is handled — and never compares format names: the name is only the spelling in
// a .lowbit file's metadata, parsed once by the reader (parse_format_name) and written by the writer (format_name).
// The rest of what a format is (parameters, parts, CPU linear, GPU support) is its row in formats/format_table.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace lowbit {

enum class FormatId : uint8_t {
  Uniform,    // RTN / GPTQ integers per group (formats/uniform/)
  AnyPrec,    // any-precision bitplanes + per-row LUTs (formats/anyprec/)
  Mixed24,    // 2/4-bit groups, generic layout (formats/mixed24/)
  Mixed24A,   // 2/4-bit groups, the memory-aligned layout (formats/mixed24a/)
  Quik,       // QUIK integer weights + fp16 outlier columns, quantized activations (formats/quik/)
};
inline constexpr int kFormatCount = 5;

// The name a .lowbit file stores ("uniform", "anyprec", "mixed24", "mixed24a", "quik").
constexpr std::string_view format_name(FormatId id) {
  switch (id) {
    case FormatId::Uniform: return "uniform";
    case FormatId::AnyPrec: return "anyprec";
    case FormatId::Mixed24: return "mixed24";
    case FormatId::Mixed24A: return "mixed24a";
    case FormatId::Quik: return "quik";
  }
  return "(invalid format id)";
}

// The inverse of format_name; nullopt for a name no format has.
constexpr std::optional<FormatId> parse_format_name(std::string_view name) {
  for (int i = 0; i < kFormatCount; ++i)
    if (format_name(static_cast<FormatId>(i)) == name) return static_cast<FormatId>(i);
  return std::nullopt;
}

}  // namespace lowbit
