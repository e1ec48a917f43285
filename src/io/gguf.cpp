// GGUF v2/v3 reader and v3 writer.
//
// File layout (little-endian; spec: ggml/docs/gguf.md):
//   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x      { string key | u32 value_type | value }          string = u64 length + bytes (no NUL)
//   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to general.alignment (default 32) | data section (tensor offsets are relative to its start)
//
// The reader trusts nothing: every length is compared with the bytes that remain before anything is allocated
// or read, so a hostile file ends in one lowbit::Error("<path>: <problem>") instead of a crash or a huge
// allocation. Names taken from the file are sanitized before they are put in a message (one line, bounded).
#include "io/gguf.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <string_view>
#include <type_traits>

#include "core/atomic_write.h"
#include "core/error.h"

namespace lowbit {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF reader memcpy's little-endian fields");

constexpr uint32_t kMaxDims = 4;             // GGML_MAX_DIMS
constexpr uint64_t kDefaultAlignment = 32;   // GGUF_DEFAULT_ALIGNMENT
constexpr char kAlignmentKey[] = "general.alignment";
// The smallest possible encodings; a count that needs more bytes than remain is rejected before allocating.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // empty key, value type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, n_dims, one dim, type, offset
constexpr size_t kMaxNameInMessage = 96;

// ggml type ids as stored in GGUF tensor infos. Ids with no DType are named so the error can say what they are.
struct GgmlTypeRow {
  uint32_t id;
  const char* name;
  std::optional<DType> dtype;
};
constexpr GgmlTypeRow kGgmlTypes[] = {
    {0, "F32", DType::F32},       {1, "F16", DType::F16},         {2, "Q4_0", DType::Q4_0},
    {3, "Q4_1", DType::Q4_1},     {6, "Q5_0", DType::Q5_0},       {7, "Q5_1", DType::Q5_1},
    {8, "Q8_0", DType::Q8_0},     {9, "Q8_1", std::nullopt},      {10, "Q2_K", DType::Q2_K},
    {11, "Q3_K", DType::Q3_K},    {12, "Q4_K", DType::Q4_K},      {13, "Q5_K", DType::Q5_K},
    {14, "Q6_K", DType::Q6_K},    {15, "Q8_K", DType::Q8_K},      {16, "IQ2_XXS", std::nullopt},
    {17, "IQ2_XS", std::nullopt}, {18, "IQ3_XXS", std::nullopt},  {19, "IQ1_S", std::nullopt},
    {20, "IQ4_NL", std::nullopt}, {21, "IQ3_S", std::nullopt},    {22, "IQ2_S", std::nullopt},
    {23, "IQ4_XS", std::nullopt}, {24, "I8", DType::I8},          {25, "I16", DType::I16},
    {26, "I32", DType::I32},      {27, "I64", DType::I64},        {28, "F64", DType::F64},
    {29, "IQ1_M", std::nullopt},  {30, "BF16", DType::BF16},      {34, "TQ1_0", std::nullopt},
    {35, "TQ2_0", std::nullopt},  {39, "MXFP4", std::nullopt},
};

const GgmlTypeRow* find_ggml_type(uint32_t id) {
  for (const GgmlTypeRow& row : kGgmlTypes) {
    if (row.id == id) return &row;
  }
  return nullptr;
}

// A file-provided name made safe for a one-line message: control bytes become '?', long names are cut.
std::string printable(std::string_view name) {
  std::string out;
  for (char ch : name.substr(0, kMaxNameInMessage)) {
    const auto u = static_cast<unsigned char>(ch);
    out += (u < 0x20 || u == 0x7f) ? '?' : ch;
  }
  if (name.size() > kMaxNameInMessage) out += "...";
  return out;
}

bool is_known_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64:
      return true;
    default:
      return false;
  }
}

bool is_float(GgufType t) { return t == GgufType::F32 || t == GgufType::F64; }

// Encoded size of one value of a fixed-size type; strings take at least their 8-byte length.
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    default: return 8;  // U64, I64, F64, STRING length
  }
}

std::string type_label(const GgufValue& v) {
  if (v.type != GgufType::ARRAY) return gguf_type_name(v.type);
  return std::string("ARRAY[") + gguf_type_name(v.array_type) + "]";
}

// Bounds-checked sequential reader over the mapped file.
class Cursor {
 public:
  explicit Cursor(const MappedFile& f) : f_(f) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return f_.size() - pos_; }
  const std::string& path() const { return f_.path(); }

  // `what` and `name` describe the field for the error message ("value of key", "general.name").
  template <typename T>
  T read(std::string_view what, std::string_view name = {}) {
    if (sizeof(T) > remaining()) {
      fail(f_.path(), ": truncated file: ", what, name.empty() ? "" : " ", printable(name), " at offset ", pos_,
           " needs ", sizeof(T), " bytes, only ", remaining(), " left");
    }
    T v;
    std::memcpy(&v, f_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what, std::string_view name = {}) {
    const uint64_t len = read<uint64_t>(what, name);
    if (len > remaining()) {
      fail(f_.path(), ": ", what, name.empty() ? "" : " ", printable(name), ": string length ", len,
           " at offset ", pos_ - 8, " runs past end of file (", remaining(), " bytes left)");
    }
    std::string s(reinterpret_cast<const char*>(f_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const MappedFile& f_;
  uint64_t pos_ = 0;
};

int64_t read_int(Cursor& c, GgufType t, const std::string& key) {
  constexpr std::string_view what = "value of key";
  switch (t) {
    case GgufType::U8: return c.read<uint8_t>(what, key);
    case GgufType::I8: return c.read<int8_t>(what, key);
    case GgufType::U16: return c.read<uint16_t>(what, key);
    case GgufType::I16: return c.read<int16_t>(what, key);
    case GgufType::U32: return c.read<uint32_t>(what, key);
    case GgufType::I32: return c.read<int32_t>(what, key);
    case GgufType::I64: return c.read<int64_t>(what, key);
    case GgufType::U64: {
      const uint64_t v = c.read<uint64_t>(what, key);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(c.path(), ": U64 value ", v, " of key ", printable(key), " exceeds INT64_MAX");
      }
      return static_cast<int64_t>(v);
    }
    default: break;
  }
  fail(c.path(), ": internal: read_int on type ", gguf_type_name(t));
}

double read_float(Cursor& c, GgufType t, const std::string& key) {
  if (t == GgufType::F32) return c.read<float>("value of key", key);
  return c.read<double>("value of key", key);
}

bool read_bool(Cursor& c, const std::string& key) {
  const uint8_t b = c.read<uint8_t>("value of key", key);
  if (b > 1) fail(c.path(), ": bool value ", int{b}, " of key ", printable(key), " is not 0 or 1");
  return b == 1;
}

GgufValue read_value(Cursor& c, uint32_t raw_type, const std::string& key) {
  if (!is_known_type(raw_type)) {
    fail(c.path(), ": metadata key ", printable(key), " has unknown value type ", raw_type);
  }
  GgufValue v;
  v.type = static_cast<GgufType>(raw_type);
  if (is_integer(v.type)) {
    v.scalar = read_int(c, v.type, key);
  } else if (is_float(v.type)) {
    v.scalar = read_float(c, v.type, key);
  } else if (v.type == GgufType::BOOL) {
    v.scalar = read_bool(c, key);
  } else if (v.type == GgufType::STRING) {
    v.scalar = c.read_string("value of key", key);
  } else {  // ARRAY
    const uint32_t raw_elem = c.read<uint32_t>("array element type of key", key);
    if (raw_elem == static_cast<uint32_t>(GgufType::ARRAY)) {
      fail(c.path(), ": metadata key ", printable(key), ": nested arrays are not supported");
    }
    if (!is_known_type(raw_elem)) {
      fail(c.path(), ": array of key ", printable(key), " has unknown element type ", raw_elem);
    }
    v.array_type = static_cast<GgufType>(raw_elem);
    const uint64_t count = c.read<uint64_t>("array length of key", key);
    if (count > c.remaining() / min_value_bytes(v.array_type)) {
      fail(c.path(), ": array of key ", printable(key), " claims ", count, " elements, more than the file can hold (",
           c.remaining(), " bytes left)");
    }
    const auto n = static_cast<size_t>(count);
    if (is_integer(v.array_type)) {
      v.ints.reserve(n);
      for (size_t i = 0; i < n; ++i) v.ints.push_back(read_int(c, v.array_type, key));
    } else if (v.array_type == GgufType::BOOL) {
      v.ints.reserve(n);
      for (size_t i = 0; i < n; ++i) v.ints.push_back(read_bool(c, key) ? 1 : 0);
    } else if (is_float(v.array_type)) {
      v.floats.reserve(n);
      for (size_t i = 0; i < n; ++i) v.floats.push_back(read_float(c, v.array_type, key));
    } else {  // STRING
      v.strings.reserve(n);
      for (size_t i = 0; i < n; ++i) v.strings.push_back(c.read_string("array element of key", key));
    }
  }
  return v;
}

// Reads general.alignment (any integer type is accepted; writers use U32) and checks it is a power of two.
uint64_t alignment_from(const std::map<std::string, GgufValue>& kv, const std::string& path) {
  auto it = kv.find(kAlignmentKey);
  if (it == kv.end()) return kDefaultAlignment;
  const GgufValue& v = it->second;
  if (!is_integer(v.type)) fail(path, ": ", kAlignmentKey, " has type ", type_label(v), ", expected an integer");
  const int64_t a = std::get<int64_t>(v.scalar);
  if (a <= 0 || !std::has_single_bit(static_cast<uint64_t>(a))) {
    fail(path, ": ", kAlignmentKey, " ", a, " is not a positive power of two");
  }
  return static_cast<uint64_t>(a);
}

// Reads one tensor info and validates everything that does not depend on the data section's position.
GgufTensorInfo read_tensor_info(Cursor& c, uint64_t alignment, uint64_t* rel_offset) {
  const std::string& path = c.path();
  GgufTensorInfo t;
  t.name = c.read_string("tensor name");
  const std::string name = printable(t.name);
  const uint32_t n_dims = c.read<uint32_t>("dimension count of tensor", t.name);
  if (n_dims < 1 || n_dims > kMaxDims) {
    fail(path, ": tensor ", name, " has ", n_dims, " dimensions (must be 1 to ", kMaxDims, ")");
  }
  uint64_t ne[kMaxDims] = {};
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    ne[d] = c.read<uint64_t>("dimensions of tensor", t.name);
    if (ne[d] == 0) fail(path, ": tensor ", name, " has a zero dimension");
    if (ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / numel)) {
      fail(path, ": tensor ", name, " element count overflows (dimension ", ne[d], ")");
    }
    numel *= static_cast<int64_t>(ne[d]);
  }
  const uint32_t type_id = c.read<uint32_t>("type of tensor", t.name);
  const GgmlTypeRow* row = find_ggml_type(type_id);
  if (row == nullptr) fail(path, ": tensor ", name, " has unknown ggml type ", type_id);
  if (!row->dtype) fail(path, ": tensor ", name, " has unsupported ggml type ", type_id, " (", row->name, ")");
  t.dtype = *row->dtype;
  *rel_offset = c.read<uint64_t>("data offset of tensor", t.name);

  const DTypeInfo& info = dtype_info(t.dtype);
  // ggml requires whole blocks per row (ne[0]); that also makes numel a multiple of the block size.
  if (ne[0] % static_cast<uint64_t>(info.block_elems) != 0) {
    fail(path, ": tensor ", name, " row length ", ne[0], " is not a multiple of the ", info.name, " block size ",
         info.block_elems);
  }
  // Cannot overflow: numel <= INT64_MAX and block_bytes/block_elems <= 8.
  t.nbytes = static_cast<uint64_t>(numel) / static_cast<uint64_t>(info.block_elems) *
             static_cast<uint64_t>(info.block_bytes);
  if (*rel_offset % alignment != 0) {
    fail(path, ": tensor ", name, " offset ", *rel_offset, " is not a multiple of the alignment ", alignment);
  }
  for (uint32_t d = n_dims; d-- > 0;) t.shape.push_back(static_cast<int64_t>(ne[d]));  // outermost first
  return t;
}

// Adjacent extents after sorting by offset must not overlap (all extents are non-empty).
void check_no_overlap(const std::vector<GgufTensorInfo>& tensors, const std::string& path) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensorInfo& prev = tensors[order[i - 1]];
    const GgufTensorInfo& cur = tensors[order[i]];
    if (prev.offset + prev.nbytes > cur.offset) {
      fail(path, ": tensors ", printable(prev.name), " and ", printable(cur.name), " overlap (bytes [", prev.offset,
           ", ", prev.offset + prev.nbytes, ") and [", cur.offset, ", ", cur.offset + cur.nbytes, "))");
    }
  }
}

}  // namespace

std::optional<DType> ggml_type_to_dtype(uint32_t ggml_type) {
  const GgmlTypeRow* row = find_ggml_type(ggml_type);
  return row ? row->dtype : std::nullopt;
}

uint32_t dtype_to_ggml_type(DType t) {
  for (const GgmlTypeRow& row : kGgmlTypes) {
    if (row.dtype == t) return row.id;
  }
  fail("dtype ", dtype_info(t).name, " cannot be stored in a GGUF file");
}

const char* gguf_type_name(GgufType t) {
  static constexpr const char* kNames[] = {"U8",  "I8",   "U16",    "I16",   "U32", "I32", "F32",
                                           "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kNames) ? kNames[i] : "UNKNOWN";
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile g;
  g.file_ = MappedFile::open(path);
  const MappedFile& f = *g.file_;
  if (f.size() == 0) fail(path, ": empty file, not a GGUF file");
  if (f.size() < 4 || std::memcmp(f.data(), "GGUF", 4) != 0) fail(path, ": bad magic, not a GGUF file");

  Cursor c(f);
  c.read<uint32_t>("magic");
  g.version_ = c.read<uint32_t>("version");
  if (g.version_ == 1) fail(path, ": GGUF version 1 is not supported (only versions 2 and 3)");
  if (g.version_ != 2 && g.version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(g.version_);
    if (swapped == 2 || swapped == 3) fail(path, ": big-endian GGUF files are not supported");
    fail(path, ": unsupported GGUF version ", g.version_, " (only versions 2 and 3)");
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (n_kv > c.remaining() / kMinKvBytes) {
    fail(path, ": metadata count ", n_kv, " is more than the file can hold (", c.remaining(), " bytes left)");
  }
  if (n_tensors > (c.remaining() - n_kv * kMinKvBytes) / kMinTensorInfoBytes) {
    fail(path, ": tensor count ", n_tensors, " is more than the file can hold (", c.remaining(), " bytes left)");
  }

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key");
    const uint32_t type = c.read<uint32_t>("value type of key", key);
    GgufValue value = read_value(c, type, key);
    if (!g.kv_.emplace(key, std::move(value)).second) fail(path, ": duplicate metadata key ", printable(key));
  }
  g.alignment_ = alignment_from(g.kv_, path);

  std::vector<uint64_t> rel_offsets(static_cast<size_t>(n_tensors));
  g.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    g.tensors_.push_back(read_tensor_info(c, g.alignment_, &rel_offsets[i]));
    if (!g.tensor_index_.emplace(g.tensors_.back().name, i).second) {
      fail(path, ": duplicate tensor name ", printable(g.tensors_.back().name));
    }
  }
  if (n_tensors == 0) return g;

  // The data section starts at the next multiple of the alignment after the tensor infos.
  const uint64_t rem = c.pos() % g.alignment_;
  const uint64_t pad = rem == 0 ? 0 : g.alignment_ - rem;
  if (pad > c.remaining()) fail(path, ": data section (aligned to ", g.alignment_, ") starts past end of file");
  const uint64_t data_start = c.pos() + pad;
  for (size_t i = 0; i < g.tensors_.size(); ++i) {
    GgufTensorInfo& t = g.tensors_[i];
    if (rel_offsets[i] > f.size() - data_start || !f.in_bounds(data_start + rel_offsets[i], t.nbytes)) {
      fail(path, ": tensor ", printable(t.name), " data (offset ", rel_offsets[i], " in the data section, ",
           t.nbytes, " bytes) extends past end of file (size ", f.size(), ")");
    }
    t.offset = data_start + rel_offsets[i];
    t.data = f.data() + t.offset;
  }
  check_no_overlap(g.tensors_, path);
  return g;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------------------------
// Typed getters
// ---------------------------------------------------------------------------------------------------------------
namespace {

const GgufValue& lookup(const std::map<std::string, GgufValue>& kv, const std::string& path, const std::string& key) {
  auto it = kv.find(key);
  if (it == kv.end()) fail(path, ": metadata key ", key, " missing");
  return it->second;
}

[[noreturn]] void type_mismatch(const std::string& path, const std::string& key, const GgufValue& v,
                                const char* expected) {
  fail(path, ": metadata key ", key, " has type ", type_label(v), ", expected ", expected);
}

}  // namespace

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = lookup(kv_, path(), key);
  if (!is_integer(v.type)) type_mismatch(path(), key, v, "an integer");
  return std::get<int64_t>(v.scalar);
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = lookup(kv_, path(), key);
  if (is_float(v.type)) return std::get<double>(v.scalar);
  if (is_integer(v.type)) return static_cast<double>(std::get<int64_t>(v.scalar));
  type_mismatch(path(), key, v, "a number");
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = lookup(kv_, path(), key);
  if (v.type != GgufType::BOOL) type_mismatch(path(), key, v, "BOOL");
  return std::get<bool>(v.scalar);
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = lookup(kv_, path(), key);
  if (v.type != GgufType::STRING) type_mismatch(path(), key, v, "STRING");
  return std::get<std::string>(v.scalar);
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = lookup(kv_, path(), key);
  if (v.type != GgufType::ARRAY || v.array_type != GgufType::STRING) type_mismatch(path(), key, v, "ARRAY[STRING]");
  return v.strings;
}

const std::vector<double>& GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = lookup(kv_, path(), key);
  if (v.type != GgufType::ARRAY || !is_float(v.array_type)) type_mismatch(path(), key, v, "an array of floats");
  return v.floats;
}

const std::vector<int64_t>& GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = lookup(kv_, path(), key);
  if (v.type != GgufType::ARRAY || !is_integer(v.array_type)) {
    type_mismatch(path(), key, v, "an array of integers");
  }
  return v.ints;
}

int64_t GgufFile::get_int_or(const std::string& key, int64_t def) const { return has(key) ? get_int(key) : def; }
double GgufFile::get_float_or(const std::string& key, double def) const {
  return has(key) ? get_float(key) : def;
}
bool GgufFile::get_bool_or(const std::string& key, bool def) const { return has(key) ? get_bool(key) : def; }
std::string GgufFile::get_string_or(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}

// ---------------------------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------------------------
namespace {

class ByteBuffer {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.append(p, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.append(s);
  }
  void pad_to(uint64_t alignment) { bytes_.append((alignment - bytes_.size() % alignment) % alignment, '\0'); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

template <typename T>
T narrow(int64_t v, const std::string& path, const std::string& key) {
  if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      (std::is_signed_v<T> && v > static_cast<int64_t>(std::numeric_limits<T>::max())) ||
      (!std::is_signed_v<T> && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
    fail(path, ": write_gguf: value ", v, " of key ", key, " does not fit its type");
  }
  return static_cast<T>(v);
}

void put_int(ByteBuffer& w, GgufType t, int64_t v, const std::string& path, const std::string& key) {
  switch (t) {
    case GgufType::U8: return w.put(narrow<uint8_t>(v, path, key));
    case GgufType::I8: return w.put(narrow<int8_t>(v, path, key));
    case GgufType::U16: return w.put(narrow<uint16_t>(v, path, key));
    case GgufType::I16: return w.put(narrow<int16_t>(v, path, key));
    case GgufType::U32: return w.put(narrow<uint32_t>(v, path, key));
    case GgufType::I32: return w.put(narrow<int32_t>(v, path, key));
    case GgufType::U64: return w.put(narrow<uint64_t>(v, path, key));
    case GgufType::I64: return w.put(v);
    case GgufType::BOOL: return w.put(static_cast<uint8_t>(v != 0));
    default: fail(path, ": write_gguf: key ", key, ": type ", gguf_type_name(t), " is not an integer type");
  }
}

void put_float(ByteBuffer& w, GgufType t, double v) {
  if (t == GgufType::F32) w.put(static_cast<float>(v));
  else w.put(v);
}

void put_value(ByteBuffer& w, const GgufValue& v, const std::string& path, const std::string& key) {
  if (!is_known_type(static_cast<uint32_t>(v.type))) fail(path, ": write_gguf: key ", key, " has an unknown type");
  w.put(static_cast<uint32_t>(v.type));
  const auto want = [&](auto* p, const char* what) {
    if (p == nullptr) fail(path, ": write_gguf: key ", key, " of type ", gguf_type_name(v.type), " needs ", what);
    return *p;
  };
  if (is_integer(v.type)) {
    put_int(w, v.type, want(std::get_if<int64_t>(&v.scalar), "an int64 value"), path, key);
  } else if (is_float(v.type)) {
    const double* d = std::get_if<double>(&v.scalar);
    const int64_t* i = std::get_if<int64_t>(&v.scalar);
    put_float(w, v.type, d ? *d : static_cast<double>(want(i, "a double value")));
  } else if (v.type == GgufType::BOOL) {
    w.put(static_cast<uint8_t>(want(std::get_if<bool>(&v.scalar), "a bool value")));
  } else if (v.type == GgufType::STRING) {
    w.put_string(want(std::get_if<std::string>(&v.scalar), "a string value"));
  } else {  // ARRAY
    const GgufType et = v.array_type;
    if (et == GgufType::ARRAY || !is_known_type(static_cast<uint32_t>(et))) {
      fail(path, ": write_gguf: key ", key, " has an invalid array element type");
    }
    w.put(static_cast<uint32_t>(et));
    if (is_integer(et) || et == GgufType::BOOL) {
      w.put<uint64_t>(v.ints.size());
      for (int64_t x : v.ints) put_int(w, et, x, path, key);
    } else if (is_float(et)) {
      w.put<uint64_t>(v.floats.size());
      for (double x : v.floats) put_float(w, et, x);
    } else {
      w.put<uint64_t>(v.strings.size());
      for (const std::string& s : v.strings) w.put_string(s);
    }
  }
}


}  // namespace

void write_gguf(const std::string& path, const std::map<std::string, GgufValue>& kv,
                const std::vector<GgufWriteTensor>& tensors, uint64_t alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment)) {
    fail(path, ": write_gguf: alignment ", alignment, " is not a power of two");
  }
  // The reader only knows the alignment through general.alignment, so a non-default one must be recorded.
  std::map<std::string, GgufValue> all_kv = kv;
  if (auto it = all_kv.find(kAlignmentKey); it != all_kv.end()) {
    const int64_t* a = std::get_if<int64_t>(&it->second.scalar);
    if (!is_integer(it->second.type) || a == nullptr || static_cast<uint64_t>(*a) != alignment) {
      fail(path, ": write_gguf: ", kAlignmentKey, " does not match the alignment argument ", alignment);
    }
  } else if (alignment != kDefaultAlignment) {
    GgufValue a;
    a.type = GgufType::U32;
    a.scalar = static_cast<int64_t>(alignment);
    all_kv.emplace(kAlignmentKey, a);
  }

  ByteBuffer header;
  header.put<uint32_t>(0x46554747u);  // "GGUF"
  header.put<uint32_t>(3);
  header.put<uint64_t>(tensors.size());
  header.put<uint64_t>(all_kv.size());
  for (const auto& [key, value] : all_kv) {
    header.put_string(key);
    put_value(header, value, path, key);
  }

  uint64_t data_size = 0;
  for (const GgufWriteTensor& t : tensors) {
    if (t.shape.empty() || t.shape.size() > kMaxDims) {
      fail(path, ": write_gguf: tensor ", t.name, " has ", t.shape.size(), " dimensions (must be 1 to 4)");
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d <= 0 || d > std::numeric_limits<int64_t>::max() / numel) {
        fail(path, ": write_gguf: tensor ", t.name, " has a bad dimension ", d, " in shape ", shape_str(t.shape));
      }
      numel *= d;
    }
    const DTypeInfo& info = dtype_info(t.dtype);
    if (t.shape.back() % info.block_elems != 0) {
      fail(path, ": write_gguf: tensor ", t.name, " row length ", t.shape.back(), " is not a multiple of the ",
           info.name, " block size ", info.block_elems);
    }
    if (dtype_bytes(t.dtype, static_cast<uint64_t>(numel)) != t.bytes.size()) {
      fail(path, ": write_gguf: tensor ", t.name, " has ", t.bytes.size(), " bytes, shape ", shape_str(t.shape),
           " of ", info.name, " needs ", dtype_bytes(t.dtype, static_cast<uint64_t>(numel)));
    }
    header.put_string(t.name);
    header.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) header.put<uint64_t>(static_cast<uint64_t>(t.shape[d]));
    header.put<uint32_t>(dtype_to_ggml_type(t.dtype));
    header.put<uint64_t>(data_size);
    data_size += (t.bytes.size() + alignment - 1) / alignment * alignment;
  }
  header.pad_to(alignment);

  static const std::vector<char> kZeros(4096, 0);
  std::vector<std::pair<const void*, size_t>> pieces{{header.bytes().data(), header.bytes().size()}};
  for (const GgufWriteTensor& t : tensors) {
    pieces.emplace_back(t.bytes.data(), t.bytes.size());
    for (uint64_t pad = (alignment - t.bytes.size() % alignment) % alignment; pad > 0;) {
      const size_t n = std::min<uint64_t>(pad, kZeros.size());
      pieces.emplace_back(kZeros.data(), n);
      pad -= n;
    }
  }
  write_atomically(path, pieces);
}

}  // namespace lowbit
