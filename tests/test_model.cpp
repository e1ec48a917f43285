// Model loading and the CPU forward: against transformers (golden fixtures), against the scalar oracle, and
// against the reference figures of stories260K.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "runtime/perplexity.h"
#include "test_util.h"

namespace lowbit {
namespace {

using test::fixture;
using test::shared_path;

// Error budget of our fp32 forward vs transformers' fp32 forward on the same weights (issue: 1e-3 max abs).
constexpr double kMaxLogitAbsDiffVsHF = 1e-3;
// BLAS forward vs scalar double-accumulating oracle: only fp32 summation order differs.
constexpr double kMaxLogitAbsDiffVsRef = 2e-4;

std::string stories_bin() { return shared_path("models/stories260K/stories260K.bin"); }

double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

std::vector<std::string> nlohmann_prompts(const SafetensorsFile& f) {
  return nlohmann::json::parse(f.metadata().at("prompts")).get<std::vector<std::string>>();
}

std::vector<int32_t> ids_of(const TensorView& t) {
  const auto* p = reinterpret_cast<const int32_t*>(t.data);
  return std::vector<int32_t>(p, p + t.numel());
}

// ---------------------------------------------------------------------------------------------------------
// Tiny random HF models (tools/make_golden.py --tiny): config-driven features vs transformers.
class TinyHF : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyHF, AllPositionLogitsMatchTransformers) {
  const std::string dir = fixture(std::string("tiny_") + GetParam());
  auto model = Model::load(dir);
  SafetensorsFile golden = SafetensorsFile::open(dir + "/golden.safetensors");
  const std::vector<int32_t> ids = ids_of(*golden.find("ids"));
  const TensorView& want = *golden.find("logits");
  const int V = model->config().vocab_size;
  ASSERT_EQ(want.numel(), static_cast<int64_t>(ids.size()) * V);
  std::vector<float> logits(ids.size() * V), ref(ids.size() * V);
  KVCache cache = model->new_cache(static_cast<int>(ids.size()));
  model->forward(ids.data(), static_cast<int>(ids.size()), cache, logits.data(), true);
  EXPECT_LT(max_abs_diff(logits.data(), reinterpret_cast<const float*>(want.data), logits.size()), kMaxLogitAbsDiffVsHF);
  KVCache cache2 = model->new_cache(static_cast<int>(ids.size()));
  model->forward_ref(ids.data(), static_cast<int>(ids.size()), cache2, ref.data(), true);
  EXPECT_LT(max_abs_diff(logits.data(), ref.data(), logits.size()), kMaxLogitAbsDiffVsRef);
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyHF, ::testing::Values("llama3", "qwen2", "mistral", "mistral_sw"));

// The sliding window must matter on the 40-token fixture, or the test above could not catch a broken window.
TEST(TinyHF, SlidingWindowChangesLogits) {
  const std::string dir = test::temp_dir();
  std::filesystem::copy(fixture("tiny_mistral_sw"), dir, std::filesystem::copy_options::recursive);
  auto windowed = Model::load(dir);
  EXPECT_EQ(windowed->config().sliding_window, 6);
  std::string cfg = test::read_file(dir + "/config.json");
  cfg.replace(cfg.find("\"sliding_window\": 6"), 19, "\"sliding_window\": null");
  test::write_file(dir + "/config.json", cfg);
  auto full = Model::load(dir);
  EXPECT_EQ(full->config().sliding_window, 0);
  const std::vector<int32_t> ids = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79};
  const int n = static_cast<int>(ids.size()), V = full->config().vocab_size;
  std::vector<float> a(static_cast<size_t>(n) * V), b(a.size());
  KVCache ca = windowed->new_cache(n), cb = full->new_cache(n);
  windowed->forward(ids.data(), n, ca, a.data(), true);
  full->forward(ids.data(), n, cb, b.data(), true);
  EXPECT_EQ(max_abs_diff(a.data(), b.data(), static_cast<size_t>(6) * V), 0.0);   // inside the window: same
  EXPECT_GT(max_abs_diff(a.data() + 6 * V, b.data() + 6 * V, static_cast<size_t>(n - 6) * V), 1e-2);
}

TEST(TinyHF, ConfigFeaturesAreRead) {
  EXPECT_EQ(Model::load(fixture("tiny_llama3"))->config().rope_scaling, RopeScaling::Llama3);
  auto q = Model::load(fixture("tiny_qwen2"));
  EXPECT_TRUE(q->config().qkv_bias);
  EXPECT_TRUE(q->config().tie_embeddings);
  auto m = Model::load(fixture("tiny_mistral"));
  EXPECT_EQ(m->config().head_dim, 16);   // explicit head_dim != dim / heads
  EXPECT_GT(m->weights().files.size(), 1u);   // sharded
}

// Incremental decoding through the KV cache gives the same logits as one batched prefill.
TEST(Forward, KVCacheDecodeMatchesPrefill) {
  auto model = Model::load(fixture("tiny_mistral"));
  const int V = model->config().vocab_size;
  const std::vector<int32_t> ids = {5, 17, 3, 88, 41, 2, 60, 9, 33, 71, 12, 0};
  const int n = static_cast<int>(ids.size());
  std::vector<float> all(static_cast<size_t>(n) * V), step(V);
  KVCache c1 = model->new_cache(n);
  model->forward(ids.data(), n, c1, all.data(), true);
  KVCache c2 = model->new_cache(n);
  model->forward(ids.data(), 5, c2, nullptr, false);   // prefill 5, then one at a time
  for (int t = 5; t < n; ++t) {
    model->forward(&ids[static_cast<size_t>(t)], 1, c2, step.data(), false);
    EXPECT_LT(max_abs_diff(step.data(), all.data() + static_cast<size_t>(t) * V, V), 1e-4) << "position " << t;
  }
  EXPECT_EQ(c2.len, n);
  EXPECT_THROW(model->forward(ids.data(), 1, c2, step.data(), false), Error);   // cache full
  const int32_t bad = V;
  KVCache c3 = model->new_cache(4);
  EXPECT_THROW(model->forward(&bad, 1, c3, step.data(), false), Error);        // token out of range
}

// ---------------------------------------------------------------------------------------------------------
// Hugging Face directory error paths: built from a valid fixture with one thing broken.
class BrokenHF : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_dir();
    std::filesystem::copy(fixture("tiny_llama3"), dir_, std::filesystem::copy_options::recursive);
    std::filesystem::remove(dir_ + "/golden.safetensors");
  }
  // Rewrites model.safetensors with `edit` applied to the tensor list.
  void rewrite(const std::function<void(std::vector<SafetensorsWriteTensor>&)>& edit) {
    SafetensorsFile st = SafetensorsFile::open(dir_ + "/model.safetensors");
    std::vector<SafetensorsWriteTensor> ts;
    for (const auto& [name, v] : st.tensors()) ts.push_back({name, v.dtype, v.shape, v.data});
    edit(ts);
    write_safetensors(dir_ + "/model2.safetensors", ts, {});
    std::filesystem::rename(dir_ + "/model2.safetensors", dir_ + "/model.safetensors");
  }
  void expect_error(const std::string& phrase) {
    try {
      Model::load(dir_);
      FAIL() << "expected an error containing '" << phrase << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  }
  std::string dir_;
};

TEST_F(BrokenHF, MissingTensor) {
  rewrite([](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; }), ts.end());
  });
  expect_error("missing tensor model.layers.1.mlp.up_proj.weight");
}

TEST_F(BrokenHF, WrongShape) {
  rewrite([](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.norm.weight") t.shape = {16};
  });
  expect_error("model.norm.weight has shape [16], expected [32]");
}

TEST_F(BrokenHF, UnexpectedTensor) {
  static float extra[4] = {1, 2, 3, 4};
  rewrite([](auto& ts) { ts.push_back({"model.layers.0.mlp.extra.weight", DType::F32, {4}, extra}); });
  expect_error("unexpected tensor model.layers.0.mlp.extra.weight");
}

TEST_F(BrokenHF, UnsupportedArchitecture) {
  std::string cfg = test::read_file(dir_ + "/config.json");
  cfg.replace(cfg.find("\"llama\""), 7, "\"gemma2\"");
  test::write_file(dir_ + "/config.json", cfg);
  expect_error("unsupported model_type 'gemma2'");
}

TEST_F(BrokenHF, UnsupportedRopeScaling) {
  std::string cfg = test::read_file(dir_ + "/config.json");
  cfg.replace(cfg.find("\"llama3\""), 8, "\"yarn\"");
  test::write_file(dir_ + "/config.json", cfg);
  expect_error("unsupported rope scaling type 'yarn'");
}

TEST_F(BrokenHF, MissingWeightsFile) {
  std::filesystem::remove(dir_ + "/model.safetensors");
  expect_error("no model.safetensors");
}

TEST(LoadErrors, MissingPathAndUnknownFormat) {
  EXPECT_THROW(Model::load("/nonexistent/model.gguf"), Error);
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/junk.bin", std::string(100, '\x07'));
  try {
    Model::load(dir + "/junk.bin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("junk.bin: not a model file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Model::load(dir), Error);   // directory without config.json
}

// ---------------------------------------------------------------------------------------------------------
// stories260K (llama2.c checkpoint): reference figures from shared/models/stories260K/PROVENANCE.md.
TEST(Stories260K, ForwardMatchesScalarReference) {
  LOWBIT_REQUIRE_FILE(stories_bin(), "shared/models/stories260K/stories260K.bin");
  auto model = Model::load(stories_bin());
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 430, 271, 280, 343, 395, 270, 378, 343, 281, 500, 44};
  const int n = static_cast<int>(ids.size()), V = model->config().vocab_size;
  std::vector<float> a(static_cast<size_t>(n) * V), b(a.size());
  KVCache c1 = model->new_cache(n), c2 = model->new_cache(n);
  model->forward(ids.data(), n, c1, a.data(), true);
  model->forward_ref(ids.data(), n, c2, b.data(), true);
  EXPECT_LT(max_abs_diff(a.data(), b.data(), a.size()), kMaxLogitAbsDiffVsRef);
}

TEST(Stories260K, PerplexityOnTinyStoriesSample) {
  LOWBIT_REQUIRE_FILE(stories_bin(), "shared/models/stories260K/stories260K.bin");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(text, "shared/data/tinystories sample");
  auto model = Model::load(stories_bin());
  const auto docs = test::tinystories_docs(*model);
  ASSERT_EQ(docs.size(), 8u);
  PplOptions po;
  po.ctx = 512;
  const PplResult r = perplexity(*model, make_windows_documents(docs, po.ctx), po);
  EXPECT_EQ(r.predicted, 2586);
  EXPECT_NEAR(r.ppl, 3.138, 0.002);
  EXPECT_NEAR(r.mean_nll, 1.1435, 0.0005);
  EXPECT_NEAR(r.top1, 0.684, 0.001);
}

TEST(Stories260K, GreedyContinuation) {
  LOWBIT_REQUIRE_FILE(stories_bin(), "shared/models/stories260K/stories260K.bin");
  auto model = Model::load(stories_bin());
  const std::string prompt = "Once upon a time, there was a little girl named Lily.";
  const std::string want =
      " She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was";
  GenerateOptions go;
  go.max_new_tokens = 64;
  const auto ids = model->tokenizer().encode(prompt, true, false);
  const GenerateResult r = generate(*model, ids, go);
  ASSERT_GE(r.text.size(), want.size()) << r.text;
  EXPECT_EQ(r.text.substr(0, want.size()), want);
}

// ---------------------------------------------------------------------------------------------------------
// SmolLM2-135M-Instruct (GGUF Q4_1): last-position logits vs transformers (tools/make_golden.py).
TEST(SmolLM2, LastLogitsMatchTransformers) {
  const std::string gguf = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(gguf, "SmolLM2 GGUF");
  auto model = Model::load(gguf);
  SafetensorsFile golden = SafetensorsFile::open(fixture("smollm2_golden.safetensors"));
  const int V = model->config().vocab_size;
  int checked = 0;
  for (int i = 0;; ++i) {
    const TensorView* ids_t = golden.find("ids." + std::to_string(i));
    if (ids_t == nullptr) break;
    const std::vector<int32_t> ids = ids_of(*ids_t);
    const TensorView& want = *golden.find("logits." + std::to_string(i));
    ASSERT_EQ(want.numel(), V);
    std::vector<float> logits(static_cast<size_t>(V));
    KVCache cache = model->new_cache(static_cast<int>(ids.size()));
    model->forward(ids.data(), static_cast<int>(ids.size()), cache, logits.data(), false);
    const double d = max_abs_diff(logits.data(), reinterpret_cast<const float*>(want.data), logits.size());
    EXPECT_LT(d, kMaxLogitAbsDiffVsHF) << "prompt " << i;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// Our tokenizer gives the ids transformers gave for the same prompts (special tokens parsed, as HF does).
TEST(SmolLM2, PromptIdsMatchTransformers) {
  const std::string gguf = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(gguf, "SmolLM2 GGUF");
  auto model = Model::load(gguf);
  SafetensorsFile golden = SafetensorsFile::open(fixture("smollm2_golden.safetensors"));
  const auto prompts = nlohmann_prompts(golden);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(model->tokenizer().encode(prompts[i], model->tokenizer().add_bos_default(), true),
              ids_of(*golden.find("ids." + std::to_string(i))))
        << prompts[i];
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// llama2.c checkpoints have no magic: the header must be plausible and agree with the file size exactly.
class BrokenLlama2c : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = test::shared_path("models/stories260K/stories260K.bin");
    if (src_.empty()) GTEST_SKIP() << "missing stories260K (shared/models)";
    bytes_ = test::read_file(src_);
    dir_ = test::temp_dir();
  }
  void expect_error(const std::string& bytes, const std::string& phrase) {
    const std::string p = dir_ + "/model.bin";
    test::write_file(p, bytes);
    try {
      Model::load(p);
      FAIL() << "expected an error containing '" << phrase << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  }
  std::string src_, bytes_, dir_;
};

TEST_F(BrokenLlama2c, Truncated) { expect_error(bytes_.substr(0, bytes_.size() / 2), "truncated llama2.c checkpoint"); }
TEST_F(BrokenLlama2c, TrailingBytes) { expect_error(bytes_ + "junk", "size mismatch"); }
TEST_F(BrokenLlama2c, TooShort) { expect_error(bytes_.substr(0, 10), "too short for a llama2.c header"); }
TEST_F(BrokenLlama2c, ImplausibleHeader) {
  std::string b = bytes_;
  const int32_t heads = 7;   // dim 64 is not a multiple of 7
  std::memcpy(&b[12], &heads, 4);
  expect_error(b, "header is implausible");
  const int32_t huge = 1 << 30;
  b = bytes_;
  std::memcpy(&b[0], &huge, 4);
  expect_error(b, "header is implausible");
}
TEST_F(BrokenLlama2c, MissingTokenizerIsReported) {
  const std::string p = dir_ + "/alone.bin";
  test::write_file(p, bytes_);
  auto m = Model::load(p);   // weights load without a tokenizer...
  EXPECT_FALSE(m->has_tokenizer());
  try {
    m->tokenizer();          // ...but asking for one names the fix
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// GGUF -> Hugging Face directory -> load: identical logits (bit for bit) and identical token ids.
TEST(SmolLM2, ConvertedDirectoryIsIdentical) {
  const std::string gguf = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(gguf, "SmolLM2 GGUF");
  const std::string dir = test::temp_dir() + "/smollm2-hf";
  std::string out;
  ASSERT_EQ(test::run_cli("convert " + gguf + " " + dir, &out), 0) << out;
  auto a = Model::load(gguf);
  auto b = Model::load(dir);
  EXPECT_EQ(b->weights().format, ModelFormat::HuggingFace);
  EXPECT_EQ(b->config().tie_embeddings, a->config().tie_embeddings);
  const std::string text = "<|im_start|>user\nConvert me: naïve café 1234 日本<|im_end|>\n";
  const auto ids = a->tokenizer().encode(text, false, true);
  EXPECT_EQ(b->tokenizer().encode(text, false, true), ids);
  const int V = a->config().vocab_size;
  std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
  KVCache ca = a->new_cache(static_cast<int>(ids.size())), cb = b->new_cache(static_cast<int>(ids.size()));
  a->forward(ids.data(), static_cast<int>(ids.size()), ca, la.data(), false);
  b->forward(ids.data(), static_cast<int>(ids.size()), cb, lb.data(), false);
  EXPECT_EQ(max_abs_diff(la.data(), lb.data(), la.size()), 0.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lowbit

#include "io/gguf.h"

namespace lowbit {
namespace {

// Writes a tiny HF fixture model as a llama.cpp-style GGUF (names, metadata, and for arch "llama" the q/k row
// permutation convert_hf_to_gguf applies), then checks the GGUF loads to the transformers logits: this exercises
// the GGUF name map, the metadata reader and the RoPE un-permutation against an independent oracle.
void write_gguf_like_llama_cpp(const Model& hf, const std::string& arch, const std::string& path) {
  const ModelConfig& c = hf.config();
  std::map<std::string, GgufValue> kv;
  kv["general.architecture"] = gguf_string(arch);
  kv[arch + ".embedding_length"] = gguf_int(GgufType::U32, c.dim);
  kv[arch + ".feed_forward_length"] = gguf_int(GgufType::U32, c.hidden_dim);
  kv[arch + ".block_count"] = gguf_int(GgufType::U32, c.n_layers);
  kv[arch + ".attention.head_count"] = gguf_int(GgufType::U32, c.n_heads);
  kv[arch + ".attention.head_count_kv"] = gguf_int(GgufType::U32, c.n_kv_heads);
  kv[arch + ".attention.key_length"] = gguf_int(GgufType::U32, c.head_dim);
  kv[arch + ".context_length"] = gguf_int(GgufType::U32, c.max_seq_len);
  kv[arch + ".rope.freq_base"] = gguf_float(GgufType::F32, c.rope_theta);
  kv[arch + ".attention.layer_norm_rms_epsilon"] = gguf_float(GgufType::F32, c.rms_eps);
  const std::vector<std::pair<std::string, std::string>> block = {
      {"input_layernorm.weight", "attn_norm.weight"},   {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},     {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},         {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},         {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},          {"mlp.down_proj.weight", "ffn_down.weight"}};
  std::vector<GgufWriteTensor> ts;
  for (const std::string& name : hf.tensor_names()) {
    std::string g;
    if (name == "model.embed_tokens.weight") g = "token_embd.weight";
    else if (name == "model.norm.weight") g = "output_norm.weight";
    else if (name == "lm_head.weight") g = "output.weight";
    else {
      const size_t dot = name.find('.', 13);   // "model.layers." is 13 chars
      const std::string layer = name.substr(13, dot - 13), rest = name.substr(dot + 1);
      for (const auto& [h, gg] : block)
        if (rest == h) g = "blk." + layer + "." + gg;
    }
    const auto& shape = hf.tensor_shape(name);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const float* src = hf.tensor_f32(name);
    std::vector<float> data(src, src + numel);
    const bool qk = name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos;
    if (arch == "llama" && qk) {   // HF half-split rows -> interleaved pairs (convert_hf_to_gguf's permute)
      const int64_t cols = numel / shape[0], hd = c.head_dim, half = hd / 2;
      for (int64_t r = 0; r < shape[0]; ++r) {
        const int64_t h = r / hd, w = r % hd, i = w / 2, j = w % 2;
        std::copy_n(src + (h * hd + j * half + i) * cols, cols, data.data() + r * cols);
      }
    }
    GgufWriteTensor t{g, DType::F32, shape, {}};
    t.bytes.resize(static_cast<size_t>(numel) * 4);
    std::memcpy(t.bytes.data(), data.data(), t.bytes.size());
    ts.push_back(std::move(t));
  }
  write_gguf(path, kv, ts);
}

class GgufFromHF : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(GgufFromHF, LogitsMatchTransformers) {
  const auto [fixture_name, arch] = GetParam();
  const std::string dir = fixture(std::string("tiny_") + fixture_name);
  auto hf = Model::load(dir);
  const std::string path = test::temp_dir() + "/tiny.gguf";
  write_gguf_like_llama_cpp(*hf, arch, path);
  auto g = Model::load(path);
  EXPECT_EQ(g->weights().format, ModelFormat::Gguf);
  EXPECT_EQ(g->weights().qk_interleaved, std::string(arch) == "llama");
  SafetensorsFile golden = SafetensorsFile::open(dir + "/golden.safetensors");
  const std::vector<int32_t> ids = ids_of(*golden.find("ids"));
  const int n = static_cast<int>(ids.size());
  std::vector<float> logits(static_cast<size_t>(n) * g->config().vocab_size);
  KVCache cache = g->new_cache(n);
  g->forward(ids.data(), n, cache, logits.data(), true);
  EXPECT_LT(max_abs_diff(logits.data(), reinterpret_cast<const float*>(golden.find("logits")->data), logits.size()),
            kMaxLogitAbsDiffVsHF);
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufFromHF,
                         ::testing::Values(std::make_pair("mistral", "llama"), std::make_pair("qwen2", "qwen2")));

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// transformers loaded `lowbit convert stories260K.bin DIR` (tools/make_golden.py --stories-hf): its logits on the
// converted directory equal ours on the original llama2.c file, and its tokenizer (our tokenizer.json) gave the
// ids ours gives. This is the check that converted models flow to other tools.
TEST(Stories260K, TransformersOnConvertedDirectoryAgrees) {
  LOWBIT_REQUIRE_FILE(stories_bin(), "shared/models/stories260K/stories260K.bin");
  auto model = Model::load(stories_bin());
  SafetensorsFile golden = SafetensorsFile::open(fixture("stories260k_golden.safetensors"));
  const auto prompts = nlohmann_prompts(golden);
  ASSERT_EQ(prompts.size(), 2u);
  const int V = model->config().vocab_size;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t> ids = ids_of(*golden.find("ids." + std::to_string(i)));
    EXPECT_EQ(model->tokenizer().encode(prompts[i], true, false), ids) << prompts[i];
    std::vector<float> logits(static_cast<size_t>(V));
    KVCache cache = model->new_cache(static_cast<int>(ids.size()));
    model->forward(ids.data(), static_cast<int>(ids.size()), cache, logits.data(), false);
    EXPECT_LT(max_abs_diff(logits.data(), reinterpret_cast<const float*>(golden.find("logits." + std::to_string(i))->data),
                           logits.size()),
              kMaxLogitAbsDiffVsRef)
        << prompts[i];
  }
}

}  // namespace
}  // namespace lowbit
