// The CLI end to end: misuse gives a one-line error and a non-zero exit; real runs print what they promise.
#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.h"

namespace lowbit {
namespace {

using test::run_cli;

std::string stories() { return test::shared_path("models/stories260K/stories260K.bin"); }

// Misuse must fail with a message, never crash (exit codes >= 128 are signals).
void expect_usage_error(const std::string& args, const std::string& phrase) {
  std::string out;
  const int rc = run_cli(args, &out);
  EXPECT_NE(rc, 0) << args << "\n" << out;
  EXPECT_LT(rc, 128) << "crashed: " << args << "\n" << out;
  EXPECT_NE(out.find(phrase), std::string::npos) << args << "\n" << out;
}

TEST(Cli, Misuse) {
  expect_usage_error("", "A subcommand is required");
  expect_usage_error("frobnicate", "subcommand");
  expect_usage_error("ppl", "model is required");
  expect_usage_error("ppl /nonexistent/model.gguf --text /dev/null", "/nonexistent/model.gguf: no such file");
  expect_usage_error("generate /nonexistent.gguf --prompt hi", "no such file");
  expect_usage_error("ppl x --text y --ctx 1", "--ctx");
  expect_usage_error("ppl x --text y --max-windows -3", "--max-windows");
  expect_usage_error("generate x --prompt hi --top-p 2", "--top-p");
  expect_usage_error("generate x --prompt hi --temperature -1", "--temperature");
  expect_usage_error("convert x y --dtype q4", "--dtype");
  expect_usage_error("inspect " + test::source_dir() + "/README.md", "not a model file");
  expect_usage_error("ppl x --text y --device tpu", "--device");
}

// --device cuda either runs on the GPU (and says so) or, without one, refuses in one line; never falls back
// silently. --device cpu always runs on the CPU.
TEST(Cli, DeviceOption) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(text, "tinystories sample");
  const std::string base = "ppl " + stories() + " --text " + text + " --doc-separator '<|endoftext|>' --ctx 512 --max-windows 2";
  std::string out;
  ASSERT_EQ(run_cli(base + " --device cpu", &out), 0) << out;
  EXPECT_NE(out.find("device: cpu"), std::string::npos) << out;
  const int rc = run_cli(base + " --device cuda", &out);
  if (rc == 0) {
    EXPECT_NE(out.find("device: cuda"), std::string::npos) << out;
  } else {
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("--device cuda: "), std::string::npos) << out;
  }
}

TEST(Cli, ErrorsOnRealModel) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  expect_usage_error("ppl " + stories() + " --text /nonexistent.txt", "/nonexistent.txt: no such text file");
  expect_usage_error("generate " + stories() + " --prompt hi --chat", "chat template");
  expect_usage_error("generate " + stories() + " --prompt hi --tokenizer /nonexistent.bin", "/nonexistent.bin");
  const std::string dir = test::temp_dir();
  test::write_file(dir + "/keep.txt", "x");
  expect_usage_error("convert " + stories() + " " + dir, "not empty");
  EXPECT_TRUE(test::file_exists(dir + "/keep.txt"));   // never lose the user's files
}

TEST(Cli, InspectStories) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  std::string out;
  ASSERT_EQ(run_cli("inspect " + stories(), &out), 0) << out;
  EXPECT_NE(out.find("format: llama2.c"), std::string::npos) << out;
  EXPECT_NE(out.find("dim 64, ffn 172, layers 5, heads 8, kv heads 4"), std::string::npos) << out;
  EXPECT_NE(out.find("model.layers.4.mlp.down_proj.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("tokenizer: SentencePiece BPE, 512 tokens"), std::string::npos) << out;
}

TEST(Cli, PplAndGenerateStories) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(text, "tinystories sample");
  std::string out;
  // --device cpu: the exact fp32 path the reference figures belong to (the GPU runs fp16 weights).
  ASSERT_EQ(run_cli("ppl " + stories() + " --text " + text + " --doc-separator '<|endoftext|>' --ctx 512 --device cpu", &out), 0) << out;
  EXPECT_NE(out.find("predicted tokens: 2586"), std::string::npos) << out;
  EXPECT_NE(out.find("perplexity: 3.13"), std::string::npos) << out;
  ASSERT_EQ(run_cli("generate " + stories() + " --prompt 'Once upon a time' -n 12 --temperature 0.8 --top-k 40 "
                    "--top-p 0.9 --seed 7 --no-stats --device cpu", &out), 0) << out;
  std::string again;
  ASSERT_EQ(run_cli("generate " + stories() + " --prompt 'Once upon a time' -n 12 --temperature 0.8 --top-k 40 "
                    "--top-p 0.9 --seed 7 --no-stats --device cpu", &again), 0);
  EXPECT_EQ(out, again) << "same seed must give the same text";
  EXPECT_GT(out.size(), std::string("Once upon a time").size() + 10) << out;
}

// convert llama2.c -> HF directory; the converted model gives identical logits (ppl to the last digit).
TEST(Cli, ConvertRoundTrip) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(text, "tinystories sample");
  const std::string dir = test::temp_dir() + "/hf";
  std::string out;
  ASSERT_EQ(run_cli("convert " + stories() + " " + dir, &out), 0) << out;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(test::file_exists(dir + "/" + f)) << f;
  std::string a, b;
  const std::string args = " --text " + text + " --doc-separator '<|endoftext|>' --ctx 512 --device cpu";
  ASSERT_EQ(run_cli("ppl " + stories() + args, &a), 0) << a;
  ASSERT_EQ(run_cli("ppl " + dir + args, &b), 0) << b;
  auto ppl_line = [](const std::string& s) { return s.substr(s.find("mean NLL"), s.find("speed") - s.find("mean NLL")); };
  EXPECT_EQ(ppl_line(a), ppl_line(b));
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

TEST(Cli, QuantizeInspectAndMisuse) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const std::string dir = test::temp_dir();
  std::string out;
  ASSERT_EQ(run_cli("quantize " + stories() + " --method rtn --bits 4 --group 32 -o " + dir + "/s.lowbit", &out), 0)
      << out;
  EXPECT_NE(out.find("average bits per quantized weight"), std::string::npos) << out;
  ASSERT_EQ(run_cli("inspect " + dir + "/s.lowbit", &out), 0) << out;
  EXPECT_NE(out.find("format: lowbit"), std::string::npos) << out;
  EXPECT_NE(out.find("method: {\"name\":\"rtn\",\"bits\":4,\"group_size\":32"), std::string::npos) << out;
  EXPECT_NE(out.find("model.layers.4.mlp.down_proj.weight              uniform"), std::string::npos) << out;
  EXPECT_NE(out.find("(35 packed)"), std::string::npos) << out;
  ASSERT_EQ(run_cli("generate " + dir + "/s.lowbit --prompt 'Once upon a time' -n 8 --no-stats", &out), 0) << out;
  expect_usage_error("quantize " + stories() + " --bits 9 -o " + dir + "/x.lowbit", "--bits");
  expect_usage_error("quantize " + stories() + " --method awq -o " + dir + "/x.lowbit", "--method");
  expect_usage_error("quantize " + stories() + " -o /nonexistent-dir/x.lowbit", "the directory does not exist");
  expect_usage_error("quantize " + dir + "/s.lowbit --method rtn -o " + dir + "/y.lowbit", "already quantized");
  expect_usage_error("convert " + dir + "/s.lowbit " + dir + "/hf", "quantized weights");
  expect_usage_error("quantize " + stories() + " --calib ../shared/data/wikitext-2-raw/wiki.test.raw -o " + dir +
                         "/z.lowbit",
                     "evaluation text");
  EXPECT_FALSE(test::file_exists(dir + "/x.lowbit"));
  EXPECT_FALSE(test::file_exists(dir + "/z.lowbit"));
}

}  // namespace
}  // namespace lowbit

namespace lowbit {
namespace {

// Misuse answered in one short line ("lowbit: error: ..."), never CLI11's hundreds-of-digit float bounds.
void expect_one_line_error(const std::string& args, const std::string& phrase) {
  std::string out;
  const int rc = run_cli(args, &out);
  EXPECT_NE(rc, 0) << args << "\n" << out;
  EXPECT_LT(rc, 128) << "crashed: " << args << "\n" << out;
  EXPECT_NE(out.find(phrase), std::string::npos) << args << "\n" << out;
  EXPECT_EQ(out.rfind("lowbit: error: ", 0), 0u) << args << "\n" << out;
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "more than one line: " << args << "\n" << out;
  EXPECT_LT(out.size(), 240u) << args << "\n" << out;
}

TEST(Cli, RangeErrorsStateTheBoundPlainly) {
  expect_one_line_error("generate x --prompt hi --temperature -1", "--temperature must be >= 0 (0 = greedy), got -1");
  expect_one_line_error("generate x --prompt hi --top-k -2", "--top-k must be >= 0 (0 = off), got -2");
  expect_one_line_error("generate x --prompt hi --top-p 0", "--top-p must be in (0, 1] (1 = off), got 0");
  expect_one_line_error("generate x --prompt hi --top-p 1.5", "--top-p must be in (0, 1] (1 = off), got 1.5");
  expect_one_line_error("generate x --prompt hi --repetition-penalty 0", "--repetition-penalty must be > 0 (1 = off), got 0");
  expect_one_line_error("generate x --prompt hi -n -1", "--max-tokens must be >= 0, got -1");
  expect_one_line_error("generate x --prompt hi --seed -1", "--seed: must be an integer >= 0, got -1");
  expect_one_line_error("generate x --prompt hi --system be-brief", "--system needs --chat");
  expect_one_line_error("generate x --prompt hi --top-k 40", "--top-k applies to sampling (--temperature > 0)");
  expect_one_line_error("generate x --prompt hi --seed 3", "--seed applies to sampling (--temperature > 0)");
  expect_one_line_error("ppl x --text y --max-windows -3", "--max-windows: must be >= 0 (0 = all), got -3");
  expect_one_line_error("ppl x --text y --ctx 1", "--ctx: must be >= 2, got 1");
  expect_one_line_error("ppl x --text y --text-mode wikitext --doc-separator X", "--doc-separator applies to --text-mode docs only");
  expect_one_line_error("-t -1 inspect x", "--threads: must be >= 0 (0 = all cores), got -1");
  expect_one_line_error("quantize x -o y.lowbit --group -1", "--group: must be >= 0 (0 = per channel), got -1");
  expect_one_line_error("quantize x -o y.lowbit --percdamp 0", "--percdamp: must be in [1e-06, 10], got 0");
  expect_one_line_error("quantize x -o y.lowbit --method anyprec --kmeans-iters -1", "--kmeans-iters: must be >= 0, got -1");
  expect_one_line_error("bench x --decode 2", "--decode: must be in [3, 65536], got 2");
  expect_one_line_error("bench --shapes 64x64", "--shapes applies to --kernels only");
  expect_one_line_error("bench --kernels --model-shapes llama2-7b", "--model-shapes applies to --e2e and --serve only");
  expect_one_line_error("bench --e2e --concurrency 8", "--concurrency applies to --serve only");
  expect_one_line_error("bench --serve --decode-batches 8", "--decode-batches applies to --e2e only");
  expect_one_line_error("bench --serve --concurrency 0", "--concurrency");
  expect_one_line_error("serve x --max-batch 0", "--max-batch");
  expect_one_line_error("serve x --kv-cache-gb -1", "--kv-cache-gb");
}

// An option that does not apply to the chosen quantization method is refused, naming what does apply; no file.
TEST(Cli, QuantizeRefusesOptionsOfOtherMethods) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const std::string dir = test::temp_dir();
  const std::string q = "quantize " + stories() + " -o " + dir + "/x.lowbit ";
  test::expect_cli_refuses({
      {q + "--method anyprec --bits 3", "--bits does not apply to --method anyprec (it applies to rtn, gptq); "
                                        "anyprec's widths are set by --seed-bits, --parent-bits and --widths"},
      {q + "--method anyprec --group 64", "--group does not apply to --method anyprec"},
      {q + "--seed-bits 3", "--seed-bits does not apply to --method gptq (the default) (it applies to anyprec)"},
      {q + "--method rtn --calib-samples 8", "--calib-samples does not apply to --method rtn"},
      {q + "--method rtn --act-order", "--act-order does not apply to --method rtn (it applies to gptq)"},
      {q + "--method gptq --ratio-4bit 0.5", "--ratio-4bit does not apply to --method gptq (it applies to mixed24)"},
      {q + "--method mixed24 --bits 3", "mixed24 mixes 2 and 4 bits: --ratio-4bit sets the mix"},
      {q + "--method mixed24 --wbits 4", "--wbits does not apply to --method mixed24 (it applies to quik)"},
      {q + "--method quik --bits 4", "quik's weight bits are --wbits"},
      {q + "--method quik --sensitivity hessian-diag", "--sensitivity does not apply to --method quik"},
      {q + "--method anyprec --no-sequential", "--no-sequential does not apply to --method anyprec"},
      {q + "--method mixed24 --layout generic --unit-order column", "--unit-order orders the aligned layout's units"},
      {q + "--method quik --outliers 64 --outlier-frac 0.1", "--outlier-frac and --outliers both set"},
      {q + "--method quik --outliers 1.5", "quik: --outliers is a column count, got 1.5"},
      {"quantize " + test::fixture("tiny_llama3") + " --method rtn --tokenizer " + stories() + " -o " + dir + "/x.lowbit",
       "--tokenizer applies to llama2.c checkpoints only"},
  }, dir + "/x.lowbit");
  expect_usage_error("inspect " + test::fixture("tiny_llama3") + " --tokenizer " + stories(),
                     "--tokenizer applies to llama2.c checkpoints only");
}

// Synthetic random: sources quantize like a model file (timing at real shapes); misuse is refused in one line.
TEST(Cli, QuantizeRandomSourcesAndDevice) {
  const std::string dir = test::temp_dir();
  std::string out;
  ASSERT_EQ(test::run_cli("quantize random:tiny?layers=1 --method gptq --calib-samples 2 --calib-seqlen 32 "
                          "--device cpu -o " + dir + "/t.lowbit", &out), 0) << out;
  EXPECT_NE(out.find("device: cpu"), std::string::npos) << out;
  EXPECT_TRUE(test::file_exists(dir + "/t.lowbit"));
  test::expect_cli_refuses({
      {"quantize random:nope --method rtn -o " + dir + "/x.lowbit", "presets: tiny, smollm2-135m, llama2-7b"},
      {"quantize random:tiny --method rtn --device cpu --resume -o " + dir + "/x.lowbit",
       "--resume continues a GPU run's checkpoint"},
      {"quantize random:tiny --method rtn --tokenizer " + dir + "/t.lowbit -o " + dir + "/x.lowbit",
       "has no tokenizer"},
      {"convert random:tiny " + dir + "/conv", "there is no model to convert"},
  }, dir + "/x.lowbit");
}

// A .jsonl text is counted in documents, not as the one text they are joined into.
TEST(Cli, PplCountsJsonlDocuments) {
  LOWBIT_REQUIRE_FILE(stories(), "stories260K");
  const std::string c4 = test::shared_path("data/c4/c4-validation.calib-docs-0-511.jsonl");
  LOWBIT_REQUIRE_FILE(c4, "C4 sample");
  std::string out;
  ASSERT_EQ(run_cli("ppl " + stories() + " --text " + c4 + " --ctx 256 --max-windows 1 --device cpu", &out), 0) << out;
  EXPECT_NE(out.find("512 jsonl documents joined with"), std::string::npos) << out;
  EXPECT_NE(out.find("windows: 1 of "), std::string::npos) << out;
  EXPECT_NE(out.find("(SUBSET: --max-windows)"), std::string::npos) << out;
  expect_usage_error("ppl " + stories() + " --text " + c4 + " --text-mode wikitext --jsonl-field body --max-windows 1",
                     "--jsonl-field applies to .jsonl text only");
}

}  // namespace
}  // namespace lowbit
