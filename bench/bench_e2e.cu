#include "bench/bench_e2e.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>

#include "backend_cuda/model/gpu_model.h"
#include "backend_cuda/ops/gpu_ops.h"
#include "backend_cuda/common/launch.cuh"
#include "backend_cuda/dispatch/packed.h"

namespace lowbit::cuda {

// The --weights values: user input, parsed once into the random model kind.
GpuModel::RandomKind random_kind(const std::string& name) {
  if (name == "fp16") return GpuModel::RandomKind::Fp16;
  if (parse_format_name(name) == FormatId::AnyPrec) return GpuModel::RandomKind::AnyPrec;
  if (parse_format_name(name) == FormatId::Mixed24A) return GpuModel::RandomKind::Mixed24a;
  if (name == "uniform-w4g128") return GpuModel::RandomKind::UniformW4G128;
  if (name == "uniform-w3g128") return GpuModel::RandomKind::UniformW3G128;
  if (name == "quik-w4a8") return GpuModel::RandomKind::QuikW4A8;
  if (name == "quik-w8a8") return GpuModel::RandomKind::QuikW8A8;
  if (name == "quik-w4fp8") return GpuModel::RandomKind::QuikW4Fp8;
  fail("bench --e2e: unknown weights '", name, "' (fp16, anyprec, mixed24a, uniform-w4g128, uniform-w3g128, quik-w4a8, quik-w8a8, quik-w4fp8)");
}

ModelConfig shape_config(const std::string& name) {
  ModelConfig c;
  c.name = name;
  c.max_seq_len = 4096;
  if (name == "llama2-7b") {
    c.dim = 4096, c.hidden_dim = 11008, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 32, c.vocab_size = 32000;
  } else if (name == "llama3-8b") {
    c.dim = 4096, c.hidden_dim = 14336, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 8, c.vocab_size = 128256;
    c.rope_theta = 500000.0f;
  } else if (name == "llama2-70b") {
    c.dim = 8192, c.hidden_dim = 28672, c.n_layers = 80, c.n_heads = 64, c.n_kv_heads = 8, c.vocab_size = 32000;
  } else {
    fail("bench --e2e: unknown shape '", name, "' (llama2-7b, llama3-8b, llama2-70b)");
  }
  c.head_dim = c.dim / c.n_heads;
  return c;
}

namespace {

// n prompt tokens of the timed runs (token i: (i * 104729 + 3) % vocab).
std::vector<int32_t> synthetic_tokens(size_t n, int vocab) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 104729 + 3) % static_cast<size_t>(vocab));
  return p;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

double time_prefill(GpuModel& m, int bits, int prefill) {
  const int V = m.config().vocab_size;
  std::vector<int32_t> toks(static_cast<size_t>(prefill));
  for (int i = 0; i < prefill; ++i) toks[static_cast<size_t>(i)] = (i * 7919 + 1) % V;
  GpuKVCache kv = m.new_cache(1, prefill);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    kv.len[0] = 0;
    m.synchronize();
    const double t0 = now_s();
    m.forward(toks.data(), 1, prefill, kv, false, bits);
    m.synchronize();
    if (rep > 0) best = std::min(best, now_s() - t0);   // rep 0 warms up (workspace, cuBLAS)
  }
  return prefill / best;
}

double time_decode(GpuModel& m, int bits, int prompt, int decode, int batch, double* kv_bytes) {
  LOWBIT_CHECK(decode >= 3, "decode timing needs at least 3 steps");
  GpuKVCache kv = m.new_cache(batch, prompt + decode + 1);
  const std::vector<int32_t> p = synthetic_tokens(static_cast<size_t>(batch * prompt), m.config().vocab_size);
  m.forward(p.data(), batch, prompt, kv, false, bits);
  m.greedy_from_last_logits(batch);
  m.decode_step_greedy(kv, bits, true);   // runs plainly and records the graph
  m.decode_step_greedy(kv, bits, true);
  m.synchronize();
  const int steps = decode - 2;
  const double t0 = now_s();
  for (int i = 0; i < steps; ++i) m.decode_step_greedy(kv, bits, true);
  m.synchronize();
  const double tok_s = steps * batch / (now_s() - t0);
  if (kv_bytes != nullptr) *kv_bytes = static_cast<double>(kv.bytes());
  return tok_s;
}

WidthSwitchTiming time_width_switch(GpuModel& m, const std::vector<int>& widths, int prompt, int steps_per_width) {
  const int W = static_cast<int>(widths.size());
  LOWBIT_CHECK(W >= 2 && steps_per_width >= 1, "width switch timing needs two widths or more");
  const int steps = W * steps_per_width;
  GpuKVCache kv = m.new_cache(1, prompt + W + 3 * steps + 1);
  const std::vector<int32_t> p = synthetic_tokens(static_cast<size_t>(prompt), m.config().vocab_size);
  m.forward(p.data(), 1, prompt, kv, false, widths[0]);
  m.greedy_from_last_logits(1);
  m.synchronize();
  WidthSwitchTiming t;
  // First use of each width on this cache: its step runs uncaptured, then its graph is captured.
  for (int b : widths) {
    const double t0 = now_s();
    m.decode_step_greedy(kv, b, true);
    m.synchronize();
    t.first_use_ms.push_back(1e3 * (now_s() - t0));
  }
  // Blocked (each width's steps in a row), alternating (the width changes every step), blocked again: the context
  // grows by the same steps in each pass, so the mean of the blocked passes faces the alternating one's context.
  auto pass = [&](bool alternate) {
    m.synchronize();
    const double t0 = now_s();
    for (int i = 0; i < steps; ++i) m.decode_step_greedy(kv, widths[static_cast<size_t>(alternate ? i % W : i / steps_per_width)], true);
    m.synchronize();
    return 1e6 * (now_s() - t0) / steps;
  };
  const double a = pass(false);
  const int captures = m.graph_captures();
  t.alternating_us = pass(true);
  t.captures_alternating = m.graph_captures() - captures;
  t.blocked_us = 0.5 * (a + pass(false));
  return t;
}

double device_copy_bandwidth() {
  const size_t bytes = 1ull << 30;
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  LOWBIT_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  cudaEvent_t e0, e1;
  LOWBIT_CUDA_CHECK(cudaEventCreate(&e0));
  LOWBIT_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int i = 0; i < 22; ++i) {
    LOWBIT_CUDA_CHECK(cudaEventRecord(e0));
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
    LOWBIT_CUDA_CHECK(cudaEventRecord(e1));
    LOWBIT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return 2.0 * static_cast<double>(bytes) / (t[t.size() / 2] * 1e-3);
}

void run_e2e_bench(const E2EBenchOptions& o, std::ostream& out) {
  for (const std::string& kind : o.kinds) random_kind(kind);   // refuse a bad list before any work
  LOWBIT_CHECK(o.decode >= 3 && o.prompt >= 1 && o.prefill >= 1, "bench --e2e: decode >= 3, prompt and prefill >= 1");
  char line[512];
  out << "device: " << device_name() << "\n";
  out << "random weights generated on the device; prefill = one forward of " << o.prefill
      << " tokens (batch 1, median of 3); decode = " << o.decode << " greedy steps after a " << o.prompt
      << "-token prompt, every step a CUDA-graph replay, tokens/s = steps x batch / time; 'no PDL': the same decode\n"
         "timed in the same run with every kernel launched without programmatic dependent launch (src/cuda/launch.cuh);\n"
         "'int8 tables toggled': at 2..4 bits and batch <= 8, the same decode timed in the same run with the int8 GEMV\n"
         "(GemvPath::TensorCoreInt8LutStream; 2/4/16 at batch 1..2 the integer-dot GEMV, GemvPath::Dp2aStream, at 3..4 the int8\n"
         "tensor-core GEMV, GemvPath::Int8MmaStream) switched\n"
         "the other way (off when the run has it on, the default; on under LOWBIT_INT8_TABLES=0); 'x max by own kernel': the same decode timed in the same run with the int8 GEMVs'\n"
         "activation kernels reducing each row's max |x| themselves instead of taking it from the RMSNorm / attention /\n"
         "SwiGLU kernels that produce x (LOWBIT_PRODUCER_XMAX=0); 'RoPE kernel kept': the same decode timed in the same run\n"
         "with RoPE and the KV store in their own kernel rather than inside attention (LOWBIT_FOLD_ROPE=0); 'SwiGLU kernel kept':\n"
         "the same decode timed in the same run with SwiGLU in its own kernel rather than in the gate/up GEMV's epilogue\n"
         "(LOWBIT_FOLD_SWIGLU=0); 'combine kernel kept': the same decode timed in the same run with attention's key splits\n"
         "merged by the combine kernel rather than inside attention's thread-block clusters (LOWBIT_CLUSTER_COMBINE=0); 'dequant+cuBLAS': packed weights above batch 8,\n"
         "the same decode timed in the same run with the fused GEMM off (LOWBIT_FUSED_GEMM=0: every linear dequantized\n"
         "to fp16, then cuBLAS); for fp16 weights where our dense GEMV runs (batch 1..2), the same decode with cuBLAS in place of our dense GEMV\n"
         "(LOWBIT_DENSE_GEMV=0); 'ungrouped 2/4/16 GEMVs': 2/4/16 at batch 1..4, the same decode timed in the same run with\n"
         "q / k / v and gate / up as separate GEMV launches instead of one each (LOWBIT_GROUP_GEMV=0)\n";
  const bool pdl = pdl_enabled();
  out << "'prefill tok/s, per-row attention': the same prefill timed in the same run with attention in the per-row\n"
         "CUDA-core kernel instead of the tensor-core kernel (LOWBIT_TC_ATTENTION=0); 'QUIK act. by each linear': QUIK\n"
         "weights, the same prefill with each linear quantizing its input itself instead of the RMSNorm / SwiGLU before it\n"
         "(LOWBIT_QUIK_PRODUCER_ACT=0); 'QUIK o act. inside attention': the same prefill (decode) with attention quantizing\n"
         "the o projection's input instead of the o projection itself (LOWBIT_QUIK_ATTENTION_ACT=1, -1)\n";
  out << "shape | weights | bits | weight GB on GPU | GB read per decode step | prefill tok/s | prefill tok/s, per-row attention"
         " | prefill tok/s, QUIK act. by each linear | prefill tok/s, QUIK o act. inside attention | decode batch | decode tok/s"
         " | decode tok/s, QUIK o act. inside attention"
         " | decode tok/s, no PDL | decode tok/s, int8 tables toggled | decode tok/s, x max by own kernel | decode tok/s, RoPE kernel kept | decode tok/s, SwiGLU kernel kept | decode tok/s, combine kernel kept | KV cache GB | decode tok/s, dequant+cuBLAS or cuBLAS GEMV | decode tok/s, ungrouped 2/4/16 GEMVs\n";
  for (const std::string& shape : o.shapes) {
    const ModelConfig c = shape_config(shape);
    for (const std::string& kind : o.kinds) {
      const GpuModel::RandomKind rk = random_kind(kind);
      const bool fp16 = rk == GpuModel::RandomKind::Fp16, anyprec = rk == GpuModel::RandomKind::AnyPrec,
                 mixed = rk == GpuModel::RandomKind::Mixed24a;
      const bool quik = rk == GpuModel::RandomKind::QuikW4A8 || rk == GpuModel::RandomKind::QuikW8A8 ||
                        rk == GpuModel::RandomKind::QuikW4Fp8;
      size_t free_b = 0, total_b = 0;
      LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      const double need = static_cast<double>(c.n_layers) * (4.0 * c.dim * c.dim + 3.0 * c.dim * c.hidden_dim) *
                              (fp16 ? 2.0 : anyprec ? 1.0 : mixed ? 0.4 : 1.1) + 4.0 * c.vocab_size * c.dim;
      if (need > 0.9 * static_cast<double>(free_b)) {
        std::snprintf(line, sizeof line, "%s | %s | - | %.1f needed | skipped: %.1f GB free\n", shape.c_str(), kind.c_str(),
                      need / 1e9, static_cast<double>(free_b) / 1e9);
        out << line << std::flush;
        continue;
      }
      GpuModel m(c, rk, 1234);
      const std::vector<int> widths = anyprec ? o.bits : std::vector<int>{0};
      for (int b : widths) {
        const double prefill_tok_s = time_prefill(m, b, o.prefill);
        // The same prefill with one run-time switch set to `value` (restored after), where `when` holds; "-" elsewhere.
        auto prefill_flipped = [&](bool when, bool (*get)(), void (*set)(bool)) -> std::string {
          if (!when) return "-";
          const bool was = get();
          set(!was);
          std::snprintf(line, sizeof line, "%.0f", time_prefill(m, b, o.prefill));
          set(was);
          return line;
        };
        const std::string per_row_attention =
            prefill_flipped(attention_on_tensor_cores(o.prefill, c.head_dim), tc_attention_enabled, set_tc_attention);
        const std::string act_by_linear = prefill_flipped(quik && quik_producer_act_enabled(),
                                                          quik_producer_act_enabled, set_quik_producer_act);
        // QUIK under the default attention mode (0: the o projection quantizes its own input): the prefill with attention
        // quantizing it (mode 1), and below the decode (mode -1).
        const bool attention_act = quik && quik_producer_act_enabled() && quik_attention_act_mode() == 0;
        const std::string o_act_in_attention = prefill_flipped(
            attention_act, [] { return quik_attention_act_mode() == 1; },
            [](bool all) { set_quik_attention_act_mode(all ? 1 : 0); });
        for (int batch : o.batches) {
          double kv_bytes = 0;
          const double decode_tok_s = time_decode(m, b, o.prompt, o.decode, batch, &kv_bytes);
          double plain_tok_s = decode_tok_s;   // without PDL (the same when the GPU has none)
          if (pdl) {
            set_pdl(false);
            plain_tok_s = time_decode(m, b, o.prompt, o.decode, batch, nullptr);
            set_pdl(true);
          }
          // The same decode timed with one run-time switch set to `value` (restored after), where `when` holds; "-" elsewhere.
          auto flipped = [&](bool when, bool (*get)(), void (*set)(bool), bool value) -> std::string {
            if (!when) return "-";
            const bool was = get();
            set(value);
            std::snprintf(line, sizeof line, "%.1f", time_decode(m, b, o.prompt, o.decode, batch, nullptr));
            set(was);
            return line;
          };
          // (2/4/16: the integer-dot GEMV at batch 1..2 and the int8 tensor-core GEMV at 3..kMixedMmaMaxBatch, under the same switch)
          const bool i8 = ((anyprec && b <= 4) || (mixed && batch <= kMixedMmaMaxBatch)) && batch <= kMaxGemvBatch;
          // the GEMVs with the int8 tables toggled
          const std::string int8_toggled = flipped(i8, int8_tables_enabled, set_int8_tables, !int8_tables_enabled());
          // the int8 GEMVs' activation kernels reducing max |x| themselves
          const bool given_max = i8 && int8_tables_enabled() && producer_xmax_enabled();
          const std::string own_max = flipped(given_max, producer_xmax_enabled, set_producer_xmax, false);
          // RoPE and the KV store in their own kernel; SwiGLU in its own kernel
          const std::string rope_kernel =
              flipped(batch <= 8 && fold_rope_enabled() && attention_folds_rope(batch, c.head_dim, true), fold_rope_enabled, set_fold_rope, false);
          const std::string swiglu_kernel =
              flipped(anyprec && given_max && b <= 3 && fold_swiglu_enabled(), fold_swiglu_enabled, set_fold_swiglu, false);
          // the key splits merged by the combine kernel, where the decode's attention splits
          const std::string combine_kernel =
              flipped(cluster_combine_enabled() && attention_combines_in_cluster(m.decode_splits(batch, o.prompt + o.decode + 1)),
                      cluster_combine_enabled, set_cluster_combine, false);
          // above batch 8 the large-batch path the fused GEMM replaced; fp16 at batch 1..2 cuBLAS in place of our GEMV
          // 2/4/16 at batch 1..4: q / k / v and gate / up as separate launches
          const std::string ungrouped = flipped(mixed && batch <= kMixedMmaMaxBatch && group_gemv_enabled() && int8_tables_enabled(),
                                                group_gemv_enabled, set_group_gemv, false);
          std::string dequant = flipped(!fp16 && batch > kMaxGemvBatch && fused_gemm_enabled(), fused_gemm_enabled, set_fused_gemm, false);
          if (fp16)
            dequant = flipped(pick_kernel({std::nullopt, c.dim, c.dim, batch, 0, true}, runtime_gpu()) == Kernel::DenseGemv, dense_gemv_enabled, set_dense_gemv, false);
          const std::string o_act_decode = flipped(
              attention_act && batch <= kQuikAttentionActRows, [] { return quik_attention_act_mode() != 0; },
              [](bool on) { set_quik_attention_act_mode(on ? -1 : 0); }, true);
          std::snprintf(line, sizeof line, "%s | %s | %s | %.2f | %.2f | %.0f | %s | %s | %s | %d | %.1f | %s | %.1f | %s | %s | %s | %s | %s | %.2f | %s | %s\n", shape.c_str(),
                        kind.c_str(), b == 0 ? "-" : std::to_string(b).c_str(), static_cast<double>(m.weight_bytes()) / 1e9,
                        static_cast<double>(m.weight_bytes_per_token(b)) / 1e9, prefill_tok_s, per_row_attention.c_str(),
                        act_by_linear.c_str(), o_act_in_attention.c_str(), batch, decode_tok_s, o_act_decode.c_str(),
                        plain_tok_s, int8_toggled.c_str(), own_max.c_str(), rope_kernel.c_str(), swiglu_kernel.c_str(), combine_kernel.c_str(), kv_bytes / 1e9, dequant.c_str(), ungrouped.c_str());
          out << line << std::flush;
        }
        // Where the time of a decode step goes: batch 1, 16 replays of the step's graph with an event node at the
        // start of every stage (the events add a little time of their own).
        {
          GpuKVCache kv = m.new_cache(1, o.prompt + o.decode + 1);   // as the timed decode: the same attention splits
          const std::vector<int32_t> p = synthetic_tokens(static_cast<size_t>(o.prompt), c.vocab_size);
          m.forward(p.data(), 1, o.prompt, kv, false, b);
          m.greedy_from_last_logits(1);
          m.enable_profile(true);
          m.decode_step_greedy(kv, b, true);   // runs the step, captures the profiled graph
          for (int i = 0; i < 16; ++i) m.decode_step_greedy(kv, b, true);
          const auto stages = m.take_profile();
          m.enable_profile(false);
          double total = 0;
          for (const auto& [name, ms] : stages) total += ms;
          out << "  decode step breakdown (batch 1, " << shape << " " << kind << (b ? " " + std::to_string(b) + "-bit" : "")
              << ", 16 graph replays, per step):";
          for (const auto& [name, ms] : stages) {
            std::snprintf(line, sizeof line, " %s %.1f us (%.0f%%);", name.c_str(), 1000.0 * ms / 16, 100.0 * ms / total);
            out << line;
          }
          out << "\n" << std::flush;
        }
      }
      if (widths.size() >= 2) {
        // Switching width between requests: every step at another width replays that width's cached graph.
        const int per_width = 32;
        const WidthSwitchTiming t = time_width_switch(m, widths, o.prompt, per_width);
        out << "  width switch (batch 1, " << shape << " anyprec, " << per_width << " steps per width and pass): first use on a"
            << " new cache (uncaptured step + graph capture)";
        for (size_t i = 0; i < widths.size(); ++i) {
          std::snprintf(line, sizeof line, " %d-bit %.2f ms;", widths[i], t.first_use_ms[i]);
          out << line;
        }
        std::snprintf(line, sizeof line,
                      " mean step %.1f us with the widths in blocks, %.1f us with the width changed every step (%+.1f us per"
                      " switch); graph captures while alternating: %d\n",
                      t.blocked_us, t.alternating_us, t.alternating_us - t.blocked_us, t.captures_alternating);
        out << line << std::flush;
      }
    }
  }
}

void run_speculative_timing(const E2EBenchOptions& o, std::ostream& out) {
  constexpr int kContext = 512, kMaxK = 8;
  char line[512];
  out << "device: " << device_name() << "\n";
  out << "speculative decoding on random any-precision weights, batch 1, after a " << kContext
      << "-token context: the draft's decode step (a CUDA-graph replay, as the speculative decoder's draft steps run), "
         "the target's verify forward of n tokens (uncaptured, as it runs; median of 20), and the speedup over the "
         "target's own decode step they model for acceptance rate a: max over k of E(a, k) x t_target / (k x t_draft + "
         "t_verify(k + 1)), E = (1 - a^(k+1)) / (1 - a) tokens per round\n";
  for (const std::string& shape : o.shapes) {
    const ModelConfig c = shape_config(shape);
    GpuModel m(c, GpuModel::RandomKind::AnyPrec, 1234);
    std::vector<double> step_ms(9, 0.0);
    std::vector<int> widths = o.bits;
    if (std::find(widths.begin(), widths.end(), o.spec_target) == widths.end()) widths.push_back(o.spec_target);
    for (int b : widths) step_ms[static_cast<size_t>(b)] = 1e3 / time_decode(m, b, kContext, 64, 1, nullptr);
    // The verify forward of n tokens at the target width, the cache cut back to the context after each.
    GpuKVCache kv = m.new_cache(1, kContext + kMaxK + 2);
    const std::vector<int32_t> p = synthetic_tokens(static_cast<size_t>(kContext + kMaxK + 1), c.vocab_size);
    m.forward(p.data(), 1, kContext, kv, false, o.spec_target);
    std::vector<double> verify_ms(kMaxK + 2, 0.0);
    for (int n = 1; n <= kMaxK + 1; ++n) {
      std::vector<double> t;
      for (int rep = 0; rep < 21; ++rep) {
        kv.len[0] = kContext;
        m.synchronize();
        const double t0 = now_s();
        m.forward(p.data() + kContext, 1, n, kv, true, o.spec_target);
        m.synchronize();
        if (rep > 0) t.push_back(1e3 * (now_s() - t0));
      }
      std::sort(t.begin(), t.end());
      verify_ms[static_cast<size_t>(n)] = t[t.size() / 2];
    }
    out << shape << ": decode step ms (graph, batch 1):";
    for (int b : widths) {
      std::snprintf(line, sizeof line, " %d-bit %.3f;", b, step_ms[static_cast<size_t>(b)]);
      out << line;
    }
    out << "\n" << shape << ": verify forward ms at " << o.spec_target << " bits, n tokens:";
    for (int n = 1; n <= kMaxK + 1; ++n) {
      std::snprintf(line, sizeof line, " n=%d %.3f;", n, verify_ms[static_cast<size_t>(n)]);
      out << line;
    }
    out << "\nshape | draft | target | acceptance | best k | tokens per round | modelled speedup over the target's decode\n";
    const double tt = step_ms[static_cast<size_t>(o.spec_target)];
    for (int d : o.bits) {
      if (d >= o.spec_target) continue;
      for (double a : {0.5, 0.6, 0.7, 0.8, 0.9}) {
        double best = 0, best_e = 0;
        int best_k = 1;
        for (int k = 1; k <= kMaxK; ++k) {
          const double e = (1.0 - std::pow(a, k + 1)) / (1.0 - a);
          const double sp = e * tt / (k * step_ms[static_cast<size_t>(d)] + verify_ms[static_cast<size_t>(k + 1)]);
          if (sp > best) best = sp, best_k = k, best_e = e;
        }
        std::snprintf(line, sizeof line, "%s | %d-bit | %d-bit | %.2f | %d | %.2f | %.2fx\n", shape.c_str(), d,
                      o.spec_target, a, best_k, best_e, best);
        out << line;
      }
    }
    out.flush();
  }
}

}  // namespace lowbit::cuda
