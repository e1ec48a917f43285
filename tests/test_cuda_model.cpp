// The GPU forward pass (backend_cuda/model/gpu_model.*) against the CPU forward on the same model files: every tiny
// architecture fixture (Llama-3 RoPE scaling, Qwen2 biases, Mistral sliding window), stories260K (fp32 and
// any-precision at every width), SmolLM2 (fp16 and 2/4/16 mixed24a); KV-cache decode against prefill, a batch of
// sequences against one at a time, CUDA-graph decode against plain launches. The GPU model is loaded from the file's
// WeightSet (one tensor at a time, the CPU model's WeightSet) and checked against the one uploaded from the loaded CPU
// model's fp32 tensors; the CUDA backend (runtime/backend.h) against the CPU backend, and what its load costs in host
// memory. Without a GPU every test skips and says why.
#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "test_util.h"

#ifdef LOWBIT_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "backend_cuda/model/cuda_backend.h"
#include "backend_cuda/ops/gpu_ops.h"
#include "core/knobs.h"
#include "core/rss.h"
#include "model/model.h"
#include "runtime/backend.h"
#include "runtime/batch.h"
#include "runtime/speculative.h"
#include "lowbit/quantize.h"
#include "runtime/generate.h"
#include "runtime/perplexity.h"
#include "quantize/calibration.h"
#include "quantize/quantize_model.h"

namespace lowbit {
namespace {

// GPU vs CPU logits, relative to the largest |logit| of the row block: the GPU rounds the activations entering each
// fp16 GEMM (and dense weights from fp32 files) to fp16 (2^-11 relative) and keeps the KV cache in fp16.
constexpr double kLogitBudget = 1.5e-2;
// GPU vs GPU where only the launch shape differs (decode steps vs prefill, batch vs single): fp32 rounding order.
constexpr double kSameDeviceBudget = 2e-3;

// A small Llama shape for random-weight GPU models (head dim 64: the decode attention's folded-RoPE form).
ModelConfig small_config(int layers, int max_seq_len) {
  ModelConfig c;
  c.dim = 256, c.hidden_dim = 704, c.n_layers = layers, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 64, c.vocab_size = 512;
  c.max_seq_len = max_seq_len;
  return c;
}
// Perplexity on the GPU vs the CPU, relative.
constexpr double kPplBudget = 5e-3;


// The model's stream is non-blocking: wait for it before reading what it wrote.
std::vector<float> download(const cuda::GpuModel& gpu, const float* d, size_t n) {
  gpu.synchronize();
  std::vector<float> h(n);
  LOWBIT_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// max |a - b| / max(1, max |b|), and the fraction of rows whose argmax agrees.
std::pair<double, double> compare_logits(const std::vector<float>& a, const std::vector<float>& b, int vocab) {
  double err = 0, mx = 1;
  int agree = 0;
  const int rows = static_cast<int>(b.size() / static_cast<size_t>(vocab));
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    mx = std::max(mx, std::fabs(static_cast<double>(b[i])));
  }
  for (int r = 0; r < rows; ++r) {
    const float* pa = a.data() + static_cast<size_t>(r) * vocab;
    const float* pb = b.data() + static_cast<size_t>(r) * vocab;
    agree += std::max_element(pa, pa + vocab) - pa == std::max_element(pb, pb + vocab) - pb;
  }
  return {err / mx, static_cast<double>(agree) / rows};
}

// All-position logits of `ids` on the CPU and the GPU; expects them within kLogitBudget (argmax agreement >= 95%).
void expect_forward_matches(const Model& cpu, cuda::GpuModel& gpu, const std::vector<int32_t>& ids, int bits,
                            const std::string& what) {
  const int n = static_cast<int>(ids.size()), V = cpu.config().vocab_size;
  std::vector<float> want(static_cast<size_t>(n) * V);
  KVCache cache = cpu.new_cache(n);
  cpu.forward(ids.data(), n, cache, want.data(), true, bits);
  cuda::GpuKVCache gc = gpu.new_cache(1, n);
  const auto got = download(gpu, gpu.forward(ids.data(), 1, n, gc, true, bits), want.size());
  const auto [err, agree] = compare_logits(got, want, V);
  EXPECT_LE(err, kLogitBudget) << what;
  EXPECT_GE(agree, 0.95) << what;
  std::printf("[ %s ] GPU vs CPU: max |dlogit| / max|logit| = %.2e, argmax agreement %.4f over %d positions\n",
              what.c_str(), err, agree, n);
}

// `base` quantized with o (calibration: `samples` documents of 128 tokens) into a fresh .lowbit file, loaded back.
std::unique_ptr<Model> quantized(Model& base, QuantizeOptions o, int samples) {
  o.calib.samples = samples;
  o.calib.seqlen = 128;
  const std::string path = test::temp_dir() + "/q.lowbit";
  quantize_to_file(base, o, path);
  return Model::load(path);
}

void expect_decode_matches(const Model& cpu, cuda::GpuModel& gpu, const std::vector<int32_t>& ids, int prompt, int end,
                           int bits, const std::string& what);

std::vector<int32_t> some_ids(const Model& m, int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % m.config().vocab_size));
  return ids;
}

// A CUDA backend over a GPU model the test holds, with the CPU model's tokenizer (perplexity() and generate() take a
// Backend).
cuda::CudaBackend backend_over(cuda::GpuModel& gpu, const Model& cpu) {
  return cuda::CudaBackend(gpu, cpu.has_tokenizer() ? &cpu.tokenizer() : nullptr, cpu.weights().path,
                           cpu.weights().format);
}

// The GPU model loaded from the file (one tensor at a time through model/weight_convert.h) against the one uploaded
// from the loaded CPU model's fp32 tensors: the same fp16 weights, packed weights and fp16 copies, so the same bytes on
// the device, the same logits (expected bit for bit; held to the same-device budget) and the same greedy tokens over
// CUDA-graph decode steps.
void expect_file_load_equals_cpu_upload(const Model& cpu, cuda::GpuModel& from_file, int bits, const std::string& what) {
  cuda::GpuModel from_cpu(cpu);
  EXPECT_EQ(from_file.weight_bytes(), from_cpu.weight_bytes()) << what;
  EXPECT_EQ(from_file.dequantized_linears(), from_cpu.dequantized_linears()) << what;
  EXPECT_EQ(from_file.widths(), from_cpu.widths()) << what;
  const int V = cpu.config().vocab_size, n = std::min(48, cpu.config().max_seq_len);
  const std::vector<int32_t> ids = some_ids(cpu, n);
  std::vector<float> logits[2];
  std::vector<int32_t> tokens[2];
  cuda::GpuModel* models[2] = {&from_file, &from_cpu};
  for (int i = 0; i < 2; ++i) {
    cuda::GpuKVCache c = models[i]->new_cache(1, n);
    logits[i] = download(*models[i], models[i]->forward(ids.data(), 1, n, c, true, bits), static_cast<size_t>(n) * V);
    cuda::GpuKVCache d = models[i]->new_cache(1, n);
    models[i]->forward(ids.data(), 1, n / 2, d, false, bits);
    models[i]->greedy_from_last_logits(1);
    for (int step = 0; step + n / 2 < n; ++step) {
      tokens[i].push_back(models[i]->get_decode_tokens(1)[0]);
      models[i]->decode_step_greedy(d, bits, true);
    }
  }
  const double err = compare_logits(logits[0], logits[1], V).first;
  EXPECT_LE(err, kSameDeviceBudget) << what;
  EXPECT_EQ(tokens[0], tokens[1]) << what;
  std::printf("[ %s ] GPU model from the file vs from the CPU model: %s (max |dlogit| / max|logit| = %.2e)\n",
              what.c_str(), logits[0] == logits[1] ? "bit-identical logits" : "logits differ", err);
}

// Prefill of 40 positions, then decode steps of two sequences at once and of one (the fp16 linears on our dense GEMV,
// dense_gemv.cu, the biases of qwen2 in its epilogue), each row against the CPU's own decode of that sequence.
TEST(CudaModel, TinyArchitecturesMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* arch : {"llama3", "qwen2", "mistral", "mistral_sw"}) {
    auto cpu = Model::load(test::fixture(std::string("tiny_") + arch));
    cuda::GpuModel gpu(cpu->weights());
    expect_forward_matches(*cpu, gpu, some_ids(*cpu, 40), 0, std::string("tiny ") + arch);
    expect_file_load_equals_cpu_upload(*cpu, gpu, 0, std::string("tiny ") + arch);
    const int V = cpu->config().vocab_size, P = 12, end = 30;
    std::vector<std::vector<int32_t>> seqs(2);
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < end; ++t) seqs[static_cast<size_t>(b)].push_back(static_cast<int32_t>((t * 53 + b * 97 + 3) % V));
    std::vector<KVCache> cc;
    std::vector<float> want(static_cast<size_t>(V));
    std::vector<int32_t> prompt;
    for (int b = 0; b < 2; ++b) {
      cc.push_back(cpu->new_cache(end));
      cpu->forward(seqs[static_cast<size_t>(b)].data(), P, cc.back(), want.data(), false, 0);
      prompt.insert(prompt.end(), seqs[static_cast<size_t>(b)].begin(), seqs[static_cast<size_t>(b)].begin() + P);
    }
    cuda::GpuKVCache gc = gpu.new_cache(2, end);
    gpu.forward(prompt.data(), 2, P, gc, false, 0);
    for (int t = P; t < end; ++t) {
      const int32_t step[2] = {seqs[0][static_cast<size_t>(t)], seqs[1][static_cast<size_t>(t)]};
      const auto got = download(gpu, gpu.forward(step, 2, 1, gc, false, 0), static_cast<size_t>(2 * V));
      for (int b = 0; b < 2; ++b) {
        cpu->forward(&step[b], 1, cc[static_cast<size_t>(b)], want.data(), false, 0);
        const std::vector<float> row(got.begin() + static_cast<ptrdiff_t>(b) * V, got.begin() + static_cast<ptrdiff_t>(b + 1) * V);
        EXPECT_LE(compare_logits(row, want, V).first, kLogitBudget) << arch << " batch-2 decode, sequence " << b << " position " << t;
      }
    }
    expect_decode_matches(*cpu, gpu, some_ids(*cpu, 40), 24, 40, 0, std::string("tiny ") + arch + " batch-1 decode");
  }
}

// Decode with the KV cache (one token per call) gives the prefill's logits; so does a batch of 3 sequences.
TEST(CudaModel, DecodeAndBatchMatchPrefill) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  auto cpu = Model::load(bin);
  cuda::GpuModel gpu(cpu->weights());
  const int V = cpu->config().vocab_size, n = 24;
  std::vector<int32_t> ids = some_ids(*cpu, n);
  cuda::GpuKVCache c1 = gpu.new_cache(1, n);
  const auto prefill = download(gpu, gpu.forward(ids.data(), 1, n, c1, true, 0), static_cast<size_t>(n) * V);
  cuda::GpuKVCache c2 = gpu.new_cache(1, n);
  gpu.forward(ids.data(), 1, 10, c2, false, 0);
  for (int t = 10; t < n; ++t) {
    const auto step = download(gpu, gpu.forward(&ids[static_cast<size_t>(t)], 1, 1, c2, false, 0), static_cast<size_t>(V));
    const std::vector<float> want(prefill.begin() + static_cast<ptrdiff_t>(t) * V, prefill.begin() + static_cast<ptrdiff_t>(t + 1) * V);
    EXPECT_LE(compare_logits(step, want, V).first, kSameDeviceBudget) << "decode step at position " << t;
  }
  // Three different sequences in one batch, each against its own single-sequence run.
  std::vector<int32_t> batch;
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < n; ++t) batch.push_back(static_cast<int32_t>((t * 31 + s * 101 + 7) % V));
  cuda::GpuKVCache cb = gpu.new_cache(3, n);
  const auto all = download(gpu, gpu.forward(batch.data(), 3, n, cb, true, 0), static_cast<size_t>(3 * n) * V);
  for (int s = 0; s < 3; ++s) {
    cuda::GpuKVCache cs = gpu.new_cache(1, n);
    const auto one = download(gpu, gpu.forward(batch.data() + s * n, 1, n, cs, true, 0), static_cast<size_t>(n) * V);
    const std::vector<float> part(all.begin() + static_cast<ptrdiff_t>(s) * n * V, all.begin() + static_cast<ptrdiff_t>(s + 1) * n * V);
    EXPECT_LE(compare_logits(part, one, V).first, kSameDeviceBudget) << "sequence " << s << " of the batch";
  }
}

// Continuous batching's decode step (decode_slots): any subset of a cache's slots, in any order, at different
// positions, padded to a bucket with the cache's last slot, gives each sequence the logits of its own
// single-sequence run; graph replays give plain launches' logits bit for bit; the padding slot stays empty.
TEST(CudaModel, SlotDecodeMatchesEachSequenceAlone) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  auto cpu = Model::load(bin);
  cuda::GpuModel gpu(cpu->weights());
  const int V = cpu->config().vocab_size, S = 5, cap = 64;
  const std::vector<std::vector<int>> schedule = {{0}, {2, 0}, {3, 1, 4}, {1, 2, 3, 4, 0}, {4}, {0, 3}, {2, 4, 1, 0, 3}, {1}};
  auto run = [&](bool graph, bool check) {
    cuda::GpuKVCache cb = gpu.new_cache(S + 1, cap);
    std::vector<cuda::GpuKVCache> alone;
    for (int s = 0; s < S; ++s) {
      std::vector<int32_t> prompt;
      for (int t = 0; t < 5 + 3 * s; ++t) prompt.push_back(static_cast<int32_t>((t * 29 + s * 53 + 3) % V));
      const auto got = download(gpu, gpu.forward(prompt.data(), 1, static_cast<int>(prompt.size()), cb, false, 0, s),
                                static_cast<size_t>(V));
      alone.push_back(gpu.new_cache(1, cap));
      const auto want = download(gpu, gpu.forward(prompt.data(), 1, static_cast<int>(prompt.size()), alone.back(), false, 0),
                                 static_cast<size_t>(V));
      if (check) {
        EXPECT_EQ(got, want) << "slot " << s << " prefill";
      }
    }
    std::vector<std::vector<float>> logits;
    for (size_t k = 0; k < schedule.size(); ++k) {
      const std::vector<int>& slots = schedule[k];
      std::vector<int32_t> toks;
      for (int s : slots) toks.push_back(static_cast<int32_t>((k * 71 + static_cast<size_t>(s) * 13 + 1) % V));
      const auto rows = download(gpu, gpu.decode_slots(cb, slots, toks, 0, graph), slots.size() * static_cast<size_t>(V));
      logits.push_back(rows);
      if (!check) continue;
      for (size_t i = 0; i < slots.size(); ++i) {
        const auto want = download(gpu, gpu.forward(&toks[i], 1, 1, alone[static_cast<size_t>(slots[i])], false, 0),
                                   static_cast<size_t>(V));
        const std::vector<float> row(rows.begin() + static_cast<ptrdiff_t>(i) * V, rows.begin() + static_cast<ptrdiff_t>(i + 1) * V);
        EXPECT_LE(compare_logits(row, want, V).first, kSameDeviceBudget) << "step " << k << " slot " << slots[i];
      }
    }
    for (int s = 0; check && s < S; ++s)   // (the alone caches advance only in the checked run)
      EXPECT_EQ(cb.len[static_cast<size_t>(s)], alone[static_cast<size_t>(s)].len[0]) << "slot " << s;
    EXPECT_EQ(cb.len[S], 0) << "the padding slot";
    return logits;
  };
  const auto plain = run(false, true);
  const int before = gpu.graph_captures();
  const auto graphed = run(true, false);
  EXPECT_EQ(plain, graphed) << "graph replays give plain launches' logits";
  EXPECT_EQ(gpu.graph_captures() - before, 4) << "buckets 1, 2, 4 and 6 (8 capped at the cache's 6 slots): one capture each";
  // A new cache of the same shape (its buffers may land where the old ones were) records graphs of its own: a graph
  // keyed by an address could replay against a freed buffer.
  const int again = gpu.graph_captures();
  run(true, false);
  EXPECT_EQ(gpu.graph_captures() - again, 4) << "a new cache: its own captures, never an old cache's graphs";
}

// The batch generator on the GPU (CudaBackend's batch cache): greedy requests that join and leave the batch give the
// tokens they give alone.
TEST(CudaModel, ContinuousBatchGreedyEqualsGenerateAlone) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  BackendOptions bo;
  bo.device = Device::Cuda;
  std::unique_ptr<Backend> b = open_backend(bin, bo);
  const Tokenizer& tok = b->tokenizer();
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : {"Once upon a time", "The cat sat", "Lily and Tom went to the park to play", "It was"})
    prompts.push_back(tok.encode(p, true, false));
  // The paged cache with every slot's blocks, then a pool of 7 blocks (one context of 96 positions and one block) for
  // three generations of up to 6 each (EOS off: they run their whole length): prompts wait for blocks and running
  // generations are preempted and resumed.
  for (const int blocks : {0, 7}) {
    BatchOptions o;
    o.max_seqs = 3;
    o.capacity = 96;
    o.prefill_chunk = 5;
    o.kv_blocks = blocks;
    BatchGenerator gen(*b, o);
    std::map<uint64_t, size_t> index;
    std::map<size_t, GenerateResult> got;
    size_t next = 0;
    for (int round = 0; got.size() < 2 * prompts.size() && round < 4000; ++round) {
      while (next < 2 * prompts.size() && gen.free_slots() > 0) {
        GenerateOptions g;
        g.max_new_tokens = 20 + static_cast<int>(next) * 7;
        g.stop_at_eos = blocks == 0;
        index[gen.add(prompts[next % prompts.size()], g)] = next;
        ++next;
      }
      for (auto& f : gen.step()) got[index.at(f.id)] = f.result;
    }
    ASSERT_EQ(got.size(), 2 * prompts.size());
    EXPECT_EQ(gen.kv_blocks_used(), 0);
    if (blocks > 0) {
      EXPECT_GT(gen.preemptions(), 0) << "the pool was meant to run out";
    }
    int same = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      GenerateOptions g;
      g.max_new_tokens = 20 + static_cast<int>(i) * 7;
      g.stop_at_eos = blocks == 0;
      const GenerateResult alone = generate(*b, prompts[i % prompts.size()], g);
      same += alone.new_ids == got[i].new_ids;
      EXPECT_EQ(alone.new_ids, got[i].new_ids) << "request " << i << ", pool " << blocks;
    }
    std::printf("[ continuous batch on the GPU ] pool of %d blocks, %lld preemptions: %d of %zu greedy requests equal "
                "to generate() alone\n", gen.kv_blocks_total(), static_cast<long long>(gen.preemptions()), same, got.size());
  }
}

// Self-speculative decoding on the GPU: an any-precision stories260K file (quantized here on the CPU) drafts at 2, 3
// and 4 bits for its 8-bit view. The verify forward of k + 1 tokens runs other kernels than the single-token decode
// of the target alone (rounding differs), so the tokens are compared position by position up to the first difference;
// all but a near-tie must agree.
TEST(CudaModel, SpeculativeGreedyFollowsTheTarget) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  const std::string file = test::temp_dir() + "/stories.anyprec.lowbit";
  api::QuantizeOptions q;
  q.method = api::QuantMethod::AnyPrec;
  q.anyprec.seed_bits = 2;
  q.anyprec.widths = {2, 3, 4, 8};
  q.calib.samples = 4;
  q.calib.seqlen = 128;
  api::quantize(bin, file, q);
  BackendOptions bo;
  bo.device = Device::Cuda;
  std::unique_ptr<Backend> b = open_backend(file, bo);
  const Tokenizer& tok = b->tokenizer();
  int same = 0, total = 0;
  for (const char* prompt : {"Once upon a time", "Lily and Tom went to the park", "The dog"}) {
    GenerateOptions g;
    g.bits = 8;
    g.max_new_tokens = 120;
    g.stop_at_eos = false;
    const std::vector<int32_t> ids = tok.encode(prompt, true, false);
    const GenerateResult alone = generate(*b, ids, g);
    for (int draft : {2, 3, 4}) {
      SpeculativeOptions so;
      so.draft_bits = draft;
      SpeculativeStats st;
      const GenerateResult r = generate_speculative(*b, *b, ids, g, so, nullptr, &st);
      ASSERT_EQ(r.new_ids.size(), alone.new_ids.size());
      size_t agree = 0;
      while (agree < r.new_ids.size() && r.new_ids[agree] == alone.new_ids[agree]) ++agree;
      same += static_cast<int>(agree);
      total += static_cast<int>(r.new_ids.size());
      std::printf("[ speculative on the GPU ] '%s' draft %d bits: %zu of %zu tokens equal to the target alone before "
                  "the first difference; %lld of %lld drafts kept, %.2f tokens per target forward\n",
                  prompt, draft, agree, r.new_ids.size(), static_cast<long long>(st.accepted),
                  static_cast<long long>(st.drafted), st.tokens_per_round(static_cast<int64_t>(r.new_ids.size())));
    }
  }
  EXPECT_GE(same, total * 9 / 10);
}

// Greedy decode replayed from a CUDA graph produces exactly the tokens of plain launches, for a batch of 2, with a
// context long enough (300 + 40 of 512 positions) that decode attention splits its keys over several blocks.
TEST(CudaModel, GraphDecodeEqualsPlainDecode) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  auto cpu = Model::load(bin);
  cuda::GpuModel gpu(cpu->weights());
  const int P = 300;
  std::vector<int32_t> prompt;
  for (int s = 0; s < 2; ++s)
    for (int t = 0; t < P; ++t) prompt.push_back(static_cast<int32_t>((t * 37 + s * 11 + 5) % cpu->config().vocab_size));
  std::vector<std::vector<int32_t>> runs;
  const int captures_before = gpu.graph_captures();
  for (bool graph : {false, true}) {
    cuda::GpuKVCache c = gpu.new_cache(2, cpu->config().max_seq_len);
    gpu.forward(prompt.data(), 2, P, c, false, 0);
    gpu.greedy_from_last_logits(2);
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) {
      const auto t = gpu.get_decode_tokens(2);
      toks.insert(toks.end(), t.begin(), t.end());
      gpu.decode_step_greedy(c, 0, graph);
    }
    EXPECT_EQ(c.len[0], P + 40);
    runs.push_back(toks);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(gpu.graph_captures() - captures_before, 1) << "40 graph steps of one batch and cache: one capture, 39 replays";
}

// A paged KV cache (blocks of 16 in a shuffled order) gives the logits of a contiguous one bit for bit: prefill, and
// decode steps with RoPE folded into attention and keys split over several blocks per head, plain and replayed.
TEST(CudaModel, PagedCacheDecodesAsContiguous) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = small_config(2, 1024);
  cuda::GpuModel gpu(c, cuda::GpuModel::RandomKind::AnyPrec, 31);
  const int S = 3, cap = 1000, block = 16, per = (cap + block - 1) / block;
  ASSERT_GT(gpu.decode_splits(4, cap), 1) << "the test wants split keys";
  ASSERT_TRUE(cuda::attention_folds_rope(4, c.head_dim, true) || !cuda::fold_rope_enabled());
  cuda::GpuKVCache flat = gpu.new_cache(S + 1, cap);
  cuda::GpuKVCache paged = gpu.new_paged_cache(S + 1, cap, (S + 1) * per + 5, block);
  std::vector<int32_t> order(static_cast<size_t>((S + 1) * per + 5));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  std::copy_n(order.begin(), paged.table.size(), paged.table.begin());
  paged.table_dirty = true;
  const int V = c.vocab_size;
  for (int s = 0; s < S; ++s) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 300 + 150 * s; ++t) prompt.push_back(static_cast<int32_t>((t * 41 + s * 7 + 3) % V));
    const auto a = download(gpu, gpu.forward(prompt.data(), 1, static_cast<int>(prompt.size()), flat, false, 4, s), static_cast<size_t>(V));
    const auto b = download(gpu, gpu.forward(prompt.data(), 1, static_cast<int>(prompt.size()), paged, false, 4, s), static_cast<size_t>(V));
    EXPECT_EQ(a, b) << "prefill of slot " << s;
  }
  const std::vector<std::vector<int>> schedule = {{0, 1, 2}, {2, 0}, {1}, {0, 1, 2}, {2, 1, 0}, {0, 2}};
  for (size_t k = 0; k < schedule.size(); ++k) {
    std::vector<int32_t> toks;
    for (int s : schedule[k]) toks.push_back(static_cast<int32_t>((k * 31 + static_cast<size_t>(s) * 5 + 1) % V));
    const bool graph = k >= 3;
    const size_t n = schedule[k].size() * static_cast<size_t>(V);
    const auto a = download(gpu, gpu.decode_slots(flat, schedule[k], toks, 4, graph), n);
    const auto b = download(gpu, gpu.decode_slots(paged, schedule[k], toks, 4, graph), n);
    EXPECT_EQ(a, b) << "decode step " << k << (graph ? " (graph)" : "");
  }
}

// A decode step whose rows run at different any-precision widths (one forward reading the widest width's planes for
// all rows, packed_matmul_mixed) gives each row the logits of a step at its own width alone, within the same-device
// budget; graph replays (one capture per bucket and widest width, the widths uploaded per step) give plain launches'
// logits bit for bit; the batch generator on it runs a step of three widths as one forward.
TEST(CudaModel, MixedWidthDecodeStepGivesEachRowItsWidth) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = small_config(2, 256);
  cuda::GpuModel gpu(c, cuda::GpuModel::RandomKind::AnyPrec, 29);
  ASSERT_TRUE(gpu.mixed_decode_serves(8));
  EXPECT_FALSE(gpu.mixed_decode_serves(9));
  const int V = c.vocab_size, S = 6, cap = 64;
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> schedule = {
      {{0, 1, 2}, {3, 8, 4}}, {{3, 1, 0, 5}, {2, 2, 8, 8}}, {{0, 1, 2, 3, 4, 5}, {3, 4, 8, 2, 3, 4}},
      {{2, 4}, {4, 3}}, {{5, 0, 3, 1, 4, 2}, {8, 3, 3, 3, 3, 0}}, {{1}, {6}}};
  auto run = [&](bool graph, bool check) {
    cuda::GpuKVCache mixed = gpu.new_cache(S + 1, cap), single = gpu.new_cache(S + 1, cap);
    for (int s = 0; s < S; ++s) {
      std::vector<int32_t> prompt;
      for (int t = 0; t < 4 + 2 * s; ++t) prompt.push_back(static_cast<int32_t>((t * 37 + s * 11 + 5) % V));
      gpu.forward(prompt.data(), 1, static_cast<int>(prompt.size()), mixed, false, 8, s);
      gpu.forward(prompt.data(), 1, static_cast<int>(prompt.size()), single, false, 8, s);
    }
    std::vector<std::vector<float>> logits;
    for (size_t k = 0; k < schedule.size(); ++k) {
      const auto& [slots, bits] = schedule[k];
      std::vector<int32_t> toks;
      for (int s : slots) toks.push_back(static_cast<int32_t>((k * 53 + static_cast<size_t>(s) * 19 + 2) % V));
      const auto rows = download(gpu, gpu.decode_slots(mixed, slots, toks, bits, graph), slots.size() * static_cast<size_t>(V));
      logits.push_back(rows);
      for (size_t i = 0; i < slots.size(); ++i) {
        const auto want = download(gpu, gpu.decode_slots(single, {slots[i]}, {toks[i]}, bits[i], false), static_cast<size_t>(V));
        if (!check) continue;
        const std::vector<float> row(rows.begin() + static_cast<ptrdiff_t>(i) * V, rows.begin() + static_cast<ptrdiff_t>(i + 1) * V);
        EXPECT_LE(compare_logits(row, want, V).first, kSameDeviceBudget)
            << "step " << k << " slot " << slots[i] << " at width " << bits[i];
      }
    }
    return logits;
  };
  const auto plain = run(false, true);
  const auto graphed = run(true, false);
  EXPECT_EQ(plain, graphed) << "graph replays of mixed steps give plain launches' logits";

  // The batch generator with the mixed step on: requests at 3, 4 and 8 bits decode in one forward per step.
  const bool mixed_was = cuda::mixed_step_enabled();
  cuda::set_mixed_step(true);
  cuda::CudaBackend backend(gpu, nullptr, "random:mixed", ModelFormat::Random);
  BatchOptions o;
  o.max_seqs = 3;
  o.capacity = 64;
  BatchGenerator gen(backend, o);
  for (int w : {3, 4, 8}) {
    GenerateOptions g;
    g.max_new_tokens = 6;
    g.stop_at_eos = false;
    g.bits = w;
    gen.add({1, 2, 3, static_cast<int32_t>(w)}, g);
  }
  int three_row_steps = 0;
  for (int round = 0; gen.active() > 0 && round < 100; ++round) {
    gen.step();
    if (gen.last_decode_rows() == 3) {
      ++three_row_steps;
      EXPECT_EQ(gen.last_decode_forwards(), 1) << "three widths in one forward";
    }
  }
  EXPECT_GT(three_row_steps, 0);
  cuda::set_mixed_step(mixed_was);
}

// Any-precision width changed from step to step (as requests at different widths would): each width's decode graph
// is captured once and replayed after steps at other widths, giving, step by step, the logits of plain launches at
// that width, bit for bit; at most kMaxDecodeGraphs graphs are kept, the least recently used evicted first.
TEST(CudaModel, WidthSwitchReplaysEachWidthsGraph) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = small_config(2, 256);
  cuda::GpuModel gpu(c, cuda::GpuModel::RandomKind::AnyPrec, 17);
  const std::vector<int> order = {3, 8, 4, 3, 2, 8, 8, 4, 2, 3, 4, 8};
  // The logits of every step, widths in `order` (repeated `rounds` times), on a new cache after a 9-token prompt.
  auto run = [&](bool graph, int rounds) {
    cuda::GpuKVCache kv = gpu.new_cache(1, 64);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 9; ++i) prompt.push_back((i * 131 + 7) % c.vocab_size);
    gpu.forward(prompt.data(), 1, 9, kv, false, 3);
    gpu.greedy_from_last_logits(1);
    std::vector<std::vector<float>> logits;
    for (int r = 0; r < rounds; ++r)
      for (int bits : order) {
        gpu.decode_step_greedy(kv, bits, graph);
        logits.push_back(download(gpu, gpu.decode_logits(), static_cast<size_t>(c.vocab_size)));
      }
    return logits;
  };
  const auto plain = run(false, 2);
  const int before = gpu.graph_captures();
  const auto graphed = run(true, 2);
  EXPECT_EQ(gpu.graph_captures() - before, 4) << "widths 2, 3, 4, 8 on one cache: one capture each, every later step a replay";
  ASSERT_EQ(plain.size(), graphed.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_EQ(plain[i], graphed[i]) << "step " << i << " at width " << order[i % order.size()];
  // The widths differ in what they compute from the same state, so a graph replayed at the wrong width shows above.
  auto first_step = [&](int bits) {
    cuda::GpuKVCache kv = gpu.new_cache(1, 16);
    std::vector<int32_t> prompt = {5, 6, 7};
    gpu.forward(prompt.data(), 1, 3, kv, false, 3);
    gpu.greedy_from_last_logits(1);
    gpu.decode_step_greedy(kv, bits, false);
    return download(gpu, gpu.decode_logits(), static_cast<size_t>(c.vocab_size));
  };
  EXPECT_NE(first_step(3), first_step(4));
  EXPECT_NE(first_step(4), first_step(8));
  // kMaxDecodeGraphs at most: widths 2..8 on enough caches for more keys than that; the most recent stay.
  const int caches = static_cast<int>(cuda::GpuModel::kMaxDecodeGraphs / 7) + 2;
  for (int cache = 0; cache < caches; ++cache) {
    cuda::GpuKVCache kv = gpu.new_cache(1, 48 + cache);
    std::vector<int32_t> prompt = {1, 2, 3};
    gpu.forward(prompt.data(), 1, 3, kv, false, 2);
    gpu.greedy_from_last_logits(1);
    for (int bits = 2; bits <= 8; ++bits) gpu.decode_step_greedy(kv, bits, true);
  }
  EXPECT_EQ(gpu.cached_graphs(), cuda::GpuModel::kMaxDecodeGraphs);
}

// A greedy decode of `batch` sequences from a synthetic prompt (token i: (i * mul + add) % vocab, prompt_len each):
// the prefill, then `steps` CUDA-graph decode steps. Returns the tokens picked and the last step's logits.
struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};
GreedyRun greedy_run(cuda::GpuModel& gpu, int vocab, int batch, int prompt_len, int capacity, int steps, int bits, int mul, int add) {
  cuda::GpuKVCache kv = gpu.new_cache(batch, capacity);
  std::vector<int32_t> prompt;
  for (int i = 0; i < batch * prompt_len; ++i) prompt.push_back((i * mul + add) % vocab);
  gpu.forward(prompt.data(), batch, prompt_len, kv, false, bits);
  gpu.greedy_from_last_logits(batch);
  GreedyRun r;
  for (int step = 0; step < steps; ++step) {
    gpu.decode_step_greedy(kv, bits, true);
    const auto t = gpu.get_decode_tokens(batch);
    r.tokens.insert(r.tokens.end(), t.begin(), t.end());
  }
  r.logits = download(gpu, gpu.decode_logits(), static_cast<size_t>(batch) * vocab);
  return r;
}

// A greedy decode run with a run-time switch off and then on (set(false), set(true)): both give the same tokens and
// logits, bit for bit, and the logits are finite and not all zero.
void expect_same_decode_both_ways(const std::function<void(bool)>& set, const std::function<GreedyRun()>& run,
                                  const std::string& what) {
  GreedyRun r[2];
  for (const bool on : {false, true}) {
    set(on);
    r[on] = run();
  }
  EXPECT_EQ(r[0].tokens, r[1].tokens) << what;
  EXPECT_EQ(r[0].logits, r[1].logits) << what;
  EXPECT_TRUE(std::all_of(r[1].logits.begin(), r[1].logits.end(), [](float v) { return std::isfinite(v); })) << what;
  EXPECT_GT(*std::max_element(r[1].logits.begin(), r[1].logits.end()), 0.0f) << what << ": logits all zero";
}

// Programmatic dependent launch (backend_cuda/common/launch.cuh) changes when kernels start, never what they compute: decode graphs
// captured with every kernel class PDL-launched (not only the default ones) and without PDL give bit-identical logits
// and tokens, for every weight kind (fp16 / cuBLAS, any-precision register-table, shared-table and CUDA-core
// kernels, 2/4/16 with outliers), batch 1 and 3, random weights of a small shape, with attention split over several
// blocks (long cache) and not.
TEST(CudaModel, PdlDecodeIsBitIdenticalToPlainLaunches) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = small_config(3, 512);
  using RK = cuda::GpuModel::RandomKind;
  if (!cuda::pdl_enabled()) GTEST_SKIP() << "GPU test skipped: programmatic dependent launch needs sm_90 (or LOWBIT_PDL=0 is set)";
  const unsigned mask = cuda::pdl_mask();
  for (RK kind : {RK::Fp16, RK::AnyPrec, RK::Mixed24a}) {
    cuda::GpuModel gpu(c, kind, 11);
    for (int bits : kind == RK::AnyPrec ? std::vector<int>{2, 3, 4, 8} : std::vector<int>{0})
      for (int batch : {1, 3})
        for (int capacity : {40, 512}) {
          const std::string what = "kind " + std::to_string(static_cast<int>(kind)) + " bits " + std::to_string(bits) +
                                   " batch " + std::to_string(batch) + " cache " + std::to_string(capacity);
          expect_same_decode_both_ways(
              [](bool pdl) {
                cuda::set_pdl(pdl);
                cuda::set_pdl_mask(cuda::kPdlAll);
              },
              [&] { return greedy_run(gpu, c.vocab_size, batch, 9, capacity, 12, bits, 131, 7); }, what);
        }
  }
  cuda::set_pdl(true);
  cuda::set_pdl_mask(mask);
}

// A random-weight model shape whose layers are wide enough for the int8 GEMV (dim 2048, hidden 5632; rows of at least
// 2048 inputs), for the decode tests of what the int8 path changes.
ModelConfig int8_gemv_config() {
  ModelConfig c;
  c.dim = 2048, c.hidden_dim = 5632, c.n_layers = 2, c.n_heads = 16, c.n_kv_heads = 8, c.head_dim = 128, c.vocab_size = 512;
  c.max_seq_len = 256;
  return c;
}

// The rows' max |x| that RMSNorm, attention and SwiGLU hand the int8 GEMVs (LOWBIT_PRODUCER_XMAX, the default) give a
// decode bit-identical to the GEMVs' activation kernels reducing the rows themselves (and, for 2/4/16, the grouped
// integer-dot GEMVs the same decode as separate launches): a random any-precision model with
// layers wide enough for the int8 GEMV (dim 2048, hidden 5632), 2..4 bits, batch 1, 3 and 8, CUDA-graph decode steps,
// attention in one block per head (5-token prompt) and split over blocks with the combine kernel (40-token prompt).
TEST(CudaModel, ProducerRowMaximaGiveBitIdenticalDecode) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = int8_gemv_config();
  cuda::GpuModel gpu(c, cuda::GpuModel::RandomKind::AnyPrec, 21);
  const bool producer = cuda::producer_xmax_enabled();
  ASSERT_EQ(cuda::anyprec_auto_path(2 * c.hidden_dim, c.dim, 1, 3, true), cuda::GemvPath::TensorCoreInt8LutStream)
      << "the int8 GEMV must run for this test to check anything";
  for (int bits : {2, 3, 4})
    for (int batch : {1, 3, 8})
      for (int prompt_len : {5, 40}) {
        const std::string what = std::to_string(bits) + " bits batch " + std::to_string(batch) + " prompt " + std::to_string(prompt_len);
        expect_same_decode_both_ways(cuda::set_producer_xmax,
                                     [&] { return greedy_run(gpu, c.vocab_size, batch, prompt_len, 64, 6, bits, 37, 11); }, what);
      }
  // The 2/4/16 integer-dot GEMV (batch 1..2) reads the same maxima.
  cuda::GpuModel mixed(c, cuda::GpuModel::RandomKind::Mixed24a, 22);
  ASSERT_EQ(cuda::mixed24a_auto_path(c.hidden_dim, c.dim, 1, true), cuda::GemvPath::Dp2aStream)
      << "the integer-dot GEMV must run for this test to check anything";
  for (int batch : {1, 2})
    for (int prompt_len : {5, 40}) {
      const std::string what = "2/4/16 batch " + std::to_string(batch) + " prompt " + std::to_string(prompt_len);
      expect_same_decode_both_ways(cuda::set_producer_xmax,
                                   [&] { return greedy_run(mixed, c.vocab_size, batch, prompt_len, 64, 6, 0, 37, 11); }, what);
      // q / k / v and gate / up grouped into one launch each (the default) or not: the same kernel per tile, the same bits.
      expect_same_decode_both_ways(cuda::set_group_gemv,
                                   [&] { return greedy_run(mixed, c.vocab_size, batch, prompt_len, 64, 6, 0, 37, 11); }, what + " grouped");
    }
  cuda::set_group_gemv(true);
  cuda::set_producer_xmax(producer);
}

// RoPE and the KV store folded into decode attention (LOWBIT_FOLD_ROPE, the default) give a decode bit-identical to
// their own kernel before attention: the same rotation (rope_rotate) and fp16 rounding of the new key and value, taken
// by every block whose key range holds the new position and stored by one block per kv head (the next steps read it
// back from the cache, so a wrong store shows up in their logits). Head dims 64 and 128 with GQA (8 heads on 2 / 4 kv
// heads), fp16 and 3-bit weights, batch 1, 3 and 8, prompts of 4, 70 and 300 tokens (caches 16 longer): attention in
// one block per head and split over blocks; at 300 tokens and batch 8, two splits of ~150 keys, so the new position
// lies in the second chunk of its warp.
TEST(CudaModel, FoldedRopeDecodeIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const bool fold = cuda::fold_rope_enabled();
  using RK = cuda::GpuModel::RandomKind;
  for (int hd : {64, 128}) {
    ModelConfig c;
    c.dim = 8 * hd, c.hidden_dim = 1024, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = hd == 64 ? 2 : 4, c.head_dim = hd;
    c.vocab_size = 384, c.max_seq_len = 512;
    ASSERT_TRUE(cuda::attention_folds_rope(1, hd, true) || !fold);
    for (RK kind : {RK::Fp16, RK::AnyPrec}) {
      cuda::GpuModel gpu(c, kind, 31);
      for (int batch : {1, 3, 8})
        for (int prompt_len : {4, 70, 300}) {
          const int bits = kind == RK::AnyPrec ? 3 : 0;
          const std::string what = "hd " + std::to_string(hd) + " kind " + std::to_string(static_cast<int>(kind)) + " batch " +
                                   std::to_string(batch) + " prompt " + std::to_string(prompt_len);
          expect_same_decode_both_ways(
              cuda::set_fold_rope, [&] { return greedy_run(gpu, c.vocab_size, batch, prompt_len, prompt_len + 16, 8, bits, 53, 5); }, what);
        }
    }
  }
  cuda::set_fold_rope(fold);
}

// SwiGLU in the gate/up GEMV's epilogue (LOWBIT_FOLD_SWIGLU, the default) gives a decode bit-identical to the SwiGLU
// kernel after the GEMV: a random any-precision model with layers wide enough for the int8 GEMV, 2..3 bits (where the
// runtime takes it; the kernel test covers 4 bits), batch 1, 3 and 8, CUDA-graph decode steps.
TEST(CudaModel, FoldedSwiGluDecodeIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const ModelConfig c = int8_gemv_config();
  cuda::GpuModel gpu(c, cuda::GpuModel::RandomKind::AnyPrec, 23);
  const bool fold = cuda::fold_swiglu_enabled();
  for (int bits : {2, 3})
    for (int batch : {1, 3, 8}) {
      const std::string what = std::to_string(bits) + " bits batch " + std::to_string(batch);
      expect_same_decode_both_ways(cuda::set_fold_swiglu, [&] { return greedy_run(gpu, c.vocab_size, batch, 12, 64, 6, bits, 41, 3); }, what);
    }
  cuda::set_fold_swiglu(fold);
}

// Attention's key splits merged inside thread-block clusters (LOWBIT_CLUSTER_COMBINE, the default) give a decode
// bit-identical to the combine kernel after attention: head dims 64 and 128 (GQA), fp16 and 3-bit weights, batch 1 and
// 3, caches of 2 to 8 splits (and at batch 1 one of 9, where both take the combine kernel), CUDA-graph decode steps;
// the row maxima attention hands the int8 GEMV come from the cluster's first block.
TEST(CudaModel, ClusterCombineDecodeIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const bool on = cuda::cluster_combine_enabled();
  using RK = cuda::GpuModel::RandomKind;
  for (int hd : {64, 128}) {
    ModelConfig c;
    c.dim = 16 * hd, c.hidden_dim = 4096, c.n_layers = 2, c.n_heads = 16, c.n_kv_heads = 4, c.head_dim = hd;
    c.vocab_size = 384, c.max_seq_len = 4096;
    for (RK kind : {RK::Fp16, RK::AnyPrec}) {
      cuda::GpuModel gpu(c, kind, 43);
      for (int batch : {1, 3})
        for (int prompt_len : {40, 150, 600, 2400}) {
          const int bits = kind == RK::AnyPrec ? 3 : 0, capacity = prompt_len + 16;
          const int splits = gpu.decode_splits(batch, capacity);
          const std::string what = "hd " + std::to_string(hd) + " kind " + std::to_string(static_cast<int>(kind)) + " batch " +
                                   std::to_string(batch) + " prompt " + std::to_string(prompt_len) + " splits " + std::to_string(splits);
          expect_same_decode_both_ways(cuda::set_cluster_combine,
                                       [&] { return greedy_run(gpu, c.vocab_size, batch, prompt_len, capacity, 6, bits, 59, 13); }, what);
        }
    }
  }
  cuda::set_cluster_combine(on);
}

// Batch-1 decode steps on the GPU (the GEMV kernels, not dequantize + cuBLAS) against the CPU's decode steps:
// ids[0, prompt) as a prefill, then one token at a time up to position end - 1, every step's logits compared.
void expect_decode_matches(const Model& cpu, cuda::GpuModel& gpu, const std::vector<int32_t>& ids, int prompt, int end,
                           int bits, const std::string& what) {
  const int V = cpu.config().vocab_size;
  KVCache cc = cpu.new_cache(end);
  cuda::GpuKVCache gc = gpu.new_cache(1, end);
  std::vector<float> want(static_cast<size_t>(V));
  cpu.forward(ids.data(), prompt, cc, want.data(), false, bits);
  gpu.forward(ids.data(), 1, prompt, gc, false, bits);
  for (int t = prompt; t < end; ++t) {
    cpu.forward(&ids[static_cast<size_t>(t)], 1, cc, want.data(), false, bits);
    const auto got = download(gpu, gpu.forward(&ids[static_cast<size_t>(t)], 1, 1, gc, false, bits), static_cast<size_t>(V));
    EXPECT_LE(compare_logits(got, want, V).first, kLogitBudget) << what << " decode position " << t;
  }
}

// Teacher-forced check of the GPU's greedy generation: every token it picks is, on the CPU at the same position,
// within the logit budget of the CPU's own best token (a near-tie may go either way; anything else may not).
void expect_generation_near_greedy(const Model& cpu, cuda::GpuModel& gpu, const std::vector<int32_t>& prompt, int bits,
                                   const std::string& what) {
  GenerateOptions go;
  go.max_new_tokens = 24;
  go.stop_at_eos = false;
  go.bits = bits;
  cuda::CudaBackend backend = backend_over(gpu, cpu);
  const GenerateResult r = generate(backend, prompt, go);
  ASSERT_EQ(r.new_ids.size(), 24u) << what;
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), r.new_ids.begin(), r.new_ids.end());
  const int V = cpu.config().vocab_size, n = static_cast<int>(seq.size());
  std::vector<float> logits(static_cast<size_t>(n) * V);
  KVCache cache = cpu.new_cache(n);
  cpu.forward(seq.data(), n, cache, logits.data(), true, bits);
  for (size_t i = 0; i < r.new_ids.size(); ++i) {
    const float* row = logits.data() + (prompt.size() - 1 + i) * static_cast<size_t>(V);
    const float best = *std::max_element(row, row + V);
    double scale = 1;
    for (int v = 0; v < V; ++v) scale = std::max(scale, std::fabs(static_cast<double>(row[v])));
    EXPECT_LE(best - row[r.new_ids[i]], kLogitBudget * scale) << what << ": generated token " << i;
  }
}

TEST(CudaModel, Stories260KPerplexityMatchesCpuFp32AndAnyPrec) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(text, "TinyStories sample");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  auto base = Model::load(bin);
  const auto windows = make_windows_documents(test::tinystories_docs(*base), 512, nullptr);
  PplOptions po;
  po.ctx = 512;
  {
    cuda::GpuModel gpu(base->weights());
    cuda::CudaBackend backend = backend_over(gpu, *base);
    const double cpu_ppl = perplexity(*base, windows, po).ppl, gpu_ppl = perplexity(backend, windows, po).ppl;
    std::printf("[ stories260K fp32 ] ppl cpu %.4f gpu %.4f\n", cpu_ppl, gpu_ppl);
    EXPECT_NEAR(gpu_ppl / cpu_ppl, 1.0, kPplBudget);
    expect_forward_matches(*base, gpu, windows[0], 0, "stories260K fp32");
    expect_file_load_equals_cpu_upload(*base, gpu, 0, "stories260K fp32");
  }
  QuantizeOptions o;
  o.method = QuantMethod::AnyPrec;
  o.anyprec.outlier_fraction = 0.002;   // exercises the fused outlier correction
  auto ap = quantized(*base, o, 8);
  cuda::GpuModel gpu(ap->weights());
  cuda::CudaBackend backend = backend_over(gpu, *ap);
  EXPECT_EQ(gpu.widths(), ap->widths());
  expect_file_load_equals_cpu_upload(*ap, gpu, 3, "stories260K anyprec 3-bit");
  for (int b : ap->widths()) {
    po.bits = b;
    const double cpu_ppl = perplexity(*ap, windows, po).ppl, gpu_ppl = perplexity(backend, windows, po).ppl;
    std::printf("[ stories260K anyprec ] width %d ppl cpu %.4f gpu %.4f\n", b, cpu_ppl, gpu_ppl);
    EXPECT_NEAR(gpu_ppl / cpu_ppl, 1.0, kPplBudget) << "width " << b;
    expect_forward_matches(*ap, gpu, windows[0], b, "stories260K anyprec " + std::to_string(b) + "-bit");
    const std::vector<int32_t>& w0 = windows[0];
    // Prompts of 16 and 64 tokens run their linears through the fused paths above batch 8 (packed_matmul: the
    // two-tile GEMV at 9..16 tokens, every width; the staged GEMM at 64 tokens, 2..4 bits; dequantize + cuBLAS
    // otherwise), against the CPU model.
    for (int len : {16, 64})
      expect_forward_matches(*ap, gpu, std::vector<int32_t>(w0.begin(), w0.begin() + len), b,
                             "stories260K anyprec " + std::to_string(b) + "-bit, " + std::to_string(len) + "-token prefill");
    expect_decode_matches(*ap, gpu, w0, 8, 24, b, "stories260K anyprec width " + std::to_string(b));
    expect_generation_near_greedy(*ap, gpu, std::vector<int32_t>(w0.begin(), w0.begin() + 12), b,
                                  "stories260K anyprec " + std::to_string(b) + "-bit generation");
  }
  test::expect_error([&](const std::string&) { gpu.check_bits(2); }, "--bits 2", "not served");
  // Through the backend, the CPU model's message.
  test::expect_error([&](const std::string&) { backend.check_bits(2); }, ap->weights().path,
                     "--bits 2 is not a width this model serves (3,4,5,6,7,8)");
}

// RTN/GPTQ integers run packed (the uniform GEMV over the stored bit streams, no fp16 copy): stories260K's 64-wide
// inputs take the chunked form, its 172-wide down projection the per-column one; act-order adds g_idx.
TEST(CudaModel, GptqModelRunsPacked) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  auto base = Model::load(bin);
  for (const auto& [bits, act_order] : std::vector<std::pair<int, bool>>{{4, false}, {3, true}}) {
    QuantizeOptions o;
    o.method = QuantMethod::Gptq;
    o.gptq.spec.bits = bits;
    o.gptq.spec.group_size = 32;
    o.gptq.act_order = act_order;
    auto q = quantized(*base, o, 4);
    cuda::GpuModel gpu(q->weights());
    EXPECT_EQ(gpu.dequantized_linears(), 0);
    const std::string what = "stories260K GPTQ w" + std::to_string(bits) + " g32" + (act_order ? " act-order" : "");
    expect_file_load_equals_cpu_upload(*q, gpu, 0, what);
    expect_forward_matches(*q, gpu, some_ids(*q, 64), 0, what);
  }
}

// QUIK models run on the GPU in every activation form (integer A8, FP8, A16). The GPU forward rounds differently from
// the CPU's between the linears, and a quantized activation code flips wherever an activation sits within that
// difference of a rounding boundary; each flip moves a whole quantization step. So the budget for the quantized forms
// is the CPU path's own movement under noise of fp16's size (every embedding value moved by 2^-11:
// cpu_logits_perturbed), twice over, and never below kLogitBudget; A16 has no codes to flip and keeps kLogitBudget.
TEST(CudaModel, QuikModelRunsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  auto base = Model::load(bin);
  struct Form {
    int wbits;
    const char* abits;   // LoadOptions::quik_abits
  };
  for (const Form f : {Form{8, "8"}, Form{4, "8"}, Form{4, "fp8"}, Form{4, "16"}}) {
    QuantizeOptions o;
    o.method = QuantMethod::Quik;
    o.quik.wbits = f.wbits;
    o.quik.abits = 8;
    o.calib.samples = 4;
    o.calib.seqlen = 128;
    const std::string path = test::temp_dir() + "/q.lowbit";
    quantize_to_file(*base, o, path);
    LoadOptions lo;
    lo.quik_abits = f.abits;
    auto q = Model::load(path, lo);
    cuda::GpuModel gpu(q->weights());
    EXPECT_EQ(gpu.dequantized_linears(), 0);
    const std::string what = "stories260K QUIK W" + std::to_string(f.wbits) + " activations " + f.abits;
    const std::vector<int32_t> ids = some_ids(*q, 64);
    const int V = q->config().vocab_size;
    const std::vector<float> want = test::cpu_logits_perturbed(*q, ids, 0, 1);
    double floor = 0;
    for (uint32_t seed : {1u, 2u, 3u})
      floor = std::max(floor, compare_logits(test::cpu_logits_perturbed(*q, ids, 0x1p-11, seed), want, V).first);
    const double budget = std::string(f.abits) == "16" ? kLogitBudget : std::max(kLogitBudget, 2 * floor);
    cuda::GpuKVCache gc = gpu.new_cache(1, static_cast<int>(ids.size()));
    const auto got = download(gpu, gpu.forward(ids.data(), 1, static_cast<int>(ids.size()), gc, true, 0), want.size());
    const auto [err, agree] = compare_logits(got, want, V);
    EXPECT_LE(err, budget) << what;
    EXPECT_GE(agree, 0.95) << what;
    std::printf("[ %s ] GPU vs CPU: max |dlogit| / max|logit| = %.2e (budget %.2e; the CPU's own movement under 2^-11 "
                "noise %.2e), argmax agreement %.4f over %zu positions\n",
                what.c_str(), err, budget, floor, agree, ids.size());
    // The activations quantized by RMSNorm / SwiGLU with attention quantizing the o projection's input (in every step,
    // in decode steps only) or the o projection quantizing its own (the default), or by each linear: the same bits,
    // prefill and decode.
    ASSERT_TRUE(cuda::quik_producer_act_enabled());
    ASSERT_EQ(cuda::quik_attention_act_mode(), 0);
    for (const int rows : {static_cast<int>(ids.size()), 1}) {
      std::vector<std::vector<float>> runs;
      for (const auto& [producers, attention] : {std::pair{true, 1}, std::pair{true, -1}, std::pair{true, 0}, std::pair{false, 1}}) {
        cuda::set_quik_producer_act(producers);
        cuda::set_quik_attention_act_mode(attention);
        cuda::GpuKVCache kv = gpu.new_cache(1, static_cast<int>(ids.size()));
        if (rows == 1) gpu.forward(ids.data(), 1, static_cast<int>(ids.size()) - 1, kv, false, 0);
        const int32_t* first = rows == 1 ? ids.data() + ids.size() - 1 : ids.data();
        runs.push_back(download(gpu, gpu.forward(first, 1, rows, kv, true, 0), static_cast<size_t>(rows) * V));
      }
      cuda::set_quik_producer_act(true);
      cuda::set_quik_attention_act_mode(0);
      EXPECT_EQ(runs[0], runs[1]) << what << ", " << rows << " rows: attention's quantization in every step against decode only";
      EXPECT_EQ(runs[0], runs[2]) << what << ", " << rows << " rows: attention's quantization against the o projection's";
      EXPECT_EQ(runs[0], runs[3]) << what << ", " << rows << " rows: producers' quantization against each linear's";
    }
  }
}

TEST(CudaModel, SmolLM2Fp16AndMixed24aMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::string gguf = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(gguf, "SmolLM2 GGUF");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  auto base = Model::load(gguf);
  const std::vector<int32_t> ids = some_ids(*base, 300);
  {
    cuda::GpuModel gpu(base->weights());
    expect_forward_matches(*base, gpu, ids, 0, "SmolLM2 fp16");
    expect_file_load_equals_cpu_upload(*base, gpu, 0, "SmolLM2 Q4_1 GGUF as fp16");
  }
  QuantizeOptions o;
  o.method = QuantMethod::Mixed24;
  o.mixed24.outlier_fraction = 0.003;
  auto m = quantized(*base, o, 4);
  int aligned = 0;
  for (const auto& [name, pw] : m->weights().packed) aligned += pw.format == FormatId::Mixed24A;
  EXPECT_EQ(aligned, 7 * m->config().n_layers);   // every linear in the aligned layout: the GPU kernel runs them all
  cuda::GpuModel gpu(m->weights());
  EXPECT_EQ(gpu.dequantized_linears(), 0);
  expect_file_load_equals_cpu_upload(*m, gpu, 0, "SmolLM2 mixed24a");
  expect_forward_matches(*m, gpu, ids, 0, "SmolLM2 mixed24a");   // 300 tokens: dequantize + cuBLAS
  expect_decode_matches(*m, gpu, ids, 20, 40, 0, "SmolLM2 mixed24a");   // the mixed24a GEMV with fused outliers
  expect_generation_near_greedy(*m, gpu, std::vector<int32_t>(ids.begin(), ids.begin() + 16), 0, "SmolLM2 mixed24a generation");
}

// SmolLM2 any-precision (the seed-3 -> 8 parent with 0.2% outliers): prefill logits (dequantize + cuBLAS) and
// batch-1 decode steps (the bitplane GEMV) against the CPU at widths 3, 4 and 8 of the same loaded file.
TEST(CudaModel, SmolLM2AnyPrecMatchesCpuAtWidths3To8) {
  SKIP_WITHOUT_GPU();
  const std::string gguf = test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(gguf, "SmolLM2 GGUF");
  LOWBIT_REQUIRE_FILE(default_calibration_file(), "C4 calibration sample");
  auto base = Model::load(gguf);
  QuantizeOptions o;
  o.method = QuantMethod::AnyPrec;
  o.anyprec.outlier_fraction = 0.002;
  auto ap = quantized(*base, o, 4);
  cuda::GpuModel gpu(ap->weights());
  EXPECT_EQ(gpu.dequantized_linears(), 0);
  const std::vector<int32_t> ids = some_ids(*ap, 200);
  for (const int b : {3, 4, 8}) {
    expect_forward_matches(*ap, gpu, ids, b, "SmolLM2 anyprec " + std::to_string(b) + "-bit");
    expect_decode_matches(*ap, gpu, ids, 16, 32, b, "SmolLM2 anyprec width " + std::to_string(b));
  }
}

// The CUDA backend as open_backend gives it (the GPU model loaded straight from the file) against the CPU backend on
// stories260K: perplexity within the budget; greedy generation (argmax on the device, CUDA-graph steps) teacher-forced
// against the CPU; temperature / top-k / top-p sampling on the GPU and the repetition-penalty path (CPU Sampler on
// downloaded logits) reproducible from their seed; the context stop; the CPU's width error; the load's statistics.
TEST(CudaModel, BackendFromFileMatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  const std::string bin = test::shared_path("models/stories260K/stories260K.bin");
  LOWBIT_REQUIRE_FILE(bin, "stories260K");
  const std::string text = test::tinystories_sample();
  LOWBIT_REQUIRE_FILE(text, "TinyStories sample");
  BackendOptions on_gpu, on_cpu;
  on_gpu.device = Device::Cuda;
  on_cpu.device = Device::Cpu;
  auto gpu = open_backend(bin, on_gpu);
  auto cpu = open_backend(bin, on_cpu);
  EXPECT_EQ(gpu->device_name().rfind("cuda: ", 0), 0u) << gpu->device_name();
  BackendOptions automatic;
  EXPECT_EQ(open_backend(bin, automatic)->device_name(), gpu->device_name()) << "auto takes the GPU for an fp32 model";
  auto model = Model::load(bin);
  const auto windows = make_windows_documents(test::tinystories_docs(*model), 512, nullptr);
  PplOptions po;
  po.ctx = 512;
  const PplResult g = perplexity(*gpu, windows, po), c = perplexity(*cpu, windows, po);
  std::printf("[ stories260K backends ] ppl cpu %.4f gpu %.4f\n", c.ppl, g.ppl);
  EXPECT_NEAR(g.ppl / c.ppl, 1.0, kPplBudget);
  EXPECT_EQ(g.predicted, c.predicted);
  po.reference_path = true;
  test::expect_error([&](const std::string&) { perplexity(*gpu, windows, po); }, "perplexity", "runs on the CPU");

  const std::vector<int32_t> prompt = gpu->tokenizer().encode("Once upon a time, there was a little girl", true, false);
  cuda::GpuModel& gm = dynamic_cast<cuda::CudaBackend&>(*gpu).model();
  expect_generation_near_greedy(*model, gm, prompt, 0, "stories260K backend greedy generation");
  SamplingParams sampled, penalised;
  sampled.temperature = 0.8f;
  sampled.top_k = 40;
  sampled.top_p = 0.9f;
  sampled.seed = 5;
  penalised.temperature = 0.7f;
  penalised.repetition_penalty = 1.3f;
  penalised.seed = 9;
  for (const SamplingParams& p : {sampled, penalised}) {
    GenerateOptions go;
    go.max_new_tokens = 32;
    go.stop_at_eos = false;
    go.sampling = p;
    const GenerateResult a = generate(*gpu, prompt, go), b = generate(*gpu, prompt, go);
    EXPECT_EQ(a.new_ids, b.new_ids) << "the same seed, the same tokens (penalty " << p.repetition_penalty << ")";
    EXPECT_EQ(a.new_ids.size(), 32u);
    for (int32_t t : a.new_ids) EXPECT_TRUE(t >= 0 && t < gpu->config().vocab_size) << t;
    go.sampling.seed += 1;
    EXPECT_NE(generate(*gpu, prompt, go).new_ids, a.new_ids) << "another seed, other tokens";
  }
  GenerateOptions go;
  go.max_new_tokens = 20;
  go.stop_at_eos = false;
  go.ctx = static_cast<int>(prompt.size()) + 5;
  const GenerateResult r = generate(*gpu, prompt, go);
  EXPECT_EQ(r.stop_reason, "context");
  EXPECT_EQ(r.new_ids.size(), 6u);
  test::expect_error([&](const std::string&) { gpu->check_bits(3); }, bin, "--bits 3 needs an any-precision model");
  const LoadStats st = gpu->load_stats();
  std::printf("[ stories260K backend ] load %.3f s, anonymous RSS %.1f -> peak %.1f MB, VmHWM %.1f MB\n", st.seconds,
              st.anon_rss_before_bytes / 1e6, st.peak_anon_rss_bytes / 1e6, st.vm_hwm_bytes / 1e6);
  EXPECT_GE(st.peak_anon_rss_bytes, st.anon_rss_before_bytes);
}

// Loading a model file onto the GPU keeps host memory to about one tensor's fp32 copy: the anonymous RSS the load
// adds (core/rss.h; file pages are page cache and are dropped after each upload) stays below the fp32 size of the
// whole model, which loading through the CPU Model needed, and below the largest tensor's fp32 copy + 1 GiB. SmolLM2 by default; LOWBIT_RSS_MODEL=<path> measures any
// model file instead (e.g. a 7B-shaped one from tools/make_random_hf_model.py), printing the figures.
TEST(CudaModel, LoadsAModelFileWithinOneTensorOfHostMemory) {
  SKIP_WITHOUT_GPU();
  const std::string path = knob_is_set(Knob::RssModel) ? knob_string(Knob::RssModel) : test::smollm2_gguf();
  LOWBIT_REQUIRE_FILE(path, "SmolLM2 GGUF (or LOWBIT_RSS_MODEL)");
  const WeightSet ws = read_weights(path);
  uint64_t params = 0, largest = 0;
  for (const auto& [name, t] : ws.tensors) {
    params += static_cast<uint64_t>(t.numel());
    largest = std::max<uint64_t>(largest, static_cast<uint64_t>(t.numel()) * 4);
  }
  BackendOptions on_gpu;
  on_gpu.device = Device::Cuda;
  auto gpu = open_backend(path, on_gpu);
  const LoadStats st = gpu->load_stats();
  const uint64_t added = st.peak_anon_rss_bytes - st.anon_rss_before_bytes;
  std::printf("[ %s ] %.2f B parameters (%.2f GB as fp32, largest tensor %.1f MB as fp32) on %s\n", path.c_str(),
              params / 1e9, params * 4 / 1e9, largest / 1e6, gpu->device_name().c_str());
  std::printf("[ %s ] load %.2f s; anonymous RSS %.1f MB before, peak %.1f MB (+%.1f MB); VmHWM %.1f MB\n",
              path.c_str(), st.seconds, st.anon_rss_before_bytes / 1e6, st.peak_anon_rss_bytes / 1e6, added / 1e6,
              st.vm_hwm_bytes / 1e6);
  EXPECT_LT(added, params * 4) << "the load held as much host memory as an fp32 copy of the whole model";
  // One tensor's fp32 scratch, plus what the CUDA libraries and the tokenizer take on the host.
  EXPECT_LT(added, largest + (1ull << 30)) << "more than the largest tensor's fp32 copy + 1 GiB";
}

}  // namespace
}  // namespace lowbit

#else
TEST(CudaModel, SkippedWithoutCudaToolkit) { GTEST_SKIP() << "GPU tests skipped: lowbit was built without CUDA"; }
#endif
