// The .lowbit container (io/lowbit_file.h): write/read round trip bit-exact (config, tokenizer, method, dense
// tensors, packed parts), the file is a plain safetensors file, the bit accounting on a hand-computable case,
// format detection through read_weights, and every corrupt container refused with one line naming the file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "formats/format_table.h"
#include "formats/uniform/layout.h"
#include "io/lowbit_file.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "packed_fixtures.h"

namespace lowbit {
namespace {

using nlohmann::ordered_json;
using test::expect_error;
using Storage = std::vector<std::shared_ptr<std::vector<uint8_t>>>;
namespace fs = std::filesystem;

constexpr char kQ[] = "model.layers.0.self_attn.q_proj.weight";
constexpr char kK[] = "model.layers.0.self_attn.k_proj.weight";
constexpr char kEmbed[] = "model.embed_tokens.weight";

ModelConfig tiny_config() {
  ModelConfig c;
  c.arch = "llama";
  c.name = "tiny-lowbit-test";
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 40;
  c.max_seq_len = 256;
  c.rope_theta = 500000.0f;
  c.rms_eps = 1e-5f;
  c.rope_scaling = RopeScaling::Llama3;
  c.rope_factor = 8.0f;
  c.rope_low_freq_factor = 1.0f;
  c.rope_high_freq_factor = 4.0f;
  c.rope_original_max_pos = 128;
  c.bos_id = 1;
  c.eos_id = 2;
  return c;
}

// A vocabulary exercising every field, including pieces that are not UTF-8 and non-finite scores.
VocabData tiny_vocab() {
  VocabData v;
  v.kind = TokenizerKind::SentencePieceBpe;
  v.pre = "default";
  for (int i = 0; i < 40; ++i) {
    v.tokens.push_back("\xe2\x96\x81tok" + std::to_string(i));
    v.scores.push_back(-0.1f * static_cast<float>(i) + 1e-7f);
    v.types.push_back(TokenType::Normal);
  }
  v.tokens[3] = std::string("\xff\xfe", 2);          // a raw byte piece (llama2.c vocabularies have these)
  v.tokens[4] = std::string("a\0b", 3);              // an embedded NUL
  v.tokens[5] = "\xed\xa0\x80";                      // an encoded surrogate: not valid UTF-8
  v.scores[6] = -std::numeric_limits<float>::infinity();
  v.types[0] = TokenType::Unknown;
  v.types[1] = TokenType::Control;
  v.types[7] = TokenType::Byte;
  v.merges = {"a b", "\xe2\x96\x81 t"};
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.pad_id = -1;
  v.add_bos = true;
  v.add_space_prefix = false;
  v.space_prefix_first_only = true;
  v.space_prefix_unless_space = true;
  v.ignore_merges = true;
  v.chat_template = "{% for m in messages %}<|{{ m.role }}|> \xe2\x9c\x93{% endfor %}";
  return v;
}

using test::random_quantized;

struct DenseTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A small model: dense tensors in each fp dtype, two packed weights (asym g32, and sym act-order 3-bit).
struct TinyModel {
  std::vector<DenseTensor> dense;
  std::map<std::string, PackedWeight> packed;
  Storage storage;

  TinyModel() {
    std::mt19937 rng(7);
    auto add = [&](const std::string& name, DType dtype, std::vector<int64_t> shape) {
      DenseTensor t{name, dtype, shape, {}};
      uint64_t numel = 1;
      for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
      t.bytes.resize(dtype_bytes(dtype, numel));
      for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(rng());
      if (dtype == DType::F16)  // keep the values finite (not required, but realistic)
        for (size_t i = 1; i < t.bytes.size(); i += 2) t.bytes[i] &= 0x3b;
      dense.push_back(std::move(t));
    };
    add(kEmbed, DType::F16, {40, 64});
    add("model.layers.0.input_layernorm.weight", DType::BF16, {64});
    add("model.norm.weight", DType::F32, {64});
    packed[kQ] = pack_uniform(random_quantized(64, 64, 4, 32, false, false, 1), storage);
    packed[kK] = pack_uniform(random_quantized(32, 64, 3, 16, true, true, 2), storage);
  }

  LowbitWriteSpec spec() const {
    LowbitWriteSpec s;
    s.source_path = "/models/tiny";
    s.source_format = "huggingface";
    s.config = tiny_config();
    s.vocab = tiny_vocab();
    s.method_json = R"({"name": "gptq", "bits": 4, "group_size": 128, "damp": 0.01, "calibration": {"text": "x", "tokens": 2048}})";
    for (const DenseTensor& t : dense) s.dense.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
    s.packed = packed;
    return s;
  }
};

std::vector<uint8_t> bytes_of(const TensorView& v) { return std::vector<uint8_t>(v.data, v.data + v.nbytes); }

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.hidden_dim, b.hidden_dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.rope_scaling, b.rope_scaling);
  EXPECT_EQ(a.rope_factor, b.rope_factor);
  EXPECT_EQ(a.rope_low_freq_factor, b.rope_low_freq_factor);
  EXPECT_EQ(a.rope_high_freq_factor, b.rope_high_freq_factor);
  EXPECT_EQ(a.rope_original_max_pos, b.rope_original_max_pos);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_id, b.eos_id);
}

void expect_same_vocab(const VocabData& a, const VocabData& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.pre, b.pre);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.scores.size(), b.scores.size());
  for (size_t i = 0; i < a.scores.size(); ++i) {  // bit-exact, -inf included
    uint32_t x, y;
    std::memcpy(&x, &a.scores[i], 4);
    std::memcpy(&y, &b.scores[i], 4);
    EXPECT_EQ(x, y) << "score " << i;
  }
  EXPECT_EQ(a.types, b.types);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.ignore_merges, b.ignore_merges);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_id, b.eos_id);
  EXPECT_EQ(a.unk_id, b.unk_id);
  EXPECT_EQ(a.pad_id, b.pad_id);
  EXPECT_EQ(a.add_bos, b.add_bos);
  EXPECT_EQ(a.add_space_prefix, b.add_space_prefix);
  EXPECT_EQ(a.space_prefix_first_only, b.space_prefix_first_only);
  EXPECT_EQ(a.space_prefix_unless_space, b.space_prefix_unless_space);
  EXPECT_EQ(a.chat_template, b.chat_template);
}

// The tensors and metadata of a safetensors file, editable, and written back with write_safetensors.
struct Contents {
  std::vector<DenseTensor> tensors;
  std::map<std::string, std::string> metadata;
  ordered_json lowbit;

  explicit Contents(const std::string& path) {
    const SafetensorsFile st = SafetensorsFile::open(path);
    for (const auto& [name, v] : st.tensors()) tensors.push_back({name, v.dtype, v.shape, bytes_of(v)});
    metadata = st.metadata();
    lowbit = ordered_json::parse(metadata.at(kLowbitMetadataKey));
  }
  DenseTensor& tensor(const std::string& name) {
    for (DenseTensor& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
  void erase(const std::string& name) {
    std::erase_if(tensors, [&](const DenseTensor& t) { return t.name == name; });
  }
  // Writes with the (edited) lowbit JSON unless the metadata entry itself was replaced.
  void save(const std::string& path, bool keep_metadata_text = false) {
    std::vector<SafetensorsWriteTensor> ts;
    for (const DenseTensor& t : tensors) ts.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
    std::map<std::string, std::string> meta = metadata;
    if (!keep_metadata_text) meta[kLowbitMetadataKey] = lowbit.dump();
    write_safetensors(path, ts, meta);
  }
};

class LowbitFile : public testing::Test {
 protected:
  LowbitFile() : dir_(test::temp_dir()), path_(dir_ + "/tiny.uniform-4bit.lowbit") {
    summary_ = write_lowbit(path_, model_.spec());
  }
  ~LowbitFile() override { fs::remove_all(dir_); }

  void expect_refused(const std::string& path, const std::string& phrase) {
    expect_error([](const std::string& p) { read_lowbit(p); }, path, phrase);
  }
  // A copy of the good file with `edit` applied, at a new path.
  template <typename Edit>
  std::string edited(const std::string& name, Edit edit, bool keep_metadata_text = false) {
    Contents c(path_);
    edit(c);
    const std::string p = dir_ + "/" + name + ".lowbit";
    c.save(p, keep_metadata_text);
    return p;
  }

  std::string dir_, path_;
  TinyModel model_;
  LowbitSummary summary_;
};

// ---------------------------------------------------------------------------------------------------------------
// Round trip
// ---------------------------------------------------------------------------------------------------------------

TEST_F(LowbitFile, RoundTripIsBitExact) {
  const WeightSet ws = read_lowbit(path_);
  EXPECT_EQ(ws.format, ModelFormat::Lowbit);
  EXPECT_EQ(ws.path, path_);
  expect_same_config(ws.config, tiny_config());
  ASSERT_TRUE(ws.vocab.has_value());
  expect_same_vocab(*ws.vocab, tiny_vocab());

  ASSERT_EQ(ws.tensors.size(), model_.dense.size());
  for (const DenseTensor& t : model_.dense) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(ws.tensors.count(t.name));
    const TensorView& v = ws.tensors.at(t.name);
    EXPECT_EQ(v.dtype, t.dtype);
    EXPECT_EQ(v.shape, t.shape);
    EXPECT_EQ(bytes_of(v), t.bytes);
  }
  ASSERT_EQ(ws.packed.size(), model_.packed.size());
  for (const auto& [name, w] : model_.packed) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(ws.packed.count(name));
    const PackedWeight& r = ws.packed.at(name);
    EXPECT_EQ(r.format, w.format);
    EXPECT_EQ(r.shape, w.shape);
    EXPECT_EQ(r.params, w.params);
    ASSERT_EQ(r.parts.size(), w.parts.size());
    for (const auto& [part, view] : w.parts) {
      const TensorView& rv = r.parts.at(part);
      EXPECT_EQ(rv.name, name + "." + part);  // stored as "<canonical name>.<part>"
      EXPECT_EQ(rv.dtype, view.dtype);
      EXPECT_EQ(rv.shape, view.shape);
      EXPECT_EQ(bytes_of(rv), bytes_of(view)) << part;
    }
    // The weights decode to exactly what was packed.
    const UniformQuantized a = unpack_uniform(w, name), b = unpack_uniform(r, name);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.scales, b.scales);
    EXPECT_EQ(a.zeros, b.zeros);
    EXPECT_EQ(a.g_idx, b.g_idx);
  }
  EXPECT_EQ(ordered_json::parse(lowbit_method_json(path_)), ordered_json::parse(model_.spec().method_json));
}

TEST_F(LowbitFile, WithoutTokenizer) {
  LowbitWriteSpec s = model_.spec();
  s.vocab.reset();
  const std::string p = dir_ + "/no-vocab.lowbit";
  write_lowbit(p, s);
  EXPECT_FALSE(read_lowbit(p).vocab.has_value());
  EXPECT_TRUE(Contents(p).lowbit["tokenizer"].is_null());
}

// Any safetensors reader opens it: every part is a plain tensor, the JSON a metadata string.
TEST_F(LowbitFile, IsAPlainSafetensorsFile) {
  const SafetensorsFile st = SafetensorsFile::open(path_);
  EXPECT_EQ(st.metadata().size(), 1u);
  ASSERT_TRUE(st.metadata().count("lowbit"));
  const TensorView* qweight = st.find(std::string(kQ) + ".qweight");
  ASSERT_NE(qweight, nullptr);
  EXPECT_EQ(qweight->dtype, DType::I32);
  EXPECT_EQ(qweight->shape, (std::vector<int64_t>{64, 8}));
  ASSERT_NE(st.find(std::string(kK) + ".g_idx"), nullptr);
  EXPECT_EQ(st.find(std::string(kK) + ".zeros"), nullptr);  // symmetric
  EXPECT_EQ(st.tensors().size(), 3u + 3u + 3u);             // dense + q (qweight, scales, zeros) + k (qweight, scales, g_idx)

  const ordered_json j = ordered_json::parse(st.metadata().at("lowbit"));
  EXPECT_EQ(j["format_version"], 1);
  EXPECT_EQ(j["source"]["path"], "/models/tiny");
  EXPECT_EQ(j["source"]["format"], "huggingface");
  EXPECT_EQ(j["config"]["hidden_size"], 64);
  EXPECT_EQ(j["config"]["_name_or_path"], "tiny-lowbit-test");
  EXPECT_EQ(j["method"]["name"], "gptq");
  EXPECT_EQ(j["tensors"][kEmbed], (ordered_json{{"format", "dense"}, {"dtype", "F16"}}));
  EXPECT_EQ(j["tensors"][kQ]["parts"]["qweight"], std::string(kQ) + ".qweight");
  EXPECT_EQ(j["tensors"][kQ]["params"]["bits"], 4);
  EXPECT_EQ(j["tokenizer"]["tokens"][3], (ordered_json{{"hex", "fffe"}}));
}

// ---------------------------------------------------------------------------------------------------------------
// Bit accounting
// ---------------------------------------------------------------------------------------------------------------

TEST_F(LowbitFile, AverageBitsOnAHandComputableCase) {
  // n=4, k=64, bits=4, g=32, asym: 4*64*4 code bits + 4*2*16 scale bits + 4*2*8 zero bits = 1216 bits / 256
  // weights = 4.75 bits per weight. No dense tensors, so the whole data section is those 1216 bits too.
  LowbitWriteSpec s = model_.spec();
  s.dense.clear();
  s.packed.clear();
  s.packed["w"] = pack_uniform(random_quantized(4, 64, 4, 32, false, false, 3), model_.storage);
  const std::string p = dir_ + "/hand.lowbit";
  const LowbitSummary sum = write_lowbit(p, s);
  EXPECT_EQ(sum.quantized_weights, 256);
  EXPECT_EQ(sum.quantized_bits, 1216.0);
  EXPECT_EQ(sum.avg_bits_per_weight, 4.75);
  EXPECT_EQ(sum.file_bytes, fs::file_size(p));
  const ordered_json bits = Contents(p).lowbit["bits"];
  EXPECT_EQ(bits["quantized_weights"], 256);
  EXPECT_EQ(bits["quantized_bits"], 1216);
  EXPECT_EQ(bits["avg_bits_per_weight"], 4.75);
  EXPECT_EQ(bits["file_bits_per_param"], 4.75);
}

TEST_F(LowbitFile, SummaryOfTheTinyModel) {
  // q: 64*8 words*32 + 64*2*16 + 64*2*8 = 16384 + 2048 + 1024; k: 3-bit, 192 bits/row = 6 words -> 32*6*32
  // + 32*4*16 (scales, G = 4) + 64*32 (g_idx) = 6144 + 2048 + 2048.
  EXPECT_EQ(summary_.quantized_weights, 64 * 64 + 32 * 64);
  EXPECT_EQ(summary_.quantized_bits, 19456.0 + 10240.0);
  EXPECT_DOUBLE_EQ(summary_.avg_bits_per_weight, 29696.0 / 6144.0);
  EXPECT_EQ(summary_.file_bytes, fs::file_size(path_));
  // data bits: dense 40*64*16 + 64*16 + 64*32 = 44032, plus the packed 29696; params 2560 + 64 + 64 + 6144.
  EXPECT_DOUBLE_EQ(Contents(path_).lowbit["bits"]["file_bits_per_param"].get<double>(), (44032.0 + 29696.0) / 8832.0);
}

// ---------------------------------------------------------------------------------------------------------------
// Format detection
// ---------------------------------------------------------------------------------------------------------------

TEST_F(LowbitFile, ReadWeightsDetectsTheContainer) {
  EXPECT_TRUE(is_lowbit_file(path_));
  EXPECT_EQ(read_weights(path_).format, ModelFormat::Lowbit);
  // A .safetensors name does not hide it: the metadata decides.
  const std::string renamed = dir_ + "/model.safetensors";
  fs::copy_file(path_, renamed);
  EXPECT_TRUE(is_lowbit_file(renamed));
  EXPECT_EQ(read_weights(renamed).format, ModelFormat::Lowbit);
  // Plain safetensors, text, missing files: not lowbit.
  const std::string plain = dir_ + "/plain.safetensors";
  const float one = 1.0f;
  write_safetensors(plain, {{"x", DType::F32, {1}, &one}}, {});
  EXPECT_FALSE(is_lowbit_file(plain));
  test::write_file(dir_ + "/text.txt", "hello, not a model");
  EXPECT_FALSE(is_lowbit_file(dir_ + "/text.txt"));
  EXPECT_FALSE(is_lowbit_file(dir_ + "/missing.lowbit"));
  EXPECT_FALSE(is_lowbit_file(dir_));
  // A damaged file named .lowbit gets the container's error, not a format guess.
  const std::string junk = dir_ + "/junk.lowbit";
  test::write_file(junk, "GGUFjunk");
  expect_error([](const std::string& p) { read_weights(p); }, junk, "header length");
}

// ---------------------------------------------------------------------------------------------------------------
// Corrupt containers: each refused with one line naming the file and the problem
// ---------------------------------------------------------------------------------------------------------------

TEST_F(LowbitFile, RefusesBadMetadataJson) {
  expect_refused(edited("bad-json", [](Contents& c) { c.metadata["lowbit"] = "{\"format_version\": 1,"; }, true),
                 "lowbit metadata is not valid JSON");
  expect_refused(edited("dup-key", [](Contents& c) {
                   c.metadata["lowbit"] = "{\"format_version\":1," + c.lowbit.dump().substr(1);
                 }, true),
                 "has the key \"format_version\" twice in one object");
  expect_refused(edited("not-object", [](Contents& c) { c.metadata["lowbit"] = "[1]"; }, true),
                 "lowbit metadata must be a JSON object");
  expect_refused(edited("extra-key", [](Contents& c) { c.lowbit["extras"] = 1; }),
                 "lowbit metadata has an unknown key \"extras\"");
  expect_refused(edited("no-method", [](Contents& c) { c.lowbit.erase("method"); }),
                 "lowbit metadata has no \"method\"");
}

TEST_F(LowbitFile, RefusesUnsupportedVersion) {
  expect_refused(edited("v2", [](Contents& c) { c.lowbit["format_version"] = 2; }),
                 "unsupported lowbit format_version 2 (this build reads version 1)");
  expect_refused(edited("v-str", [](Contents& c) { c.lowbit["format_version"] = "1"; }),
                 "unsupported lowbit format_version \"1\"");
}

TEST_F(LowbitFile, RefusesMissingLowbitMetadata) {
  const std::string p = edited("no-meta", [](Contents& c) { c.metadata.clear(); }, true);
  expect_refused(p, "not a .lowbit file: the safetensors metadata has no \"lowbit\" key");
  EXPECT_FALSE(is_lowbit_file(p));
  expect_error([](const std::string& path) { lowbit_method_json(path); }, p, "no \"lowbit\" key");
}

TEST_F(LowbitFile, RefusesMissingPartTensor) {
  expect_refused(edited("no-scales", [](Contents& c) { c.erase(std::string(kQ) + ".scales"); }),
                 "part scales of " + std::string(kQ) + " refers to tensor " + kQ +
                     ".scales, which the file does not hold");
  expect_refused(edited("no-embed", [](Contents& c) { c.erase(kEmbed); }),
                 "dense tensor " + std::string(kEmbed) + " refers to tensor");
  expect_refused(edited("part-entry-gone", [](Contents& c) { c.lowbit["tensors"][kQ]["parts"].erase("zeros"); }),
                 "missing part zeros");
}

TEST_F(LowbitFile, RefusesPartWithWrongDTypeOrShape) {
  expect_refused(edited("scales-f32", [](Contents& c) {
                   DenseTensor& t = c.tensor(std::string(kQ) + ".scales");
                   t.dtype = DType::F32;
                   t.bytes.resize(t.bytes.size() * 2);
                 }),
                 "tensor " + std::string(kQ) + ": part scales has dtype F32, format uniform needs F16");
  expect_refused(edited("qweight-reshaped", [](Contents& c) { c.tensor(std::string(kQ) + ".qweight").shape = {8, 64}; }),
                 "part qweight has shape [8, 64], format uniform needs [n, ceil(k*bits/32)] = [64, 8]");
  // The logical shape in the metadata is checked against the parts: k 65 needs a 9th word per row; k 63 fits
  // the same 8 words, but column 63's codes then sit in what must be zero padding.
  expect_refused(edited("k-65", [](Contents& c) { c.lowbit["tensors"][kQ]["shape"] = {64, 65}; }),
                 "part qweight has shape [64, 8], format uniform needs [n, ceil(k*bits/32)] = [64, 9]");
  expect_refused(edited("k-63", [](Contents& c) { c.lowbit["tensors"][kQ]["shape"] = {64, 63}; }),
                 "has non-zero padding bits after its 63 codes");
}

TEST_F(LowbitFile, RefusesBadPackedValues) {
  expect_refused(edited("zero-too-wide", [](Contents& c) { c.tensor(std::string(kQ) + ".zeros").bytes[3] = 16; }),
                 "part zeros [1, 1] = 16 is not below 2^bits = 16");
  expect_refused(edited("g-idx-out", [](Contents& c) {
                   const int32_t bad = 4;  // G = 64 / 16
                   std::memcpy(c.tensor(std::string(kK) + ".g_idx").bytes.data() + 4 * 10, &bad, 4);
                 }),
                 "part g_idx [10] = 4 is outside [0, 4)");
  expect_refused(edited("bits-9", [](Contents& c) { c.lowbit["tensors"][kQ]["params"]["bits"] = 9; }),
                 "parameter bits = 9 is out of range [2, 8]");
  expect_refused(edited("bits-str", [](Contents& c) { c.lowbit["tensors"][kQ]["params"]["bits"] = "4"; }),
                 "parameter bits must be an integer");
}

TEST_F(LowbitFile, RefusesUnknownFormat) {
  expect_refused(edited("unknown-format", [](Contents& c) { c.lowbit["tensors"][kQ]["format"] = "quik9"; }),
                 "tensor " + std::string(kQ) + ": unknown packed weight format 'quik9' (known: uniform, anyprec, mixed24, mixed24a, quik)");
}

TEST_F(LowbitFile, RefusesUnreferencedOrDoublyReferencedTensors) {
  expect_refused(edited("extra-tensor", [](Contents& c) {
                   c.tensors.push_back({"model.layers.0.mlp.up_proj.weight", DType::F32, {2}, std::vector<uint8_t>(8)});
                 }),
                 "tensor model.layers.0.mlp.up_proj.weight is in the file but not referenced by the lowbit metadata");
  expect_refused(edited("entry-dropped", [](Contents& c) { c.lowbit["tensors"].erase(kK); }),
                 "is in the file but not referenced");
  expect_refused(edited("twice", [](Contents& c) { c.lowbit["tensors"][kQ]["parts"]["scales"] = kEmbed; }),
                 "tensor " + std::string(kEmbed) + " is referenced twice");
}

TEST_F(LowbitFile, RefusesInconsistentEntries) {
  expect_refused(edited("dense-dtype", [](Contents& c) { c.lowbit["tensors"][kEmbed]["dtype"] = "F32"; }),
                 "metadata says dtype F32, the file holds F16");
  expect_refused(edited("dense-extra-key", [](Contents& c) { c.lowbit["tensors"][kEmbed]["scale"] = 1; }),
                 "has an unknown key \"scale\"");
  expect_refused(edited("bits-lie", [](Contents& c) { c.lowbit["bits"]["quantized_bits"] = 1; }),
                 "lowbit metadata bits");
  expect_refused(edited("config-bad", [](Contents& c) { c.lowbit["config"].erase("hidden_size"); }),
                 "config: missing required key 'hidden_size'");
  expect_refused(edited("config-arch", [](Contents& c) { c.lowbit["config"]["model_type"] = "gpt2"; }),
                 "config: unsupported model_type 'gpt2'");
  expect_refused(edited("tok-bos", [](Contents& c) { c.lowbit["tokenizer"]["ids"]["bos"] = 99; }),
                 "tokenizer: ids.bos must be -1 or a token id below 40, got 99");
  expect_refused(edited("tok-hex", [](Contents& c) { c.lowbit["tokenizer"]["tokens"][3]["hex"] = "fz"; }),
                 "tokenizer: token 3 has a character that is not a lowercase hex digit");
  expect_refused(edited("tok-scores", [](Contents& c) { c.lowbit["tokenizer"]["scores"].erase(0); }),
                 "tokenizer: 39 scores for 40 tokens");
  expect_refused(edited("tok-kind", [](Contents& c) { c.lowbit["tokenizer"]["kind"] = "wordpiece"; }),
                 "tokenizer: kind must be");
}

TEST_F(LowbitFile, RefusesTruncatedFile) {
  const std::string bytes = test::read_file(path_);
  const std::string p = dir_ + "/truncated.lowbit";
  test::write_file(p, bytes.substr(0, bytes.size() - 10));
  expect_refused(p, "outside the data section");
  test::write_file(p, bytes.substr(0, 100));  // inside the header
  expect_refused(p, "runs past end of file");
  test::write_file(p, "");
  expect_refused(p, "empty file");
}

// ---------------------------------------------------------------------------------------------------------------
// Writing: atomic, and nothing invalid is ever written
// ---------------------------------------------------------------------------------------------------------------

TEST_F(LowbitFile, FailedWriteLeavesNoFile) {
  const std::string p = dir_ + "/no/such/dir/model.lowbit";
  expect_error([&](const std::string& path) { write_lowbit(path, model_.spec()); }, p, "cannot write");
  EXPECT_FALSE(test::file_exists(p));
  EXPECT_FALSE(fs::exists(dir_ + "/no"));
}

TEST_F(LowbitFile, RefusedWriteKeepsTheExistingFile) {
  const std::string before = test::read_file(path_);
  auto refuse = [&](LowbitWriteSpec s, const std::string& phrase) {
    expect_error([&](const std::string& path) { write_lowbit(path, s); }, path_, phrase);
    EXPECT_EQ(test::read_file(path_), before);
  };
  LowbitWriteSpec s = model_.spec();
  s.method_json = "[\"gptq\"]";
  refuse(s, "method JSON must be an object");
  s = model_.spec();
  s.method_json = "{\"name\": ";
  refuse(s, "method JSON is not valid JSON");
  s = model_.spec();
  s.dense[0].dtype = DType::I32;
  refuse(s, "dense tensor model.embed_tokens.weight has dtype I32");
  s = model_.spec();
  s.dense.push_back({kQ, DType::F32, {1}, s.dense[0].data});
  refuse(s, "tensor " + std::string(kQ) + " is given both dense and packed");
  s = model_.spec();
  s.dense.push_back({std::string(kQ) + ".qweight", DType::F32, {1}, s.dense[0].data});
  refuse(s, "two tensors would be stored as " + std::string(kQ) + ".qweight");
  s = model_.spec();
  s.packed[kQ].params["bits"] = 9;
  refuse(s, "tensor " + std::string(kQ) + ": parameter bits = 9 is out of range [2, 8]");
  s = model_.spec();
  s.config.n_kv_heads = 3;
  refuse(s, "n_heads 4 is not a multiple of n_kv_heads 3");
  s = model_.spec();
  s.config.arch = "qwen2";  // to_hf_json cannot say "Qwen2 without q/k/v bias"
  refuse(s, "config field qkv_bias does not survive the Hugging Face config.json form");

  // Nothing but the good file is left in the directory (no temp files).
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) entries += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 1);
}

// Every truncation and single-byte corruption of a file holding an any-precision, a mixed24, a mixed24a and a quik weight either opens
// (and then every width decodes and multiplies without fault) or is refused with lowbit::Error.
TEST(LowbitFuzz, PackedFormatFilesNeverCrashTheReader) {
  TinyModel m;
  AnyPrecQuantized a = test::random_codes(64, 64, 4, (1u << 3) | (1u << 4), 5);
  a.outlier_rowptr.assign(65, 0);
  for (int64_t r = 0; r < 64; ++r) {
    if (r % 9 == 0) {
      a.outlier_col.push_back(static_cast<int32_t>(r % 64));
      a.outlier_val.push_back(f32_to_f16(0.25f));
    }
    a.outlier_rowptr[static_cast<size_t>(r + 1)] = static_cast<int32_t>(a.outlier_col.size());
  }
  m.packed[kQ] = pack_anyprec(a, m.storage);
  m.packed[kK] = pack_mixed24(test::random_mixed(32, 64, true, 6), m.storage);
  m.packed["model.layers.0.self_attn.v_proj.weight"] = pack_mixed24a(test::random_mixed24a(16, 64, true, 8), m.storage);
  m.packed["model.layers.0.self_attn.o_proj.weight"] = pack_quik(test::random_quik(8, 64, 4, 4, false, 5, 9), m.storage);
  const std::string dir = test::temp_dir();
  write_lowbit(dir + "/valid.lowbit", m.spec());
  const std::string valid = test::read_file(dir + "/valid.lowbit");
  std::vector<float> x(64, 0.5f), y(64);
  auto open_and_read = [&](const std::string& path) {
    try {
      const WeightSet ws = read_lowbit(path);
      for (const auto& [name, w] : ws.packed) {
        const auto op = make_packed_linear(w, nullptr, name);
        for (int b = 0; b <= 8; ++b)
          if (b == 0 || ((op->served_widths() >> b) & 1u)) {
            op->forward(x.data(), 1, y.data(), b);
            op->forward_ref(x.data(), 1, y.data(), b);
          }
      }
      return true;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      return false;
    }
  };
  ASSERT_TRUE(open_and_read(dir + "/valid.lowbit"));
  test::fuzz_file(valid, dir + "/mutant.lowbit", open_and_read,
                  [](std::string& bytes, std::mt19937& rng) {
                    for (int i = 0; i < 8; ++i) bytes[rng() % bytes.size()] = static_cast<char>(rng());
                  },
                  2000);
}

}  // namespace
}  // namespace lowbit
