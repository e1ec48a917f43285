// The public API (include/lowbit/) on real models: the same numbers as the library's own paths (perplexity and
// generation to the last bit on the CPU), any-precision files quantized and served through it, and every bad input
// a one-line lowbit::Error that names the option or file.
// (The umbrella lowbit/lowbit.h is not included here: test_util.h brings the library's declaration of lowbit::Error,
// and the two are one type that must not be defined twice in one file.)
#include <gtest/gtest.h>

#include <atomic>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

#include "lowbit/convert.h"
#include "lowbit/inspect.h"
#include "lowbit/model.h"
#include "lowbit/quantize.h"
#include "lowbit/system.h"
#include "model/model.h"
#include "quantize/calibration.h"
#include "runtime/eval_text.h"
#include "runtime/generate.h"
#include "runtime/perplexity.h"
#include "api_test_util.h"
#include "test_util.h"

namespace lowbit {
namespace {

using test::expect_api_error;
using test::open_cpu;

std::string stories() { return test::shared_path("models/stories260K/stories260K.bin"); }


TEST(Api, OpenDescribesTheModel) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  const api::ModelInfo& i = m.info();
  EXPECT_EQ(i.format, api::ModelFormat::Llama2c);
  EXPECT_STREQ(api::format_name(i.format), "llama2.c");
  EXPECT_EQ(i.path, stories());
  EXPECT_EQ(i.dim, 64);
  EXPECT_EQ(i.hidden_dim, 172);
  EXPECT_EQ(i.n_layers, 5);
  EXPECT_EQ(i.n_heads, 8);
  EXPECT_EQ(i.n_kv_heads, 4);
  EXPECT_EQ(i.vocab_size, 512);
  EXPECT_EQ(i.quantization, "");
  EXPECT_EQ(m.device(), api::Device::Cpu);
  EXPECT_EQ(m.device_name(), "cpu");
  EXPECT_TRUE(m.widths().empty());
  EXPECT_TRUE(m.has_tokenizer());
  EXPECT_FALSE(m.has_chat_template());
  EXPECT_EQ(m.file_bytes(), std::filesystem::file_size(stories()));
  const auto internal = Model::load(stories());
  EXPECT_EQ(m.weight_bytes_per_token(), internal->weight_bytes_per_token());
}

TEST(Api, TokenizeMatchesTheLibrary) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  const auto internal = Model::load(stories());
  const std::string s = "Once upon a time, Lily saw a big dog.";
  EXPECT_EQ(m.tokenize(s, true), internal->tokenizer().encode(s, true, false));
  EXPECT_EQ(m.tokenize(s, false), internal->tokenizer().encode(s, false, false));
  EXPECT_EQ(m.detokenize(m.tokenize(s, true)), s);
  expect_api_error([&] { m.detokenize({1, 512}); }, "token id 512 is outside the vocabulary of 512");
}

// Same windows, same numbers as perplexity(Model, ...): the stories260K reference figures.
TEST(Api, PerplexityEqualsTheLibrary) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  LOWBIT_REQUIRE_FILE(test::tinystories_sample(), "TinyStories sample");
  api::Model m = open_cpu(stories());
  api::PplParams p;
  p.ctx = 512;
  p.doc_separator = "<|endoftext|>";
  const api::EvalWindows w = m.eval_windows_from_file(test::tinystories_sample(), p);
  EXPECT_EQ(w.mode, api::TextMode::Documents);
  EXPECT_EQ(w.documents, 8);
  EXPECT_EQ(w.ctx, 512);
  EXPECT_GT(w.truncated_tokens, 0);
  int calls = 0;
  const api::PplResult r = m.perplexity(w, p, [&](int done, int total, int64_t, double) {
    ++calls;
    EXPECT_EQ(done, calls);
    EXPECT_EQ(total, 8);
  });
  EXPECT_EQ(calls, 8);
  EXPECT_EQ(r.predicted_tokens, 2586);
  EXPECT_NEAR(r.perplexity, 3.1378, 1e-3);

  const auto internal = Model::load(stories());
  const auto windows = make_windows_documents(test::tinystories_docs(*internal), 512, nullptr);
  EXPECT_EQ(w.windows, windows);
  PplOptions po;
  po.ctx = 512;
  const PplResult ref = perplexity(*internal, windows, po);
  EXPECT_EQ(r.mean_nll, ref.mean_nll);   // bit for bit: the same forward, the same reductions
  EXPECT_EQ(r.top1, ref.top1);
  EXPECT_EQ(r.windows, 8);
  EXPECT_EQ(r.windows_total, 8);

  p.max_windows = 3;   // a subset
  const api::PplResult sub = m.perplexity_file(test::tinystories_sample(), p);
  EXPECT_EQ(sub.windows, 3);
  EXPECT_EQ(sub.windows_total, 8);
}

TEST(Api, GenerateEqualsTheLibraryAndStreams) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  const auto internal = Model::load(stories());
  for (const float temperature : {0.0f, 0.8f}) {
    api::GenerateParams g;
    g.max_tokens = 24;
    g.temperature = temperature;
    g.top_k = 40;
    g.top_p = 0.9f;
    g.seed = 7;
    std::string streamed;
    int pieces = 0;
    const api::GenerateResult r = m.generate("Once upon a time", g, [&](std::string_view piece) {
      streamed += piece;
      ++pieces;
    });
    EXPECT_EQ(streamed, r.text);
    EXPECT_EQ(pieces, static_cast<int>(r.new_ids.size()));
    EXPECT_EQ(r.prompt_ids, m.tokenize("Once upon a time", true));
    GenerateOptions o;
    o.max_new_tokens = 24;
    o.sampling.temperature = temperature;
    o.sampling.top_k = 40;
    o.sampling.top_p = 0.9f;
    o.sampling.seed = 7;
    const GenerateResult ref = generate(*internal, r.prompt_ids, o);
    EXPECT_EQ(r.new_ids, ref.new_ids) << "temperature " << temperature;
    EXPECT_EQ(r.text, ref.text);
    EXPECT_EQ(api::stop_reason_name(r.stop_reason), ref.stop_reason);
    // The tokenized-prompt overload gives the same.
    EXPECT_EQ(m.generate(r.prompt_ids, g).new_ids, r.new_ids);
  }
  api::GenerateParams g;
  g.max_tokens = 0;
  EXPECT_TRUE(m.generate("Once", g).new_ids.empty());
  api::SpeedParams sp;
  sp.prefill = 16;
  sp.decode = 4;
  sp.reps = 1;
  const api::SpeedResult s = m.measure_speed(sp);
  EXPECT_EQ(s.prefill_tokens, 16);
  EXPECT_GT(s.prefill_tokens_per_s(), 0);
  EXPECT_GT(s.decode_tokens_per_s(), 0);
}

// Stop strings end the text just before their first occurrence, found across token boundaries, and the stream never
// shows a byte of one; a cancel flag set from the callback ends the generation before the next token.
TEST(Api, StopStringsAndCancellation) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  api::GenerateParams g;
  g.max_tokens = 48;
  g.stop_at_eos = false;
  std::vector<std::string> pieces;
  const api::GenerateResult full =
      m.generate("Once upon a time", g, [&](std::string_view piece) { pieces.emplace_back(piece); });
  ASSERT_GE(pieces.size(), 40u);
  // A stop string that spans two tokens' bytes: the last byte of piece 20 and the first of piece 21.
  std::string before;
  for (int i = 0; i < 20; ++i) before += pieces[static_cast<size_t>(i)];
  const std::string next_piece = pieces[20];
  ASSERT_FALSE(before.empty());
  ASSERT_FALSE(next_piece.empty());
  const std::string stop = before.substr(before.size() - 1) + next_piece.substr(0, 1);
  const size_t first = full.text.find(stop);
  ASSERT_NE(first, std::string::npos);
  api::GenerateParams gs = g;
  gs.stop = {"no such text in a story \x01", stop};
  std::string streamed;
  const api::GenerateResult r = m.generate("Once upon a time", gs, [&](std::string_view piece) { streamed += piece; });
  EXPECT_EQ(r.stop_reason, api::StopReason::Stop);
  EXPECT_EQ(r.text, full.text.substr(0, first));
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(std::string(api::stop_reason_name(r.stop_reason)), "stop");
  // A stop string that never appears changes nothing, and the held-back bytes reach the stream at the end.
  gs.stop = {"no such text in a story \x01"};
  streamed.clear();
  const api::GenerateResult none = m.generate("Once upon a time", gs, [&](std::string_view piece) { streamed += piece; });
  EXPECT_EQ(none.text, full.text);
  EXPECT_EQ(streamed, full.text);
  EXPECT_EQ(none.stop_reason, api::StopReason::Length);
  // Cancellation after the 5th token.
  std::atomic<bool> cancel{false};
  api::GenerateParams gc = g;
  gc.cancel = &cancel;
  int seen = 0;
  const api::GenerateResult c = m.generate("Once upon a time", gc, [&](std::string_view) {
    if (++seen == 5) cancel = true;
  });
  EXPECT_EQ(c.stop_reason, api::StopReason::Cancelled);
  EXPECT_EQ(c.new_ids.size(), 5u);
  // An empty stop string is refused with a one-line message.
  gs.stop = {""};
  test::expect_error([&](const std::string&) { m.generate("Once", gs); }, "--stop", "must not be empty");
}

// Device::Auto takes the GPU when there is one: the same API, perplexity within the GPU-vs-CPU budget of
// test_cuda_model (fp16 weights and KV cache on the GPU), generation and timing through the GPU's decode path.
TEST(Api, AutoRunsOnTheGpuWhenPresent) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  LOWBIT_REQUIRE_FILE(test::tinystories_sample(), "TinyStories sample");
  std::string why;
  if (!api::cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  api::Model gpu = api::Model::open(stories());
  EXPECT_EQ(gpu.device(), api::Device::Cuda);
  EXPECT_NE(api::cuda_device_name(), "");
  EXPECT_EQ(gpu.device_name(), "cuda: " + api::cuda_device_name());
  api::Model cpu = open_cpu(stories());
  api::PplParams p;
  p.ctx = 512;
  p.doc_separator = "<|endoftext|>";
  const api::EvalWindows w = cpu.eval_windows_from_file(test::tinystories_sample(), p);
  const double g = gpu.perplexity(w, p).perplexity, c = cpu.perplexity(w, p).perplexity;
  std::printf("[ stories260K through the API ] ppl cpu %.4f gpu %.4f\n", c, g);
  EXPECT_NEAR(g / c, 1.0, 5e-3);
  api::GenerateParams gp;
  gp.max_tokens = 16;
  const api::GenerateResult r = gpu.generate("Once upon a time", gp);
  EXPECT_EQ(r.new_ids.size(), 16u);
  api::SpeedParams sp;
  sp.prefill = 64;
  sp.decode = 16;
  const api::SpeedResult s = gpu.measure_speed(sp);
  EXPECT_GT(s.decode_tokens_per_s(), 0);
  std::printf("[ stories260K through the API ] gpu prefill %.0f tok/s, decode %.0f tok/s\n", s.prefill_tokens_per_s(),
              s.decode_tokens_per_s());
}

// Bad input: one line naming the option or the file; nothing crashes.
TEST(Api, ErrorsAreOneLineAndNameTheProblem) {
  expect_api_error([] { api::Model::open("/nonexistent/model.gguf"); }, "/nonexistent/model.gguf: no such file");
  expect_api_error([] { api::set_cpu_threads(0); }, "--threads must be >= 1, got 0");
  api::GenerateParams g;
  g.temperature = -1;
  expect_api_error([&] { api::validate(g); }, "--temperature must be >= 0 (0 = greedy), got -1");
  g = {};
  g.top_p = 0;
  expect_api_error([&] { api::validate(g); }, "--top-p must be in (0, 1]");
  g = {};
  g.top_k = -1;
  expect_api_error([&] { api::validate(g); }, "--top-k must be >= 0");
  g = {};
  g.repetition_penalty = 0;
  expect_api_error([&] { api::validate(g); }, "--repetition-penalty must be > 0");
  g = {};
  g.max_tokens = -1;
  expect_api_error([&] { api::validate(g); }, "--max-tokens must be >= 0, got -1");
  api::PplParams p;
  p.ctx = 1;
  expect_api_error([&] { api::validate(p); }, "--ctx must be >= 2, got 1");
  p = {};
  p.mode = api::TextMode::Documents;
  expect_api_error([&] { api::validate(p); }, "--doc-separator");
  api::QuantizeOptions q;
  q.uniform.bits = 9;
  expect_api_error([&] { api::validate(q); }, "--bits must be in 2..8");
  q = {};
  q.method = api::QuantMethod::AnyPrec;
  q.anyprec.seed_bits = 4;
  q.anyprec.parent_bits = 3;
  expect_api_error([&] { api::validate(q); }, "--parent-bits must be in 4..8");
  q.anyprec.parent_bits = 8;
  q.anyprec.widths = {3, 8};
  expect_api_error([&] { api::validate(q); }, "--widths: 3 is outside seed..parent = 4..8");

  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  expect_api_error([&] { m.check_bits(4); }, "needs an any-precision model");
  g = {};
  g.bits = 3;
  expect_api_error([&] { m.generate("hi", g); }, "needs an any-precision model");
  g = {};
  g.chat = true;
  expect_api_error([&] { m.generate("hi", g); }, "chat template");
  g = {};
  g.system = "be brief";
  expect_api_error([&] { m.generate("hi", g); }, "--system needs --chat");
  expect_api_error([&] { m.generate(std::vector<int32_t>{1, 999}, api::GenerateParams{}); },
                   "token id 999 is outside the vocabulary");
  p = {};
  p.ctx = 64;
  expect_api_error([&] { m.perplexity_file("/nonexistent.txt", p); }, "/nonexistent.txt: no such text file");
  expect_api_error([&] { m.perplexity(std::vector<std::vector<int32_t>>{{1}}, p); }, "window 0 has 1 tokens");
  p.ctx = 100000;   // longer than the text: no window
  expect_api_error([&] { m.perplexity(m.eval_windows_from_text("Once upon a time", p), p); }, "no windows to score");
  api::OpenOptions oo;
  oo.tokenizer_path = stories();
  expect_api_error([&] { api::Model::open(test::fixture("tiny_llama3"), oo); },
                   "--tokenizer applies to llama2.c checkpoints only");
  oo = {};
  oo.quik_abits = "4";
  expect_api_error([&] { api::Model::open(stories(), oo); }, "abits");
  if (!api::cuda_available()) {
    oo = {};
    oo.device = api::Device::Cuda;
    expect_api_error([&] { api::Model::open(stories(), oo); }, "cuda");
  }
  const std::string dir = test::temp_dir();
  q = {};
  q.method = api::QuantMethod::Rtn;
  expect_api_error([&] { api::quantize(stories(), "/nonexistent-dir/x.lowbit", q); }, "the directory does not exist");
  expect_api_error([&] { api::quantize(stories(), dir, q); }, "is a directory");
  expect_api_error([&] { api::convert_to_hf("/nonexistent.gguf", dir + "/hf"); }, "/nonexistent.gguf");
  expect_api_error([&] { api::inspect(test::source_dir() + "/README.md"); }, "not a model file");
}

// Jsonl text counts its documents (the C4 sample holds 512 JSON lines, joined into one text).
TEST(Api, JsonlDocumentsAreCounted) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  api::Model m = open_cpu(stories());
  api::PplParams p;
  p.ctx = 16;
  p.mode = api::TextMode::Jsonl;
  const api::EvalWindows w = m.eval_windows_from_text("{\"text\": \"one day\"}\n{\"text\": \"\"}\n{\"text\": \"a cat sat on the mat\"}\n", p);
  EXPECT_EQ(w.documents, 3);
  EXPECT_NE(w.description.find("3 jsonl documents"), std::string::npos) << w.description;
  const std::string c4 = test::shared_path("data/c4/c4-validation.calib-docs-0-511.jsonl");
  LOWBIT_REQUIRE_FILE(c4, "C4 sample");
  p.mode = api::TextMode::Auto;
  p.ctx = 512;
  p.max_windows = 1;
  const api::EvalWindows c = m.eval_windows_from_file(c4, p);
  EXPECT_EQ(c.mode, api::TextMode::Jsonl);
  EXPECT_EQ(c.documents, 512);
  EXPECT_NE(c.description.find("512 jsonl documents"), std::string::npos) << c.description;
}

// One any-precision file made through the API serves each of its widths through one open Model, with the numbers
// the library's own loader gives.
TEST(Api, QuantizeAnyPrecAndServeEveryWidth) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  LOWBIT_REQUIRE_FILE(test::tinystories_sample(), "TinyStories sample");
  const std::string dir = test::temp_dir();
  const std::string out = dir + "/stories.anyprec-3to8.lowbit";
  api::set_cpu_threads(1);
  api::QuantizeOptions q;
  q.method = api::QuantMethod::AnyPrec;
  q.anyprec.widths = {3, 4, 8};
  q.calib.samples = 4;
  q.calib.seqlen = 128;
  EXPECT_EQ(api::describe(q), "anyprec, seed 3 bits upscaled to 8, widths 3,4,8, fisher sensitivity, calibration 4 x 128");
  std::vector<api::QuantizeProgress> seen;
  const api::QuantizeReport r = api::quantize(stories(), out, q, [&](const api::QuantizeProgress& p) { seen.push_back(p); });
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front().stage, api::QuantizeProgress::Stage::Sensitivity);
  EXPECT_EQ(seen.back().stage, api::QuantizeProgress::Stage::Blocks);
  EXPECT_EQ(seen.back().done, 5);
  EXPECT_EQ(seen.back().total, 5);
  EXPECT_EQ(r.blocks, 5);
  EXPECT_EQ(r.calib_windows, 4);
  EXPECT_EQ(r.file_bytes, std::filesystem::file_size(out));
  ASSERT_EQ(r.width_bits.size(), 3u);
  EXPECT_LT(r.width_bits.at(3), r.width_bits.at(4));
  EXPECT_LT(r.width_bits.at(4), r.width_bits.at(8));

  api::Model m = open_cpu(out);
  EXPECT_EQ(m.widths(), (std::vector<int>{3, 4, 8}));
  EXPECT_EQ(m.info().format, api::ModelFormat::Lowbit);
  EXPECT_NE(m.info().quantization.find("\"name\":\"anyprec\""), std::string::npos) << m.info().quantization;
  EXPECT_LT(m.weight_bytes_per_token(3), m.weight_bytes_per_token(8));
  expect_api_error([&] { m.check_bits(5); }, "not a width this model serves (3,4,8)");
  api::PplParams p;
  p.ctx = 512;
  p.doc_separator = "<|endoftext|>";
  const api::EvalWindows w = m.eval_windows_from_file(test::tinystories_sample(), p);
  const auto internal = Model::load(out);
  PplOptions po;
  po.ctx = 512;
  std::map<int, double> ppl;
  for (int b : {8, 3, 4}) {
    p.bits = b;
    ppl[b] = m.perplexity(w, p).perplexity;
    po.bits = b;
    EXPECT_EQ(ppl[b], perplexity(*internal, w.windows, po).ppl) << "width " << b;
  }
  EXPECT_GT(ppl[3], ppl[8]);
  api::GenerateParams g;
  g.bits = 3;
  g.max_tokens = 8;
  EXPECT_EQ(m.generate("Once upon a time", g).new_ids.size(), 8u);

  const api::FileInfo f = api::inspect(out);
  EXPECT_EQ(f.packed.size(), 35u);
  ASSERT_EQ(f.widths.size(), 3u);
  EXPECT_EQ(f.widths[0].bits, 3);
  EXPECT_NEAR(f.widths[0].bits_per_weight, r.width_bits.at(3), 1e-9);
  EXPECT_LT(f.parent_bytes, f.separate_models_bytes);
  expect_api_error([&] { api::quantize(out, dir + "/again.lowbit", q); }, "already quantized");
}

TEST(Api, InspectAndConvert) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const api::FileInfo f = api::inspect(stories());
  EXPECT_EQ(f.model.n_layers, 5);
  EXPECT_TRUE(f.tokenizer.present);
  EXPECT_EQ(f.tokenizer.kind, "SentencePiece BPE");
  EXPECT_EQ(f.tokenizer.tokens, 512);
  EXPECT_TRUE(f.packed.empty());
  EXPECT_TRUE(f.widths.empty());
  EXPECT_EQ(api::shape_string({576, 1536}), "[576, 1536]");
  bool found = false;
  for (const api::TensorInfo& t : f.tensors) found = found || t.name == "model.layers.4.mlp.down_proj.weight";
  EXPECT_TRUE(found);

  const std::string dir = test::temp_dir() + "/hf";
  const api::ConvertResult c = api::convert_to_hf(stories(), dir);
  EXPECT_TRUE(c.tokenizer);
  EXPECT_GT(c.tensors, 0);
  api::Model a = open_cpu(stories());
  api::Model b = open_cpu(dir);
  EXPECT_EQ(b.info().format, api::ModelFormat::HuggingFace);
  api::PplParams p;
  p.ctx = 16;
  const std::string text = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  EXPECT_EQ(a.perplexity(a.eval_windows_from_text(text, p), p).mean_nll,
            b.perplexity(b.eval_windows_from_text(text, p), p).mean_nll);
  expect_api_error([&] { api::convert_to_hf(stories(), dir); }, "directory is not empty");
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// The public headers name nothing but each other and the standard library; the CLI (tools/lowbit) includes nothing
// but the public API, CLI11, the benchmarks' own headers (bench/, plus cblas.h for the CPU sgemm ceiling) and the
// server's (serve/); the server (src/serve) is a front end of the public API too: it includes nothing of the engine.
TEST(Api, HeadersAndCliIncludeOnlyWhatIsPublic) {
  namespace fs = std::filesystem;
  const std::regex include(R"re(#include\s*([<"])([^>"]+)[>"])re");
  auto check_dir = [&](const std::string& dir, auto allowed) {
    int files = 0;
    for (const auto& e : fs::directory_iterator(test::source_dir() + "/" + dir)) {
      const std::string text = test::read_file(e.path().string());
      ++files;
      for (auto it = std::sregex_iterator(text.begin(), text.end(), include); it != std::sregex_iterator(); ++it)
        EXPECT_TRUE(allowed((*it)[1].str() == "<", (*it)[2].str()))
            << dir << "/" << e.path().filename().string() << " includes " << (*it)[0].str();
    }
    EXPECT_GT(files, 0) << dir;
  };
  // Standard headers have no '/' and no extension (<cstdint>, <string_view>); public ones are "lowbit/...".
  check_dir("include/lowbit", [](bool angle, const std::string& h) {
    return angle ? h.find('/') == std::string::npos && h.find('.') == std::string::npos : h.rfind("lowbit/", 0) == 0;
  });
  check_dir("tools/lowbit", [](bool angle, const std::string& h) {
    if (!angle) return h == "commands.h" || h.rfind("lowbit/", 0) == 0 || h.rfind("bench/", 0) == 0 || h.rfind("serve/", 0) == 0;
    return h == "CLI/CLI.hpp" || h == "cblas.h" || h == "unistd.h" ||
           (h.find('/') == std::string::npos && h.find('.') == std::string::npos);
  });
  check_dir("src/serve", [](bool angle, const std::string& h) {
    if (!angle) return h.rfind("lowbit/", 0) == 0 || h.rfind("serve/", 0) == 0;
    return h == "httplib.h" || h == "nlohmann/json.hpp" || h == "pthread.h" || h == "signal.h" || h == "sys/socket.h" ||
           (h.find('/') == std::string::npos && h.find('.') == std::string::npos);
  });
}

}  // namespace
}  // namespace lowbit
