// safetensors reader and writer (format: see safetensors.h and huggingface/safetensors' README).
//
// The reader validates the header once, at open(): after that every TensorView points at bytes known to lie in
// the data section and to have exactly numel * itemsize bytes. Duplicate names are caught during parsing
// (nlohmann::json would silently keep the last one).
#include "io/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/atomic_write.h"
#include "core/error.h"

namespace lowbit {
namespace {

static_assert(std::endian::native == std::endian::little, "the safetensors header length is little-endian");

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit (100 MB)
constexpr int kMaxJsonDepth = 3;                    // root object -> tensor entry -> shape/offsets array
constexpr char kMetadataKey[] = "__metadata__";
constexpr size_t kMaxNameInMessage = 96;

// safetensors dtype names for the element types lowbit can hold. Names absent here (U16, F8_E4M3, ...) are
// reported as unsupported.
struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::F64, "F64"}, {DType::F32, "F32"}, {DType::F16, "F16"}, {DType::BF16, "BF16"}, {DType::I64, "I64"},
    {DType::I32, "I32"}, {DType::I16, "I16"}, {DType::I8, "I8"},   {DType::U8, "U8"},     {DType::BOOL, "BOOL"},
};

const char* safetensors_name(DType t) {
  for (const DTypeName& row : kDTypeNames) {
    if (row.dtype == t) return row.name;
  }
  return nullptr;
}

// A file-provided name made safe for a one-line message: control bytes become '?', long names are cut.
std::string printable(std::string_view name, size_t max_len = kMaxNameInMessage) {
  std::string out;
  for (char ch : name.substr(0, max_len)) {
    const auto u = static_cast<unsigned char>(ch);
    out += (u < 0x20 || u == 0x7f) ? '?' : ch;
  }
  if (name.size() > max_len) out += "...";
  return out;
}

// Parses the header JSON, rejecting duplicate top-level keys and nesting deeper than the format uses.
json parse_header(const std::string& path, const char* begin, const char* end) {
  std::string duplicate;
  bool too_deep = false;
  std::set<std::string> seen;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      too_deep = true;
      return false;  // drop the value instead of building it
    }
    return true;
  };
  json header;
  try {
    header = json::parse(begin, end, check);
  } catch (const json::exception& e) {
    fail(path, ": header is not valid JSON: ", printable(e.what(), 400));  // it quotes header bytes
  }
  if (too_deep) fail(path, ": header JSON is nested deeper than the format allows");
  if (!duplicate.empty()) fail(path, ": duplicate tensor name ", printable(duplicate));
  if (!header.is_object()) fail(path, ": header JSON is not an object");
  return header;
}

uint64_t get_u64(const json& v, const std::string& path, const std::string& name, const char* field) {
  if (!v.is_number_unsigned()) {
    fail(path, ": tensor ", printable(name), ": ", field, " must hold non-negative integers, got ", v.dump());
  }
  return v.get<uint64_t>();
}

struct Extent {
  uint64_t begin, end;
  const std::string* name;
};

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile st;
  st.file_ = MappedFile::open(path);
  const MappedFile& f = *st.file_;
  if (f.size() == 0) fail(path, ": empty file, not a safetensors file");
  if (f.size() < 8) fail(path, ": file is ", f.size(), " bytes, shorter than the 8-byte safetensors header length");
  uint64_t header_len;
  std::memcpy(&header_len, f.data(), 8);
  if (header_len > f.size() - 8) {
    fail(path, ": header length ", header_len, " runs past end of file (size ", f.size(), ")");
  }
  if (header_len > kMaxHeaderBytes) {
    fail(path, ": header length ", header_len, " is absurd (limit ", kMaxHeaderBytes, " bytes)");
  }
  const auto* header_begin = reinterpret_cast<const char*>(f.data() + 8);
  const json header = parse_header(path, header_begin, header_begin + header_len);
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = f.size() - data_start;

  std::vector<Extent> extents;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) fail(path, ": ", kMetadataKey, " is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(path, ": ", kMetadataKey, " value for key ", printable(key), " is not a string");
        st.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string pname = printable(name);
    if (!entry.is_object()) fail(path, ": entry for tensor ", pname, " is not an object");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) fail(path, ": tensor ", pname, " has no dtype string");
    if (shape_it == entry.end() || !shape_it->is_array()) fail(path, ": tensor ", pname, " has no shape array");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      fail(path, ": tensor ", pname, " needs data_offsets [begin, end]");
    }

    TensorView t;
    t.name = name;
    const std::string dtype_name = dtype_it->get<std::string>();
    const auto row = std::find_if(std::begin(kDTypeNames), std::end(kDTypeNames),
                                  [&](const DTypeName& r) { return dtype_name == r.name; });
    if (row == std::end(kDTypeNames)) {
      fail(path, ": tensor ", pname, " has unknown or unsupported dtype ", printable(dtype_name));
    }
    t.dtype = row->dtype;

    // numel * itemsize, overflow-checked; a zero dimension is legal and gives an empty tensor.
    const uint64_t itemsize = static_cast<uint64_t>(dtype_info(t.dtype).block_bytes);
    uint64_t expected = itemsize;
    bool overflow = false;
    for (const json& d : *shape_it) {
      const uint64_t dim = get_u64(d, path, name, "shape");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
      else if (dim != 0 && expected > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
      else expected *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t begin = get_u64((*offsets_it)[0], path, name, "data_offsets");
    const uint64_t end = get_u64((*offsets_it)[1], path, name, "data_offsets");
    if (begin > end || end > data_size) {
      fail(path, ": tensor ", pname, " data_offsets [", begin, ", ", end, "] are outside the data section (",
           data_size, " bytes)");
    }
    if (overflow || end - begin != expected) {
      fail(path, ": tensor ", pname, " has ", end - begin, " bytes but shape ", shape_str(t.shape), " of ",
           dtype_name, " needs ", overflow ? std::string("more than 2^64") : std::to_string(expected));
    }
    t.data = f.data() + data_start + begin;
    t.nbytes = end - begin;
    auto [it, inserted] = st.tensors_.emplace(name, std::move(t));
    if (!inserted) fail(path, ": duplicate tensor name ", pname);  // already caught by parse_header
    if (end > begin) extents.push_back({begin, end, &it->first});
  }

  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i - 1].end > extents[i].begin) {
      fail(path, ": tensors ", printable(*extents[i - 1].name), " and ", printable(*extents[i].name),
           " overlap (bytes [", extents[i - 1].begin, ", ", extents[i - 1].end, ") and [", extents[i].begin, ", ",
           extents[i].end, ") of the data section)");
    }
  }
  return st;
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}


void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::vector<std::pair<const void*, size_t>> pieces(1);  // [0] is the header, filled in below
  uint64_t offset = 0;
  for (const SafetensorsWriteTensor& t : tensors) {
    const char* dtype_name = safetensors_name(t.dtype);
    if (dtype_name == nullptr) {
      fail(path, ": write_safetensors: tensor ", t.name, " has dtype ", dtype_info(t.dtype).name,
           ", which safetensors cannot store");
    }
    if (t.name == kMetadataKey || header.contains(t.name)) {
      fail(path, ": write_safetensors: duplicate or reserved tensor name ", t.name);
    }
    uint64_t nbytes = static_cast<uint64_t>(dtype_info(t.dtype).block_bytes);
    for (int64_t d : t.shape) {
      if (d < 0) fail(path, ": write_safetensors: tensor ", t.name, " has negative dimension ", d);
      nbytes *= static_cast<uint64_t>(d);
    }
    header[t.name] = {{"dtype", dtype_name}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    pieces.emplace_back(t.data, static_cast<size_t>(nbytes));
    offset += nbytes;
  }
  // Pad with spaces so the data section starts 8-byte aligned (8-byte length prefix + header).
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();
  std::string prefix(8, '\0');
  std::memcpy(prefix.data(), &header_len, 8);
  prefix += text;
  pieces[0] = {prefix.data(), prefix.size()};
  write_atomically(path, pieces);
}

}  // namespace lowbit
