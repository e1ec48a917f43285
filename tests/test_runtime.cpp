// Runtime pieces: evaluation text protocols, windows, sampler, chat templates; the Backend front end on the CPU
// (perplexity and generation through open_backend give the CPU Model's numbers bit for bit, the device choice and its
// errors), the one tensor conversion both models load through, the process memory probe, and the random Hugging
// Face model script.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/rss.h"
#include "formats/format_id.h"
#include "model/model.h"
#include "model/weight_convert.h"
#include "runtime/backend.h"
#include "runtime/chat_template.h"
#include "runtime/eval_text.h"
#include "runtime/perplexity.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace lowbit {
namespace {

TEST(EvalText, WikiTextRowsJoinedAsGPTQ) {
  const std::string wiki = test::shared_path("data/wikitext-2-raw/wiki.test.raw");
  LOWBIT_REQUIRE_FILE(wiki, "WikiText-2 raw test");
  const EvalText t = load_eval_text(wiki, TextMode::Auto, "text", "");
  EXPECT_EQ(t.mode, TextMode::WikiText);
  ASSERT_EQ(t.docs.size(), 1u);
  // shared/data/SOURCES.md: "The result has 1,294,336 characters" (code points; 1,296,370 UTF-8 bytes)
  size_t code_points = 0;
  for (unsigned char ch : t.docs[0]) code_points += (ch & 0xC0) != 0x80;
  EXPECT_EQ(code_points, 1294336u);
  EXPECT_EQ(t.docs[0].size(), 1296370u);
  EXPECT_EQ(t.docs[0].substr(0, 34), "\n\n = Robert Boulter = \n\n\n\n\n Robert");
}

TEST(EvalText, ModesAndErrors) {
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/a.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"x\": 1}\n");
  EvalText j = load_eval_text(dir + "/a.jsonl", TextMode::Auto, "text", "");
  EXPECT_EQ(j.mode, TextMode::Jsonl);
  EXPECT_EQ(j.docs[0], "one\n\ntwo");
  EXPECT_THROW(load_eval_text(dir + "/a.jsonl", TextMode::Auto, "body", ""), Error);
  test::write_file(dir + "/bad.jsonl", "{\"text\": \"one\"}\n{oops\n");
  try {
    load_eval_text(dir + "/bad.jsonl", TextMode::Auto, "text", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: invalid JSON"), std::string::npos) << e.what();
  }
  test::write_file(dir + "/d.txt", "  first story \n<|endoftext|>\nsecond\n<|endoftext|>\n");
  EvalText d = load_eval_text(dir + "/d.txt", TextMode::Auto, "text", "<|endoftext|>");
  EXPECT_EQ(d.docs, (std::vector<std::string>{"first story", "second"}));
  test::write_file(dir + "/empty.txt", "");
  EXPECT_THROW(load_eval_text(dir + "/empty.txt", TextMode::Plain, "text", ""), Error);
  EXPECT_THROW(load_eval_text(dir + "/missing.txt", TextMode::Plain, "text", ""), Error);
  EXPECT_THROW(parse_text_mode("xml"), Error);
}

TEST(Windows, NonOverlappingTailDropped) {
  std::vector<int32_t> ids(10);
  for (int i = 0; i < 10; ++i) ids[static_cast<size_t>(i)] = i;
  auto w = make_windows_contiguous(ids, 4);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[1], (std::vector<int32_t>{4, 5, 6, 7}));
  int64_t dropped = -1;
  auto d = make_windows_documents({{1, 2, 3, 4, 5}, {1}, {1, 9}}, 2, &dropped);
  // doc 0 -> [1,2] (3 tokens past ctx dropped), doc 1 predicts nothing, doc 2 -> [1,9]
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(d[1], (std::vector<int32_t>{1, 9}));
  EXPECT_EQ(dropped, 3);
  EXPECT_THROW(make_windows_contiguous(ids, 1), Error);
}

TEST(Sampler, GreedyAndFilters) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  Sampler greedy(SamplingParams{});
  auto l = logits;
  EXPECT_EQ(greedy.sample(l.data(), 4, {}), 1);
  // top-k 1 at any temperature is greedy
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  Sampler s1(p);
  for (int i = 0; i < 50; ++i) {
    l = logits;
    EXPECT_EQ(s1.sample(l.data(), 4, {}), 1);
  }
  // top-p keeps the smallest prefix reaching the mass: tokens 1 and 2 only
  p.top_k = 0;
  p.temperature = 1.0f;
  p.top_p = 0.6f;
  p.seed = 3;
  Sampler s2(p);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) {
    l = logits;
    ++seen[s2.sample(l.data(), 4, {})];
  }
  EXPECT_EQ(seen.count(0) + seen.count(3), 0u);
  EXPECT_GT(seen[1], seen[2]);
  // frequencies follow the softmax: p(1)/p(2) = e^0.1 renormalised
  const double expect1 = std::exp(2.0) / (std::exp(2.0) + std::exp(1.9));
  EXPECT_NEAR(seen[1] / 2000.0, expect1, 0.04);
}

TEST(Sampler, RepetitionPenaltyAndValidation) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {1.0f, 1.5f, -1.0f};
  EXPECT_EQ(s.sample(l.data(), 3, {1}), 0);   // 1.5 / 2 = 0.75 < 1.0
  EXPECT_FLOAT_EQ(l[1], 0.75f);
  std::vector<float> l2 = {-0.5f, -1.0f, -2.0f};
  s.sample(l2.data(), 3, {0});
  EXPECT_FLOAT_EQ(l2[0], -1.0f);              // negative logits are multiplied
  SamplingParams bad;
  bad.top_p = 0.0f;
  EXPECT_THROW(Sampler{bad}, Error);
  bad = {};
  bad.temperature = -1;
  EXPECT_THROW(Sampler{bad}, Error);
}

TEST(Sampler, SeedReproducible) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<float> base(100);
  for (int i = 0; i < 100; ++i) base[static_cast<size_t>(i)] = std::sin(static_cast<float>(i));
  Sampler a(p), b(p);
  for (int i = 0; i < 20; ++i) {
    auto x = base, y = base;
    EXPECT_EQ(a.sample(x.data(), 100, {}), b.sample(y.data(), 100, {}));
  }
}

TEST(ChatTemplate, Families) {
  const std::string smol =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
      "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
  EXPECT_EQ(apply_chat_template(smol, {{"user", "Hi"}}, ""),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(smol, {{"system", "S"}, {"user", "Hi"}}, ""),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template("<|start_header_id|>", {{"user", "Hi"}}, "<|begin_of_text|>"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(apply_chat_template("[INST]", {{"system", "S"}, {"user", "Hi"}}, "<s>"),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST]");
  EXPECT_THROW(apply_chat_template("", {{"user", "Hi"}}, ""), Error);
  EXPECT_THROW(apply_chat_template("{{ unknown }}", {{"user", "Hi"}}, ""), Error);
}

// ---------------------------------------------------------------------------------------------------------
// The Backend front end on the CPU.

std::string stories_bin() { return test::shared_path("models/stories260K/stories260K.bin"); }

// OpenMP's reductions add their threads' partial sums in the order the threads finish; with one thread there is one
// order, so two runs of the same arithmetic can be compared bit for bit.
class OneThread {
 public:
  OneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// The CPU perplexity written out independently of the Backend, as it stands on the Model alone: a fresh KV cache per
// window, every position's logits, NLL and top-1 accumulated in double.
PplResult oracle_perplexity(const Model& m, const std::vector<std::vector<int32_t>>& windows, int bits, bool reference) {
  PplResult r;
  const int V = m.config().vocab_size;
  double nll = 0;
  int64_t hits = 0;
  for (const auto& toks : windows) {
    const int n = static_cast<int>(toks.size());
    KVCache cache = m.new_cache(n);
    std::vector<float> logits(static_cast<size_t>(n) * V);
    if (reference) m.forward_ref(toks.data(), n, cache, logits.data(), true, bits);
    else m.forward(toks.data(), n, cache, logits.data(), true, bits);
    double window_nll = 0;
    int64_t window_hits = 0;
    for (int t = 0; t < n - 1; ++t) {
      const float* lg = logits.data() + static_cast<size_t>(t) * V;
      float mx = lg[0];
      int arg = 0;
      for (int i = 1; i < V; ++i)
        if (lg[i] > mx) { mx = lg[i]; arg = i; }
      double sum = 0;
      for (int i0 = 0; i0 < V; i0 += 1024) {
        float part = 0;
        for (int i = i0; i < std::min(V, i0 + 1024); ++i) part += std::exp(lg[i] - mx);
        sum += part;
      }
      window_nll += std::log(sum) + mx - lg[toks[static_cast<size_t>(t) + 1]];
      window_hits += arg == toks[static_cast<size_t>(t) + 1];
    }
    nll += window_nll;
    hits += window_hits;
    r.predicted += n - 1;
    r.evaluated += n;
  }
  r.mean_nll = nll / static_cast<double>(r.predicted);
  r.ppl = std::exp(r.mean_nll);
  r.top1 = static_cast<double>(hits) / static_cast<double>(r.predicted);
  return r;
}

void expect_same_ppl(const PplResult& got, const PplResult& want, const std::string& what) {
  EXPECT_EQ(got.mean_nll, want.mean_nll) << what;
  EXPECT_EQ(got.ppl, want.ppl) << what;
  EXPECT_EQ(got.top1, want.top1) << what;
  EXPECT_EQ(got.predicted, want.predicted) << what;
  EXPECT_EQ(got.evaluated, want.evaluated) << what;
}

BackendOptions on_cpu() {
  BackendOptions o;
  o.device = Device::Cpu;
  return o;
}

// stories260K's reference protocol (8 TinyStories documents, ctx 512) and synthetic windows of mixed lengths on the
// tiny architecture fixtures (the one KV cache, sized for the longest window, reused by shorter ones after it).
TEST(Backend, CpuPerplexityIsTheModelsBitForBit) {
  OneThread one;
  const std::string bin = stories_bin();
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(text, "TinyStories sample");
  auto model = Model::load(bin);
  const auto windows = make_windows_documents(test::tinystories_docs(*model), 512);
  auto backend = open_backend(bin, on_cpu());
  EXPECT_EQ(backend->device_name(), "cpu");
  PplOptions po;
  po.ctx = 512;
  const PplResult want = oracle_perplexity(*model, windows, 0, false);
  const PplResult got = perplexity(*backend, windows, po);
  expect_same_ppl(got, want, "stories260K through open_backend");
  expect_same_ppl(perplexity(*model, windows, po), want, "stories260K through the Model overload");
  EXPECT_EQ(got.predicted, 2586);
  EXPECT_EQ(got.windows, 8);
  EXPECT_NEAR(got.ppl, 3.138, 0.002);   // shared/models/stories260K/PROVENANCE.md
  // The scalar oracle forward, asked per call or for the whole backend.
  po.max_windows = 2;
  po.reference_path = true;
  const std::vector<std::vector<int32_t>> two(windows.begin(), windows.begin() + 2);
  const PplResult want_ref = oracle_perplexity(*model, two, 0, true);
  expect_same_ppl(perplexity(*backend, windows, po), want_ref, "stories260K, reference path");
  BackendOptions ref = on_cpu();
  ref.reference = true;
  po.reference_path = false;
  expect_same_ppl(perplexity(*open_backend(bin, ref), windows, po), want_ref, "stories260K, reference backend");

  for (const char* arch : {"llama3", "qwen2", "mistral_sw"}) {
    const std::string dir = test::fixture(std::string("tiny_") + arch);
    auto m = Model::load(dir);
    const int V = m->config().vocab_size;
    std::vector<std::vector<int32_t>> w;
    for (int len : {40, 17, 33, 2}) {
      w.emplace_back();
      for (int t = 0; t < len; ++t) w.back().push_back(static_cast<int32_t>((t * 7919 + len * 13) % V));
    }
    PplOptions o;
    o.ctx = 40;
    expect_same_ppl(perplexity(*open_backend(dir, on_cpu()), w, o), oracle_perplexity(*m, w, 0, false), arch);
  }
}

// The CPU generation loop written out on the Model alone: prefill, then sample / forward one token at a time.
std::vector<int32_t> oracle_generate(const Model& m, const std::vector<int32_t>& prompt, const SamplingParams& p, int n,
                                     int capacity) {
  KVCache cache = m.new_cache(capacity);
  Sampler sampler(p);
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  std::vector<int32_t> history = prompt, out;
  m.forward(prompt.data(), static_cast<int>(prompt.size()), cache, logits.data(), false);
  for (int i = 0; i < n; ++i) {
    const int32_t next = sampler.sample(logits.data(), m.config().vocab_size, history);
    out.push_back(next);
    history.push_back(next);
    if (i + 1 == n || cache.len >= cache.capacity) break;
    m.forward(&next, 1, cache, logits.data(), false);
  }
  return out;
}

// Greedy, temperature / top-k / top-p and repetition-penalty sampling: the same tokens and text as the Model's own
// loop, and the context stop where the cache fills.
TEST(Backend, CpuGenerateIsTheModelsTokenForToken) {
  const std::string bin = stories_bin();
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  auto model = Model::load(bin);
  auto backend = open_backend(bin, on_cpu());
  const auto prompt = backend->tokenizer().encode("Once upon a time, there was a little girl named Lily.", true, false);
  SamplingParams greedy, sampled, penalised;
  sampled.temperature = 0.8f;
  sampled.top_k = 40;
  sampled.top_p = 0.9f;
  sampled.seed = 7;
  penalised.temperature = 0.7f;
  penalised.repetition_penalty = 1.3f;
  penalised.seed = 11;
  for (const SamplingParams& p : {greedy, sampled, penalised}) {
    GenerateOptions go;
    go.max_new_tokens = 48;
    go.stop_at_eos = false;
    go.sampling = p;
    const GenerateResult r = generate(*backend, prompt, go);
    const auto want = oracle_generate(*model, prompt, p, 48, static_cast<int>(prompt.size()) + 48);
    EXPECT_EQ(r.new_ids, want) << "temperature " << p.temperature << " penalty " << p.repetition_penalty;
    EXPECT_EQ(r.stop_reason, "length");
    std::string text;
    for (int32_t t : want) text += backend->tokenizer().token_bytes(t);
    EXPECT_EQ(r.text, text);
    const GenerateResult via_model = generate(*model, prompt, go);
    EXPECT_EQ(via_model.new_ids, r.new_ids);
  }
  // A context of prompt + 5 positions: five tokens run, the sixth is sampled from the last logits, then it stops.
  GenerateOptions go;
  go.max_new_tokens = 20;
  go.stop_at_eos = false;
  go.ctx = static_cast<int>(prompt.size()) + 5;
  const GenerateResult r = generate(*backend, prompt, go);
  EXPECT_EQ(r.stop_reason, "context");
  EXPECT_EQ(r.new_ids, oracle_generate(*model, prompt, greedy, 20, go.ctx));
  EXPECT_EQ(r.new_ids.size(), 6u);
}

// What open_backend picks and how it refuses, in one line each.
TEST(Backend, OpenBackendChoosesTheDeviceAndRefusesClearly) {
  const std::string bin = stories_bin();
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  auto cpu = open_backend(bin, on_cpu());
  EXPECT_EQ(cpu->device_name(), "cpu");
  EXPECT_EQ(cpu->path(), bin);
  EXPECT_EQ(cpu->model_format(), ModelFormat::Llama2c);
  EXPECT_EQ(cpu->config().dim, 64);
  EXPECT_TRUE(cpu->has_tokenizer());
  EXPECT_TRUE(cpu->widths().empty());
  EXPECT_EQ(cpu->weight_bytes_per_token(0), Model::load(bin)->weight_bytes_per_token(0));
  test::expect_error([&](const std::string&) { cpu->check_bits(3); }, bin, "--bits 3 needs an any-precision model");
  const LoadStats st = cpu->load_stats();
  EXPECT_GT(st.seconds, 0);
  EXPECT_GE(st.peak_anon_rss_bytes, st.anon_rss_before_bytes);
  EXPECT_GT(st.vm_hwm_bytes, 0u);

  // Auto with the scalar oracle stays on the CPU whatever the machine has.
  BackendOptions ref;
  ref.reference = true;
  EXPECT_EQ(open_backend(bin, ref)->device_name(), "cpu");

  // --device cuda: the GPU, or one line saying why not (no CUDA in this build, no device); never a silent CPU.
  BackendOptions cuda;
  cuda.device = Device::Cuda;
  try {
    auto g = open_backend(bin, cuda);
    EXPECT_EQ(g->device_name().rfind("cuda: ", 0), 0u) << g->device_name();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("--device cuda: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  cuda.reference = true;
  try {
    open_backend(bin, cuda);
    ADD_FAILURE() << "--device cuda with the reference forward must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("--device cuda: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }

  // A missing file: the reader's error, naming it.
  const std::string missing = test::temp_dir() + "/missing.gguf";
  for (Device d : {Device::Auto, Device::Cpu}) {
    BackendOptions o;
    o.device = d;
    test::expect_error([&](const std::string& p) { open_backend(p, o); }, missing, "no such file or directory");
  }
  // A model file without a tokenizer loads; asking for its tokenizer is the error.
  const std::string tiny = test::fixture("tiny_llama3");
  auto no_tok = open_backend(tiny, on_cpu());
  EXPECT_FALSE(no_tok->has_tokenizer());
  test::expect_error([&](const std::string&) { no_tok->tokenizer(); }, tiny, "no tokenizer");
  EXPECT_EQ(std::string(device_option_name(Device::Cuda)), "cuda");
}

// The device choice of open_backend with a CUDA backend present, on any machine: stand-ins for the CUDA library's hooks
// (a GPU that is there or not; its "backend" is a CPU one, counted) drive the choice the CUDA build makes.
bool fake_gpu_present = false;
int fake_gpu_opens = 0;
const CudaBackendHooks kFakeCuda{
    [](std::string* why) {
      if (!fake_gpu_present && why != nullptr) *why = "no CUDA device present (stand-in)";
      return fake_gpu_present;
    },
    [](WeightSet ws, const BackendOptions& o) {
      ++fake_gpu_opens;
      return open_cpu_backend(std::move(ws), o);
    }};

TEST(Backend, DeviceChoiceWithACudaBackendPresent) {
  const std::string bin = stories_bin();
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  BackendOptions o;
  auto opens = [&](Device d, bool reference) {
    o.device = d;
    o.reference = reference;
    const int before = fake_gpu_opens;
    open_backend_with(bin, o, &kFakeCuda);
    return fake_gpu_opens - before;
  };
  fake_gpu_present = true;
  EXPECT_EQ(opens(Device::Auto, false), 1) << "auto: the GPU when it is there";
  EXPECT_EQ(opens(Device::Cuda, false), 1);
  EXPECT_EQ(opens(Device::Cpu, false), 0);
  EXPECT_EQ(opens(Device::Auto, true), 0) << "the scalar oracle runs on the CPU";
  o.device = Device::Cuda;
  o.reference = true;
  test::expect_error([&](const std::string& p) { open_backend_with(p, o, &kFakeCuda); }, "--device cuda",
                     "--reference");
  fake_gpu_present = false;
  EXPECT_EQ(opens(Device::Auto, false), 0) << "auto: the CPU without a GPU";
  o.device = Device::Cuda;
  o.reference = false;
  test::expect_error([&](const std::string& p) { open_backend_with(p, o, &kFakeCuda); }, "--device cuda",
                     "no CUDA device present (stand-in)");
  // Without CUDA hooks (a build without CUDA), --device cuda says so.
  test::expect_error([&](const std::string& p) { open_backend_with(p, o, nullptr); }, "--device cuda",
                     "built without CUDA");

  // A weight the GPU does not run keeps a model on the CPU (auto) or is refused by name (cuda); the predicate on a
  // weight set holding a QUIK weight without its activation parameters beside a uniform one, and with them.
  WeightSet ws;
  PackedWeight uniform, quik;
  uniform.format = FormatId::Uniform;
  quik.format = FormatId::Quik;
  quik.params = {{"wbits", 4}, {"outliers", 0}};
  ws.packed["model.layers.0.mlp.up_proj.weight"] = uniform;
  EXPECT_EQ(first_cpu_only_weight(ws), "");
  ws.packed["model.layers.0.mlp.down_proj.weight"] = quik;
  EXPECT_EQ(first_cpu_only_weight(ws), "model.layers.0.mlp.down_proj.weight");
  for (const int64_t fp8 : {0, 1}) {   // FP8 and integer activations both run on the GPU
    ws.packed["model.layers.0.mlp.down_proj.weight"].params = {{"wbits", 4}, {"abits", 8}, {"act_fp8", fp8}, {"outliers", 0}};
    EXPECT_EQ(first_cpu_only_weight(ws), "") << "act_fp8 " << fp8;
  }
}

// tensor_as_f32 (what the GPU model uploads, one tensor at a time) gives exactly the fp32 the CPU Model holds, for
// every tensor: llama2.c (fp32, q/k rows interleaved), Hugging Face safetensors (the tiny fixtures) and SmolLM2's
// GGUF (Q4_1 blocks, q/k interleaved); fp32 tensors needing no permutation come back in place (zero copy).
TEST(Backend, OneTensorConversionServesBothModels) {
  std::vector<std::string> paths = {test::fixture("tiny_qwen2"), test::fixture("tiny_llama3")};
  if (!stories_bin().empty()) paths.push_back(stories_bin());
  if (!test::smollm2_gguf().empty()) paths.push_back(test::smollm2_gguf());
  for (const std::string& path : paths) {
    auto m = Model::load(path);
    const WeightSet& ws = m->weights();
    std::vector<float> scratch;
    int in_place = 0;
    for (const std::string& name : m->tensor_names()) {
      const bool qk = name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos;
      const std::vector<int64_t>& shape = m->tensor_shape(name);
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      const float* got = tensor_as_f32(ws, name, shape, qk, scratch);
      ASSERT_EQ(std::memcmp(got, m->tensor_f32(name), static_cast<size_t>(n) * sizeof(float)), 0) << path << ": " << name;
      in_place += got != scratch.data();
    }
    std::printf("[ %s ] %zu tensors identical, %d used in place\n", path.c_str(), m->tensor_names().size(), in_place);
    if (path == stories_bin()) {
      EXPECT_GT(in_place, 0);
    }
    test::expect_error([&](const std::string&) { tensor_as_f32(ws, "model.embed_tokens.weight", {1, 2}, false, scratch); },
                       path, "expected [1, 2]");
    test::expect_error([&](const std::string&) { tensor_as_f32(ws, "model.nothing", {1}, false, scratch); }, path,
                       "missing tensor model.nothing");
  }
}

TEST(Rss, ReadsProcSelfStatusAndTracksTheAnonymousPeak) {
  const RssSnapshot s = read_rss();
  if (s.rss_bytes == 0) GTEST_SKIP() << "no /proc/self/status here (not Linux)";
  EXPECT_GT(s.anon_bytes, 0u);
  EXPECT_GE(s.peak_rss_bytes, s.rss_bytes);
  EXPECT_EQ(peak_rss_bytes() >= s.peak_rss_bytes, true);
  AnonRssPeak peak;
  {
    std::vector<char> block(64u << 20);
    std::memset(block.data(), 1, block.size());   // touched: resident
    peak.sample();
  }
  EXPECT_GE(peak.peak_bytes(), peak.start_bytes() + (48u << 20));
}

// tools/make_random_hf_model.py writes a sharded fp16 Hugging Face directory with a byte-level BPE tokenizer that
// lowbit reads: the tiny shape loads on the CPU, scores windows and generates text.
TEST(Backend, RandomHfModelScriptWritesALoadableModel) {
  std::string python;
  for (const char* p : {"python3", "/usr/bin/python3"})
    if (python.empty() && std::system((std::string(p) + " -c 'import numpy' > /dev/null 2>&1").c_str()) == 0) python = p;
  if (python.empty()) GTEST_SKIP() << "no python3 with numpy here (apt-get install python3-numpy)";
  const std::string dir = test::temp_dir() + "/random-tiny";
  const std::string cmd = python + " " + test::source_dir() + "/tools/make_random_hf_model.py --shape tiny --seed 3 " +
                          "--max-shard-bytes 300000 --out " + dir + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  int shards = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    shards += e.path().extension() == ".safetensors";
  EXPECT_GT(shards, 1);
  EXPECT_TRUE(test::file_exists(dir + "/model.safetensors.index.json"));
  auto backend = open_backend(dir, on_cpu());
  const ModelConfig& c = backend->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 2);
  ASSERT_TRUE(backend->has_tokenizer());
  EXPECT_EQ(backend->tokenizer().vocab_size(), c.vocab_size);
  const std::vector<int32_t> ids = backend->tokenizer().encode("Hello, random world! 123", true, false);
  EXPECT_EQ(backend->tokenizer().decode(ids), "Hello, random world! 123");
  PplOptions po;
  po.ctx = 32;
  std::vector<int32_t> toks;
  for (int i = 0; i < 96; ++i) toks.push_back(static_cast<int32_t>((i * 131 + 7) % c.vocab_size));
  const PplResult r = perplexity(*backend, make_windows_contiguous(toks, 32), po);
  EXPECT_TRUE(std::isfinite(r.ppl) && r.ppl > 1) << r.ppl;
  GenerateOptions go;
  go.max_new_tokens = 8;
  go.stop_at_eos = false;
  EXPECT_EQ(generate(*backend, ids, go).new_ids.size(), 8u);
}

}  // namespace
}  // namespace lowbit
