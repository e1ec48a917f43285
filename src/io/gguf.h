// GGUF v2/v3 reader (memory-mapped, zero copy). Spec: ggml/docs/gguf.md.
// Every count, length and offset read from the file is checked against the file size before use;
// a bad file raises lowbit::Error("<path>: <problem>") and never reads out of bounds.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/mmap_file.h"
#include "core/tensor.h"

namespace lowbit {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12
};

struct GgufValue {
  GgufType type = GgufType::U8;
  // Scalars: integers widen to int64 (u64 values above INT64_MAX are rejected), floats to double.
  std::variant<int64_t, double, bool, std::string> scalar;
  GgufType array_type = GgufType::U8;      // element type when type == ARRAY (nested arrays are rejected)
  std::vector<int64_t> ints;               // ARRAY of integer/bool type
  std::vector<double> floats;              // ARRAY of float type
  std::vector<std::string> strings;        // ARRAY of STRING
};

// Constructors for writing metadata (tests, exporters).
inline GgufValue gguf_int(GgufType t, int64_t v) {
  GgufValue x;
  x.type = t;
  x.scalar = v;
  return x;
}
inline GgufValue gguf_float(GgufType t, double v) {
  GgufValue x;
  x.type = t;
  x.scalar = v;
  return x;
}
inline GgufValue gguf_bool(bool v) {
  GgufValue x;
  x.type = GgufType::BOOL;
  x.scalar = v;
  return x;
}
inline GgufValue gguf_string(const std::string& v) {
  GgufValue x;
  x.type = GgufType::STRING;
  x.scalar = v;
  return x;
}
inline GgufValue gguf_array(GgufType elem, std::vector<int64_t> ints, std::vector<double> floats = {},
                            std::vector<std::string> strings = {}) {
  GgufValue x;
  x.type = GgufType::ARRAY;
  x.array_type = elem;
  x.ints = std::move(ints);
  x.floats = std::move(floats);
  x.strings = std::move(strings);
  return x;
}

struct GgufTensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;   // outermost first (ggml ne[] reversed): a linear weight is [n_out, k_in]
  uint64_t offset = 0;          // absolute offset in the file (data section start + relative offset)
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;
};

class GgufFile {
 public:
  static GgufFile open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;  // nullptr when absent
  std::shared_ptr<MappedFile> file() const { return file_; }

  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  // Typed getters: throw "<path>: metadata key <key> missing" / "... has type X, expected Y".
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;       // accepts integer values too
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  const std::vector<double>& get_float_array(const std::string& key) const;
  const std::vector<int64_t>& get_int_array(const std::string& key) const;
  // Defaults when the key is absent (still throws on a type mismatch).
  int64_t get_int_or(const std::string& key, int64_t def) const;
  double get_float_or(const std::string& key, double def) const;
  bool get_bool_or(const std::string& key, bool def) const;
  std::string get_string_or(const std::string& key, const std::string& def) const;

 private:
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// ggml tensor type ids (the `type` field of a GGUF tensor info) <-> DType. ggml_type_to_dtype returns nullopt for
// ids lowbit cannot read (Q8_1, IQ*, TQ*, ...); dtype_to_ggml_type throws for U8/BOOL, which GGUF cannot store.
std::optional<DType> ggml_type_to_dtype(uint32_t ggml_type);
uint32_t dtype_to_ggml_type(DType t);
const char* gguf_type_name(GgufType t);   // "U32", "STRING", ... as used in error messages

// Writes a GGUF v3 file (used by tests to build valid and hostile files, and by future exporters).
struct GgufWriteTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;   // outermost first
  std::vector<uint8_t> bytes;
};
void write_gguf(const std::string& path, const std::map<std::string, GgufValue>& kv,
                const std::vector<GgufWriteTensor>& tensors, uint64_t alignment = 32);

}  // namespace lowbit
