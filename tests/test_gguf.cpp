// GGUF reader/writer and ggml (de)quantization.
//
// Correctness questions are asked two ways (STYLE habit 3):
//   - dequantize_row / quantize_row_ref vs the Python `gguf` package on the same bytes: must be bit-exact
//     (golden fixture tests/fixtures/ggml_quants_golden.bin, made by tools/make_quant_golden.py);
//   - quantize -> dequantize vs the fp32 input: a named per-format error budget.
// Hostile files are built byte by byte with GgufBytes; each must fail with one lowbit::Error naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "io/ggml_quants.h"
#include "io/gguf.h"
#include "test_util.h"

namespace lowbit {
namespace {

// ----------------------------------------------------------------------------------------------------------------
// Helpers
// ----------------------------------------------------------------------------------------------------------------

// Metadata constructors (gguf_int, gguf_float, gguf_bool, gguf_string, gguf_array) live in src/io/gguf.h.

void expect_same_value(const GgufValue& a, const GgufValue& b, const std::string& key) {
  SCOPED_TRACE(key);
  EXPECT_EQ(a.type, b.type);
  if (a.type == GgufType::ARRAY) {
    EXPECT_EQ(a.array_type, b.array_type);
    EXPECT_EQ(a.ints, b.ints);
    EXPECT_EQ(a.floats, b.floats);
    EXPECT_EQ(a.strings, b.strings);
  } else {
    EXPECT_EQ(a.scalar, b.scalar);
  }
}

std::vector<uint8_t> float_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> dequantize(DType t, const uint8_t* data, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t, data, out.data(), n);
  return out;
}

// Bit equality, treating any two NaNs as equal (payloads are not part of the contract).
::testing::AssertionResult same_floats(const std::vector<float>& got, const float* want, size_t n) {
  if (got.size() != n) return ::testing::AssertionFailure() << "size " << got.size() << " != " << n;
  for (size_t i = 0; i < n; ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << " want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

using test::expect_error;

void expect_gguf_error(const std::string& path, const std::string& phrase) {
  expect_error([](const std::string& p) { GgufFile::open(p); }, path, phrase);
}

// Raw GGUF bytes for hostile files (write_gguf refuses to produce them).
class GgufBytes {
 public:
  template <typename T>
  GgufBytes& put(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  GgufBytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_ += s;
    return *this;
  }
  GgufBytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bytes_ += "GGUF";
    return put(version).put(n_tensors).put(n_kv);
  }
  GgufBytes& kv_u32(const std::string& key, uint32_t v) { return str(key).put<uint32_t>(4).put(v); }
  // ne in ggml order (innermost first); type is a ggml type id.
  GgufBytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) put(d);
    return put(type).put(offset);
  }
  GgufBytes& pad(size_t alignment) {
    bytes_.append((alignment - bytes_.size() % alignment) % alignment, '\0');
    return *this;
  }
  GgufBytes& zeros(size_t n) {
    bytes_.append(n, '\0');
    return *this;
  }
  std::string write(const std::string& dir, const std::string& name) const {
    const std::string path = dir + "/" + name;
    test::write_file(path, bytes_);
    return path;
  }

 private:
  std::string bytes_;
};

constexpr uint32_t kGgmlF32 = 0, kGgmlQ4_0 = 2;

// A small valid file with metadata of several kinds and three tensor types, for round trips and fuzzing.
std::string write_small_gguf(const std::string& path) {
  std::map<std::string, GgufValue> kv;
  kv["general.architecture"] = gguf_string("llama");
  kv["llama.block_count"] = gguf_int(GgufType::U32, 2);
  kv["tokenizer.ggml.tokens"] = gguf_array(GgufType::STRING, {}, {}, {"<s>", "a", "bc"});
  kv["tokenizer.ggml.scores"] = gguf_array(GgufType::F32, {}, {0.5, -1.25, 2.0});
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
  std::vector<uint8_t> q4(2 * 18), q8(2 * 34);
  quantize_row_ref(DType::Q4_0, x.data(), q4.data(), 64);
  quantize_row_ref(DType::Q8_0, x.data(), q8.data(), 64);
  write_gguf(path, kv,
             {{"norm.weight", DType::F32, {8}, float_bytes({1, 2, 3, 4, 5, 6, 7, 8})},
              {"q4.weight", DType::Q4_0, {2, 32}, q4},
              {"q8.weight", DType::Q8_0, {1, 64}, q8}});
  return path;
}

// ----------------------------------------------------------------------------------------------------------------
// Round trips
// ----------------------------------------------------------------------------------------------------------------

TEST(GgufRoundTrip, EveryValueTypeAndTensor) {
  const std::string path = test::temp_dir() + "/all.gguf";
  std::map<std::string, GgufValue> kv;
  kv["u8"] = gguf_int(GgufType::U8, 255);
  kv["i8"] = gguf_int(GgufType::I8, -128);
  kv["u16"] = gguf_int(GgufType::U16, 65535);
  kv["i16"] = gguf_int(GgufType::I16, -32768);
  kv["u32"] = gguf_int(GgufType::U32, 4294967295);
  kv["i32"] = gguf_int(GgufType::I32, -2147483647 - 1);
  kv["u64"] = gguf_int(GgufType::U64, std::numeric_limits<int64_t>::max());
  kv["i64"] = gguf_int(GgufType::I64, std::numeric_limits<int64_t>::min());
  kv["f32"] = gguf_float(GgufType::F32, -0.15625);  // exactly representable in fp32
  kv["f64"] = gguf_float(GgufType::F64, 3.141592653589793);
  kv["bool"] = gguf_bool(true);
  kv["str"] = gguf_string("h\xc3\xa9llo\nworld");
  kv["str.empty"] = gguf_string("");
  kv["arr.u8"] = gguf_array(GgufType::U8, {0, 7, 255});
  kv["arr.i16"] = gguf_array(GgufType::I16, {-5, 300});
  kv["arr.u32"] = gguf_array(GgufType::U32, {1, 2, 3});
  kv["arr.i32"] = gguf_array(GgufType::I32, {-1, 0, 1});
  kv["arr.u64"] = gguf_array(GgufType::U64, {1ll << 40});
  kv["arr.i64"] = gguf_array(GgufType::I64, {-(1ll << 50)});
  kv["arr.bool"] = gguf_array(GgufType::BOOL, {1, 0, 1});
  kv["arr.f32"] = gguf_array(GgufType::F32, {}, {0.5, -2.25});
  kv["arr.f64"] = gguf_array(GgufType::F64, {}, {1e-300, 1e300});
  kv["arr.str"] = gguf_array(GgufType::STRING, {}, {}, {"a", "", "long string with spaces"});
  kv["arr.empty"] = gguf_array(GgufType::I32, {});

  std::vector<GgufWriteTensor> tensors = {
      {"f32.3d", DType::F32, {2, 3, 5}, {}}, {"f16", DType::F16, {4, 2}, {}},  {"bf16", DType::BF16, {3}, {}},
      {"f64", DType::F64, {1, 1, 1, 2}, {}}, {"q4_0", DType::Q4_0, {2, 64}, {}}, {"q6_k", DType::Q6_K, {256}, {}},
      {"i32", DType::I32, {7}, {}},
  };
  std::mt19937 rng(7);
  for (auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    t.bytes.resize(dtype_bytes(t.dtype, static_cast<uint64_t>(numel)));
    for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
  }

  for (uint64_t alignment : {32u, 64u}) {
    SCOPED_TRACE(alignment);
    write_gguf(path, kv, tensors, alignment);
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.metadata().size(), kv.size() + (alignment == 32 ? 0 : 1));  // + general.alignment
    for (const auto& [key, value] : kv) {
      ASSERT_TRUE(f.has(key)) << key;
      expect_same_value(f.metadata().at(key), value, key);
    }
    ASSERT_EQ(f.tensors().size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const GgufTensorInfo& t = f.tensors()[i];
      EXPECT_EQ(t.name, tensors[i].name);  // file order is kept
      EXPECT_EQ(t.dtype, tensors[i].dtype);
      EXPECT_EQ(t.shape, tensors[i].shape);
      EXPECT_EQ(t.offset % alignment, 0u);
      ASSERT_EQ(t.nbytes, tensors[i].bytes.size());
      EXPECT_EQ(std::memcmp(t.data, tensors[i].bytes.data(), t.nbytes), 0) << t.name;
      EXPECT_EQ(f.find_tensor(t.name), &t);
    }
    EXPECT_EQ(f.find_tensor("absent"), nullptr);
  }
}

TEST(GgufRoundTrip, TypedGetters) {
  const std::string path = write_small_gguf(test::temp_dir() + "/small.gguf");
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 2);
  EXPECT_EQ(f.get_float("llama.block_count"), 2.0);  // integers are accepted as floats
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"<s>", "a", "bc"}));
  EXPECT_EQ(f.get_float_array("tokenizer.ggml.scores"), (std::vector<double>{0.5, -1.25, 2.0}));
  EXPECT_EQ(f.get_int_or("absent", 9), 9);
  EXPECT_EQ(f.get_float_or("absent", 0.5), 0.5);
  EXPECT_TRUE(f.get_bool_or("absent", true));
  EXPECT_EQ(f.get_string_or("absent", "x"), "x");
  expect_error([&](const std::string&) { f.get_int("absent"); }, path, "metadata key absent missing");
  expect_error([&](const std::string&) { f.get_int("general.architecture"); }, path,
               "has type STRING, expected an integer");
  expect_error([&](const std::string&) { f.get_string_or("llama.block_count", ""); }, path,
               "has type U32, expected STRING");
  expect_error([&](const std::string&) { f.get_int_array("tokenizer.ggml.tokens"); }, path,
               "has type ARRAY[STRING], expected an array of integers");
}

TEST(GgufRoundTrip, WriterRejectsInconsistentInput) {
  const std::string path = test::temp_dir() + "/bad.gguf";
  expect_error([](const std::string& p) { write_gguf(p, {}, {{"t", DType::F32, {4}, std::vector<uint8_t>(15)}}); },
               path, "tensor t has 15 bytes, shape [4] of F32 needs 16");
  expect_error([](const std::string& p) { write_gguf(p, {}, {{"t", DType::Q4_0, {16}, std::vector<uint8_t>(9)}}); },
               path, "tensor t row length 16 is not a multiple of the Q4_0 block size 32");
  expect_error([](const std::string& p) { write_gguf(p, {{"k", gguf_int(GgufType::U8, 256)}}, {}); }, path,
               "does not fit its type");
  expect_error([](const std::string& p) { write_gguf(p, {}, {}, 48); }, path, "not a power of two");
  EXPECT_FALSE(test::file_exists(path));
}

// ----------------------------------------------------------------------------------------------------------------
// Dequantization and quantization against gguf-python (bit-exact)
// ----------------------------------------------------------------------------------------------------------------

const std::vector<DType> kDequantTypes = {DType::F32,  DType::F16,  DType::BF16, DType::F64,  DType::Q4_0,
                                          DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,
                                          DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K};
const std::vector<DType> kRefQuantTypes = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0};

bool dequantizable(DType t) {
  return std::find(kDequantTypes.begin(), kDequantTypes.end(), t) != kDequantTypes.end();
}

const GgufTensorInfo& golden_tensor(const GgufFile& g, const std::string& name) {
  const GgufTensorInfo* t = g.find_tensor(name);
  if (t == nullptr) fail(g.path(), ": golden tensor ", name, " missing; rerun tools/make_quant_golden.py");
  return *t;
}

TEST(GgmlQuantsGolden, DequantizeMatchesGgufPythonBitExact) {
  const GgufFile g = GgufFile::open(test::fixture("ggml_quants_golden.bin"));
  for (DType t : kDequantTypes) {
    const std::string name(dtype_info(t).name);
    SCOPED_TRACE(name);
    const GgufTensorInfo& blocks = golden_tensor(g, "dequant." + name + ".blocks");
    const GgufTensorInfo& values = golden_tensor(g, "dequant." + name + ".values");
    ASSERT_EQ(blocks.dtype, t);
    ASSERT_EQ(values.dtype, DType::F32);
    const int64_t n = values.shape[0];
    ASSERT_EQ(blocks.shape[0], n);
    EXPECT_TRUE(same_floats(dequantize(t, blocks.data, n), reinterpret_cast<const float*>(values.data),
                            static_cast<size_t>(n)));
  }
}

TEST(GgmlQuantsGolden, QuantizeMatchesGgufPythonByteExact) {
  const GgufFile g = GgufFile::open(test::fixture("ggml_quants_golden.bin"));
  for (DType t : kRefQuantTypes) {
    const std::string name(dtype_info(t).name);
    SCOPED_TRACE(name);
    const GgufTensorInfo& input = golden_tensor(g, "quantize." + name + ".input");
    const GgufTensorInfo& blocks = golden_tensor(g, "quantize." + name + ".blocks");
    const int64_t n = input.shape[0];
    std::vector<uint8_t> ours(blocks.nbytes);
    quantize_row_ref(t, reinterpret_cast<const float*>(input.data), ours.data(), n);
    for (size_t i = 0; i < ours.size(); ++i) {
      ASSERT_EQ(ours[i], blocks.data[i]) << "byte " << i << " (block " << i / dtype_info(t).block_bytes << ")";
    }
  }
}

// Quantizer vs full precision: RMS error over RMS of the input, Gaussian data. Budgets sit ~25% above the worst
// case that ggml's reference rounding gives on these rows (measured: Q4_0 0.123, Q4_1 0.090, Q5_0 0.043,
// Q5_1 0.045, Q8_0 0.0055; the 32-element row is the noisiest).
constexpr double kMaxRelRmsQ4_0 = 0.15;
constexpr double kMaxRelRmsQ4_1 = 0.115;
constexpr double kMaxRelRmsQ5_0 = 0.055;
constexpr double kMaxRelRmsQ5_1 = 0.056;
constexpr double kMaxRelRmsQ8_0 = 0.007;

TEST(GgmlQuants, RoundTripWithinPerFormatBudget) {
  const std::pair<DType, double> budgets[] = {{DType::Q4_0, kMaxRelRmsQ4_0}, {DType::Q4_1, kMaxRelRmsQ4_1},
                                              {DType::Q5_0, kMaxRelRmsQ5_0}, {DType::Q5_1, kMaxRelRmsQ5_1},
                                              {DType::Q8_0, kMaxRelRmsQ8_0}};
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [t, budget] : budgets) {
    for (int64_t k : {32, 576, 1536, 4096}) {
      SCOPED_TRACE(std::string(dtype_info(t).name) + " k=" + std::to_string(k));
      std::vector<float> x(static_cast<size_t>(k));
      for (float& v : x) v = normal(rng) * 0.05f;
      std::vector<uint8_t> q(dtype_bytes(t, static_cast<uint64_t>(k)));
      quantize_row_ref(t, x.data(), q.data(), k);
      const std::vector<float> y = dequantize(t, q.data(), k);
      double err2 = 0, ref2 = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        err2 += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
        ref2 += double(x[i]) * x[i];
      }
      EXPECT_LE(std::sqrt(err2 / ref2), budget);
    }
  }
  // An all-zero block must come back as exact zeros (scale 0, no division by zero).
  for (DType t : kRefQuantTypes) {
    std::vector<float> zeros(32, 0.0f);
    std::vector<uint8_t> q(static_cast<size_t>(dtype_info(t).block_bytes));
    quantize_row_ref(t, zeros.data(), q.data(), 32);
    for (float v : dequantize(t, q.data(), 32)) EXPECT_EQ(v, 0.0f) << dtype_info(t).name;
  }
}

TEST(GgmlQuants, RejectsBadArguments) {
  float out[64];
  uint8_t buf[256] = {};
  EXPECT_THROW(dequantize_row(DType::Q4_0, buf, out, 33), Error);
  EXPECT_THROW(dequantize_row(DType::I32, buf, out, 4), Error);
  EXPECT_THROW(quantize_row_ref(DType::Q4_K, out, buf, 256), Error);
  EXPECT_THROW(quantize_row_ref(DType::Q8_0, out, buf, 31), Error);
}

// ----------------------------------------------------------------------------------------------------------------
// The real SmolLM2 file (skipped when it is not in the model cache)
// ----------------------------------------------------------------------------------------------------------------

TEST(GgufSmolLM2, HeaderAndRowsMatchGgufPython) {
  const std::string model = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(model, "SmolLM2-135M-Instruct.Q4_1.gguf");
  const GgufFile g = GgufFile::open(test::fixture("ggml_quants_golden.bin"));
  if (!g.has("smollm2.version")) GTEST_SKIP() << "golden fixture was generated without the model";
  const GgufFile f = GgufFile::open(model);
  EXPECT_EQ(f.version(), static_cast<uint32_t>(g.get_int("smollm2.version")));
  EXPECT_EQ(static_cast<int64_t>(f.tensors().size()), g.get_int("smollm2.tensor_count"));
  EXPECT_EQ(static_cast<int64_t>(f.metadata().size()), g.get_int("smollm2.kv_count"));
  // Values below as reported by gguf.GGUFReader for this file.
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->shape, (std::vector<int64_t>{49152, 576}));
  for (const GgufTensorInfo& t : f.tensors()) EXPECT_TRUE(dequantizable(t.dtype)) << t.name;

  int rows_checked = 0;
  for (const GgufTensorInfo& gt : g.tensors()) {
    const std::string& gname = gt.name;
    if (gname.rfind("smollm2.", 0) != 0 || !gname.ends_with(".blocks")) continue;
    const size_t row_pos = gname.rfind(".row");
    const std::string tensor = gname.substr(8, row_pos - 8);
    const int64_t row = std::stoll(gname.substr(row_pos + 4));
    SCOPED_TRACE(tensor + " row " + std::to_string(row));
    const GgufTensorInfo* t = f.find_tensor(tensor);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(static_cast<int64_t>(t->offset), g.get_int("smollm2." + tensor + ".offset"));
    const int64_t k = t->shape.back();
    const uint64_t row_bytes = dtype_bytes(t->dtype, static_cast<uint64_t>(k));
    ASSERT_EQ(gt.nbytes, row_bytes);
    const uint8_t* src = t->data + row * static_cast<int64_t>(row_bytes);
    ASSERT_EQ(std::memcmp(src, gt.data, row_bytes), 0) << "model bytes differ from the fixture's copy";
    const GgufTensorInfo& values = golden_tensor(g, "smollm2." + tensor + ".row" + std::to_string(row) + ".values");
    EXPECT_TRUE(same_floats(dequantize(t->dtype, src, k), reinterpret_cast<const float*>(values.data),
                            static_cast<size_t>(k)));
    ++rows_checked;
  }
  EXPECT_GE(rows_checked, 4);
}

TEST(GgufSmolLM2, EveryTensorDequantizesToFiniteValues) {
  const std::string model = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(model, "SmolLM2-135M-Instruct.Q4_1.gguf");
  const GgufFile f = GgufFile::open(model);
  std::vector<float> row;
  for (const GgufTensorInfo& t : f.tensors()) {
    const int64_t k = t.shape.back();
    const int64_t rows = static_cast<int64_t>(t.nbytes / dtype_bytes(t.dtype, static_cast<uint64_t>(k)));
    row.resize(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t.dtype, t.data + r * (t.nbytes / rows), row.data(), k);
      for (float v : row) ASSERT_TRUE(std::isfinite(v)) << t.name << " row " << r;
    }
  }
}

// ----------------------------------------------------------------------------------------------------------------
// Hostile files
// ----------------------------------------------------------------------------------------------------------------

class GgufHostile : public ::testing::Test {
 protected:
  std::string dir_ = test::temp_dir();
  // A file with one F32 tensor of `ne0` elements at `offset`, with `data_bytes` of data after the padding.
  std::string one_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset,
                         size_t data_bytes = 64) {
    return GgufBytes().header(3, 1, 0).tensor("t", std::move(ne), type, offset).pad(32).zeros(data_bytes)
        .write(dir_, name);
  }
};

TEST_F(GgufHostile, FileLevel) {
  expect_gguf_error(dir_ + "/missing.gguf", "cannot open");
  expect_gguf_error(dir_, "is a directory");
  test::write_file(dir_ + "/empty.gguf", "");
  expect_gguf_error(dir_ + "/empty.gguf", "empty file");
  test::write_file(dir_ + "/magic.gguf", "GGML\x03\0\0\0");
  expect_gguf_error(dir_ + "/magic.gguf", "bad magic, not a GGUF file");
  expect_gguf_error(GgufBytes().header(1, 0, 0).write(dir_, "v1.gguf"), "GGUF version 1 is not supported");
  expect_gguf_error(GgufBytes().header(7, 0, 0).write(dir_, "v7.gguf"), "unsupported GGUF version 7");
  expect_gguf_error(GgufBytes().header(0x03000000, 0, 0).write(dir_, "be.gguf"), "big-endian");
  test::write_file(dir_ + "/trunc.gguf", std::string("GGUF\x03\0\0\0\x01\0", 10));
  expect_gguf_error(dir_ + "/trunc.gguf", "truncated file: tensor count at offset 8");
}

TEST_F(GgufHostile, Counts) {
  expect_gguf_error(GgufBytes().header(3, 0, 1ull << 62).write(dir_, "kv.gguf"), "metadata count");
  expect_gguf_error(GgufBytes().header(3, 1ull << 62, 0).write(dir_, "t.gguf"),
                    "tensor count 4611686018427387904 is more than the file can hold");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("arr").put<uint32_t>(9).put<uint32_t>(4)
                        .put<uint64_t>(1ull << 60).zeros(64).write(dir_, "arr.gguf"),
                    "array of key arr claims 1152921504606846976 elements, more than the file can hold");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("s").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1000)
                        .zeros(64).write(dir_, "sarr.gguf"),
                    "more than the file can hold");
}

TEST_F(GgufHostile, Metadata) {
  expect_gguf_error(GgufBytes().header(3, 0, 1).put<uint64_t>(1000).zeros(16).write(dir_, "key.gguf"),
                    "metadata key: string length 1000 at offset 24 runs past end of file");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("name").put<uint32_t>(8).put<uint64_t>(1ull << 40).zeros(16)
                        .write(dir_, "val.gguf"),
                    "value of key name: string length 1099511627776");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("k").put<uint32_t>(13).put<uint64_t>(0)
                        .write(dir_, "type.gguf"),
                    "metadata key k has unknown value type 13");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(99).put<uint64_t>(0)
                        .write(dir_, "etype.gguf"),
                    "array of key k has unknown element type 99");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(0)
                        .write(dir_, "nested.gguf"),
                    "nested arrays are not supported");
  expect_gguf_error(GgufBytes().header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).write(dir_, "dup.gguf"),
                    "duplicate metadata key k");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("b").put<uint32_t>(7).put<uint8_t>(2)
                        .write(dir_, "bool.gguf"),
                    "bool value 2 of key b is not 0 or 1");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("u").put<uint32_t>(10).put<uint64_t>(~0ull)
                        .write(dir_, "u64.gguf"),
                    "exceeds INT64_MAX");
  expect_gguf_error(GgufBytes().header(3, 0, 1).kv_u32("general.alignment", 48).write(dir_, "align.gguf"),
                    "general.alignment 48 is not a positive power of two");
  expect_gguf_error(GgufBytes().header(3, 0, 1).kv_u32("general.alignment", 0).write(dir_, "align0.gguf"),
                    "general.alignment 0 is not a positive power of two");
  expect_gguf_error(GgufBytes().header(3, 0, 1).str("general.alignment").put<uint32_t>(8).str("32")
                        .write(dir_, "align_str.gguf"),
                    "general.alignment has type STRING, expected an integer");
}

TEST_F(GgufHostile, TensorInfos) {
  expect_gguf_error(one_tensor("dtype.gguf", {8}, 99, 0), "tensor t has unknown ggml type 99");
  expect_gguf_error(one_tensor("q8_1.gguf", {32}, 9, 0), "tensor t has unsupported ggml type 9 (Q8_1)");
  expect_gguf_error(one_tensor("ndims.gguf", {1, 1, 1, 1, 1}, kGgmlF32, 0),
                    "tensor t has 5 dimensions (must be 1 to 4)");
  expect_gguf_error(one_tensor("ndims0.gguf", {}, kGgmlF32, 0), "tensor t has 0 dimensions");
  expect_gguf_error(one_tensor("zero.gguf", {8, 0}, kGgmlF32, 0), "tensor t has a zero dimension");
  expect_gguf_error(one_tensor("overflow.gguf", {1ull << 32, 1ull << 32}, kGgmlF32, 0), "element count overflows");
  expect_gguf_error(one_tensor("block.gguf", {33}, kGgmlQ4_0, 0),
                    "tensor t row length 33 is not a multiple of the Q4_0 block size 32");
  expect_gguf_error(one_tensor("misaligned.gguf", {8}, kGgmlF32, 4),
                    "tensor t offset 4 is not a multiple of the alignment 32");
  expect_gguf_error(one_tensor("extent.gguf", {1024}, kGgmlF32, 0),
                    "tensor t data (offset 0 in the data section, 4096 bytes) extends past end of file");
  expect_gguf_error(one_tensor("far.gguf", {8}, kGgmlF32, ~0ull - 31), "extends past end of file");
  expect_gguf_error(GgufBytes().header(3, 1, 0).str("t").put<uint32_t>(1).put<uint64_t>(8).put<uint32_t>(0).zeros(7)
                        .write(dir_, "cut.gguf"),
                    "truncated file: data offset of tensor t at offset 49 needs 8 bytes, only 7 left");
  expect_gguf_error(GgufBytes().header(3, 1, 0).tensor("t", {8}, kGgmlF32, 0).write(dir_, "nodata.gguf"),
                    "data section (aligned to 32) starts past end of file");
  expect_gguf_error(GgufBytes().header(3, 2, 0).tensor("a", {16}, kGgmlF32, 0).tensor("b", {16}, kGgmlF32, 32)
                        .pad(32).zeros(128).write(dir_, "overlap.gguf"),
                    "tensors a and b overlap");
  expect_gguf_error(GgufBytes().header(3, 2, 0).tensor("a", {8}, kGgmlF32, 0).tensor("a", {8}, kGgmlF32, 32)
                        .pad(32).zeros(64).write(dir_, "dupname.gguf"),
                    "duplicate tensor name a");
  // A control character in a name must not break the one-line message.
  expect_gguf_error(GgufBytes().header(3, 1, 0).tensor("bad\nname", {8}, 99, 0).pad(32).zeros(32)
                        .write(dir_, "nl.gguf"),
                    "tensor bad?name has unknown ggml type 99");
}

// ----------------------------------------------------------------------------------------------------------------
// Fuzz-ish: every single-byte corruption and every truncation of a valid file either opens or throws Error
// ----------------------------------------------------------------------------------------------------------------

// Opens `path`; when that succeeds, touches every tensor byte through dequantize_row (so an out-of-bounds
// extent would be caught by a sanitizer build). Returns false on lowbit::Error; any other exception fails.
bool open_and_read(const std::string& path) {
  return test::opens_or_refuses_cleanly(path, [](const std::string& p) {
    const GgufFile f = GgufFile::open(p);
    std::vector<float> out;
    uint64_t checksum = 0;
    for (const GgufTensorInfo& t : f.tensors()) {
      const DTypeInfo& info = dtype_info(t.dtype);
      out.resize(static_cast<size_t>(t.nbytes / info.block_bytes * info.block_elems));
      if (dequantizable(t.dtype)) dequantize_row(t.dtype, t.data, out.data(), static_cast<int64_t>(out.size()));
      else for (uint64_t i = 0; i < t.nbytes; ++i) checksum += t.data[i];
    }
    return checksum;   // returned so the byte loop is not optimized away
  });
}

TEST(GgufFuzz, CorruptedAndTruncatedFilesNeverCrash) {
  const std::string dir = test::temp_dir();
  const std::string valid = test::read_file(write_small_gguf(dir + "/valid.gguf"));
  ASSERT_TRUE(open_and_read(dir + "/valid.gguf"));
  // multi-byte corruptions, including large little-endian values in count fields
  test::fuzz_file(valid, dir + "/mutant.gguf", open_and_read,
                  [](std::string& m, std::mt19937& rng) {
    const size_t pos = rng() % m.size();
    const size_t len = 1 + rng() % 8;
    for (size_t j = pos; j < std::min(m.size(), pos + len); ++j) m[j] = static_cast<char>(rng() % 3 ? rng() : 0xFF);
  }, 2000);
}

}  // namespace
}  // namespace lowbit
