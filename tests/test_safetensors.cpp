// safetensors reader/writer: round trips, hostile headers (each one lowbit::Error naming the file and the
// problem), and a deterministic corruption sweep that must never crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace lowbit {
namespace {

using test::expect_error;

void expect_st_error(const std::string& path, const std::string& phrase) {
  expect_error([](const std::string& p) { SafetensorsFile::open(p); }, path, phrase);
}

// A file with the given header text (length prefix computed unless overridden) followed by `data_bytes` zeros.
std::string write_raw(const std::string& path, const std::string& header, size_t data_bytes,
                      std::optional<uint64_t> header_len = std::nullopt) {
  const uint64_t len = header_len.value_or(header.size());
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &len, 8);
  bytes += header;
  bytes.append(data_bytes, '\0');
  test::write_file(path, bytes);
  return path;
}

// One tensor entry of a hand-written header.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

// A header object from entries. (Appending, rather than `"{" + entry(...)`, sidesteps a GCC 12 -Wrestrict
// false positive.)
std::string header_json(std::initializer_list<std::string> entries) {
  std::string out = "{";
  for (const std::string& e : entries) {
    if (out.size() > 1) out += ',';
    out += e;
  }
  out += '}';
  return out;
}

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Tensors of every dtype safetensors can hold, including a scalar and an empty tensor.
std::vector<Tensor> sample_tensors() {
  std::vector<Tensor> ts = {
      {"f64", DType::F64, {2}, {}},          {"f32", DType::F32, {2, 3}, {}},  {"f16", DType::F16, {4}, {}},
      {"bf16", DType::BF16, {1, 1, 3}, {}},  {"i64", DType::I64, {1}, {}},     {"i32", DType::I32, {2}, {}},
      {"i16", DType::I16, {3}, {}},          {"i8", DType::I8, {5}, {}},       {"u8", DType::U8, {7}, {}},
      {"bool", DType::BOOL, {2}, {}},        {"scalar", DType::F32, {}, {}},   {"empty", DType::F32, {0, 4}, {}},
  };
  std::mt19937 rng(5);
  for (Tensor& t : ts) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    t.bytes.resize(static_cast<size_t>(numel) * static_cast<size_t>(dtype_info(t.dtype).block_bytes));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(t.dtype == DType::BOOL ? rng() % 2 : rng());
  }
  return ts;
}

void write_tensors(const std::string& path, const std::vector<Tensor>& ts,
                   const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriteTensor> w;
  for (const Tensor& t : ts) w.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  write_safetensors(path, w, metadata);
}

// ----------------------------------------------------------------------------------------------------------------
// Round trips and the writer
// ----------------------------------------------------------------------------------------------------------------

TEST(SafetensorsRoundTrip, EveryDTypeWithMetadata) {
  const std::string dir = test::temp_dir();
  const std::string path = dir + "/model.safetensors";
  const std::vector<Tensor> ts = sample_tensors();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "line one\nline \"two\""}};
  write_tensors(path, ts, metadata);

  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.tensors().size(), ts.size());
  for (const Tensor& t : ts) {
    SCOPED_TRACE(t.name);
    const TensorView* v = f.find(t.name);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->name, t.name);
    EXPECT_EQ(v->dtype, t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    ASSERT_EQ(v->nbytes, t.bytes.size());
    if (!t.bytes.empty()) {
      EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), t.bytes.size()), 0);
    }
  }
  EXPECT_EQ(f.find("absent"), nullptr);

  // The header is space-padded so that the data section starts 8-byte aligned.
  const std::string raw = test::read_file(path);
  uint64_t header_len;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  size_t data_bytes = 0;
  for (const Tensor& t : ts) data_bytes += t.bytes.size();
  EXPECT_EQ(raw.size(), 8 + header_len + data_bytes);
}

TEST(SafetensorsRoundTrip, WriterIsAtomicAndValidatesInput) {
  const std::string dir = test::temp_dir();
  const std::string path = dir + "/w.safetensors";
  const float x[2] = {1.0f, 2.0f};
  write_safetensors(path, {{"a", DType::F32, {2}, x}}, {});
  write_safetensors(path, {{"b", DType::F32, {1}, x}}, {});  // overwrite in place
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.tensors().size(), 1u);
  EXPECT_NE(f.find("b"), nullptr);
  EXPECT_TRUE(f.metadata().empty());
  // No temp file may be left next to the target.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 1);

  expect_error([&](const std::string& p) { write_safetensors(p, {{"a", DType::F32, {2}, x}}, {}); },
               dir + "/no/such/dir/x.safetensors", "cannot write");
  expect_error([&](const std::string& p) { write_safetensors(p, {{"q", DType::Q4_0, {32}, x}}, {}); },
               dir + "/q.safetensors", "tensor q has dtype Q4_0, which safetensors cannot store");
  expect_error([&](const std::string& p) {
                 write_safetensors(p, {{"a", DType::F32, {1}, x}, {"a", DType::F32, {1}, x}}, {});
               },
               dir + "/dup.safetensors", "duplicate or reserved tensor name a");
  expect_error([&](const std::string& p) { write_safetensors(p, {{"__metadata__", DType::F32, {1}, x}}, {}); },
               dir + "/meta.safetensors", "duplicate or reserved tensor name __metadata__");
}

// ----------------------------------------------------------------------------------------------------------------
// Hostile files
// ----------------------------------------------------------------------------------------------------------------

class SafetensorsHostile : public ::testing::Test {
 protected:
  std::string dir_ = test::temp_dir();
  std::string file(const std::string& name) const { return dir_ + "/" + name; }
};

TEST_F(SafetensorsHostile, FileAndHeaderLength) {
  expect_st_error(file("missing.safetensors"), "cannot open");
  expect_st_error(dir_, "is a directory");
  test::write_file(file("empty.safetensors"), "");
  expect_st_error(file("empty.safetensors"), "empty file");
  test::write_file(file("short.safetensors"), "abcde");
  expect_st_error(file("short.safetensors"), "file is 5 bytes, shorter than the 8-byte safetensors header length");
  expect_st_error(write_raw(file("past.safetensors"), "{}", 4, 1000), "header length 1000 runs past end of file");
  expect_st_error(write_raw(file("huge.safetensors"), "{}", 0, ~0ull), "runs past end of file");

  // An absurd (over 100 MB) header length needs a file at least that large: a sparse one costs no disk.
  const std::string big = write_raw(file("absurd.safetensors"), "{}", 0, 150ull << 20);
  ASSERT_EQ(::truncate(big.c_str(), 200ll << 20), 0);
  expect_st_error(big, "header length 157286400 is absurd");
  std::filesystem::remove(big);
}

TEST_F(SafetensorsHostile, Json) {
  expect_st_error(write_raw(file("json.safetensors"), "{\"a\":", 0), "header is not valid JSON");
  expect_st_error(write_raw(file("array.safetensors"), "[1,2]", 0), "header JSON is not an object");
  expect_st_error(write_raw(file("entry.safetensors"), "{\"a\":5}", 0), "entry for tensor a is not an object");
  expect_st_error(write_raw(file("dup.safetensors"),
                            header_json({entry("a", "F32", "[1]", "[0,4]"), entry("a", "F32", "[1]", "[4,8]")}), 8),
                  "duplicate tensor name a");
  expect_st_error(write_raw(file("deep.safetensors"), header_json({entry("a", "F32", "[[1]]", "[0,4]")}), 4),
                  "nested deeper than the format allows");
  expect_st_error(write_raw(file("meta.safetensors"), "{\"__metadata__\":{\"k\":1}}", 0),
                  "__metadata__ value for key k is not a string");
  expect_st_error(write_raw(file("meta2.safetensors"), "{\"__metadata__\":[\"k\"]}", 0),
                  "__metadata__ is not an object");
  expect_st_error(write_raw(file("nodtype.safetensors"), "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
                  "tensor a has no dtype string");
  expect_st_error(write_raw(file("noshape.safetensors"), "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4),
                  "tensor a has no shape array");
  expect_st_error(write_raw(file("offs.safetensors"), header_json({entry("a", "F32", "[1]", "[0]")}), 4),
                  "tensor a needs data_offsets [begin, end]");
}

TEST_F(SafetensorsHostile, TensorEntries) {
  expect_st_error(write_raw(file("dtype.safetensors"), header_json({entry("a", "F8_E4M3", "[1]", "[0,1]")}), 1),
                  "tensor a has unknown or unsupported dtype F8_E4M3");
  expect_st_error(write_raw(file("size.safetensors"), header_json({entry("a", "F32", "[2,2]", "[0,12]")}), 16),
                  "tensor a has 12 bytes but shape [2, 2] of F32 needs 16");
  expect_st_error(write_raw(file("ovf.safetensors"),
                            header_json({entry("a", "F32", "[4294967296,4294967296,16]", "[0,16]")}), 16),
                  "needs more than 2^64");
  expect_st_error(write_raw(file("bigdim.safetensors"),
                            header_json({entry("a", "U8", "[18446744073709551615]", "[0,1]")}), 1),
                  "needs more than 2^64");
  expect_st_error(write_raw(file("neg.safetensors"), header_json({entry("a", "F32", "[-1]", "[0,4]")}), 4),
                  "tensor a: shape must hold non-negative integers, got -1");
  expect_st_error(write_raw(file("float.safetensors"), header_json({entry("a", "F32", "[1]", "[0.5,4]")}), 4),
                  "tensor a: data_offsets must hold non-negative integers");
  expect_st_error(write_raw(file("extent.safetensors"), header_json({entry("a", "F32", "[25]", "[0,100]")}), 16),
                  "tensor a data_offsets [0, 100] are outside the data section (16 bytes)");
  expect_st_error(write_raw(file("reversed.safetensors"), header_json({entry("a", "F32", "[1]", "[8,4]")}), 16),
                  "outside the data section");
  expect_st_error(write_raw(file("overlap.safetensors"),
                            header_json({entry("a", "F32", "[2]", "[0,8]"), entry("b", "F32", "[2]", "[4,12]")}), 16),
                  "tensors a and b overlap");
}

// ----------------------------------------------------------------------------------------------------------------
// Fuzz-ish: every single-byte corruption and every truncation of a valid file either opens or throws Error
// ----------------------------------------------------------------------------------------------------------------

// Returns true when the file opens; reads every tensor byte so an out-of-bounds view shows up under a sanitizer.
bool open_and_read(const std::string& path) {
  return test::opens_or_refuses_cleanly(path, [](const std::string& p) {
    const SafetensorsFile f = SafetensorsFile::open(p);
    uint64_t checksum = 0;
    for (const auto& [name, t] : f.tensors())
      for (uint64_t i = 0; i < t.nbytes; ++i) checksum += t.data[i];
    return checksum;   // returned so the byte loop is not optimized away
  });
}

TEST(SafetensorsFuzz, CorruptedAndTruncatedFilesNeverCrash) {
  const std::string dir = test::temp_dir();
  std::vector<Tensor> ts = sample_tensors();
  ts.resize(4);
  write_tensors(dir + "/valid.safetensors", ts, {{"format", "pt"}});
  const std::string valid = test::read_file(dir + "/valid.safetensors");
  ASSERT_TRUE(open_and_read(dir + "/valid.safetensors"));
  // multi-byte corruptions; digits keep the JSON parseable more often
  test::fuzz_file(valid, dir + "/mutant.safetensors", open_and_read,
                  [](std::string& m, std::mt19937& rng) {
    const size_t pos = rng() % m.size();
    const size_t len = 1 + rng() % 4;
    for (size_t j = pos; j < std::min(m.size(), pos + len); ++j)
      m[j] = static_cast<char>(rng() % 2 ? '0' + rng() % 10 : rng());
  }, 2000);
}

}  // namespace
}  // namespace lowbit
