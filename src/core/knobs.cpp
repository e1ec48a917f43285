#include "core/knobs.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string_view>

#include "core/error.h"

namespace lowbit {
namespace {

// The PDL classes on by default (backend_cuda/common/common.h kPdlDefault: ops | xfrag | register tables | dense; common.cu asserts they agree).
constexpr const char* kPdlDefaultMask = "0x47";

constexpr KnobInfo kKnobs[] = {
    {Knob::SharedDir, "LOWBIT_SHARED_DIR", KnobType::String, "", "a folder",
     "the shared data folder (data/c4, data/wikitext-2-raw, models/stories260K); searched before ../shared"},
    {Knob::Cache, "LOWBIT_CACHE", KnobType::String, "", "a folder",
     "where scripts/setup.sh puts fetched models and the demo its quantized file (default ~/.cache/lowbit)"},
    {Knob::Int8Tables, "LOWBIT_INT8_TABLES", KnobType::Bool, "1", "0 | 1",
     "the int8 GEMVs: any-precision 2..4 bits on int8 tables and the 2/4/16 integer-dot / int8 tensor-core GEMVs"},
    {Knob::LutStream, "LOWBIT_LUT_STREAM", KnobType::Bool, "1", "0 | 1",
     "the streamed shared-table GEMV for any-precision 5..8 bits at batch 1..8"},
    {Knob::MixedMma, "LOWBIT_MIXED_MMA", KnobType::Bool, "1", "0 | 1",
     "the 2/4/16 int8 tensor-core GEMV at batch 3..4 (0: the fp16 tensor-core GEMV there)"},
    {Knob::FusedGemm, "LOWBIT_FUSED_GEMM", KnobType::Bool, "1", "0 | 1",
     "above batch 8, the fused packed GEMMs where they measured faster (0: dequantize + cuBLAS always)"},
    {Knob::DenseGemv, "LOWBIT_DENSE_GEMV", KnobType::Bool, "1", "0 | 1",
     "lowbit's fp16 GEMV for dense linears at batch 1..2 (0: cuBLAS everywhere)"},
    {Knob::QuikFused, "LOWBIT_QUIK_FUSED", KnobType::Int, "-1", "-1 | 0 | 1",
     "QUIK above batch 8 on compute capability 9.0: -1 the fused CUTLASS GEMM from 256 tokens, 0 never (cuBLAS + a "
     "separate epilogue), 1 always"},
    {Knob::QuikProducerAct, "LOWBIT_QUIK_PRODUCER_ACT", KnobType::Bool, "1", "0 | 1",
     "QUIK activations quantized by the RMSNorm / SwiGLU that produce them (one quantization per shared input) instead "
     "of by each linear"},
    {Knob::QuikAttentionAct, "LOWBIT_QUIK_ATTENTION_ACT", KnobType::Int, "0", "-1 | 0 | 1",
     "QUIK: the attention kernel quantizes the o projection's input (its last block per row group) instead of the o "
     "projection: 0 never (measured slower), -1 in decode steps (batch 1..8), 1 at every row count"},
    {Knob::QuikGemvChunk, "LOWBIT_QUIK_GEMV_CHUNK", KnobType::Int, "0", "0 | 16 | 32",
     "QUIK's integer-activation GEMV (W4A8, W8A8 at batch 1..8): codes per lane and step, 32 with four steps' loads "
     "issued ahead; 0 by the rule (32 at batch 1..2, 16 above)"},
    {Knob::GroupGemv, "LOWBIT_GROUP_GEMV", KnobType::Bool, "1", "0 | 1",
     "2/4/16 q/k/v and gate/up each in one GEMV launch where the int8 GEMVs run"},
    {Knob::FoldSwiglu, "LOWBIT_FOLD_SWIGLU", KnobType::Bool, "1", "0 | 1",
     "SwiGLU in the any-precision gate/up GEMV's epilogue (2..3 bits)"},
    {Knob::ProducerXmax, "LOWBIT_PRODUCER_XMAX", KnobType::Bool, "1", "0 | 1",
     "the kernels producing x (norms, attention, SwiGLU) hand the int8 GEMVs each row's max |x|"},
    {Knob::GemvBalance, "LOWBIT_GEMV_BALANCE", KnobType::Bool, "1", "0 | 1",
     "the any-precision int8 GEMV picks 4- or 8-warp CTAs at batch 1..2 by the busiest warp's work"},
    {Knob::I8Pack, "LOWBIT_I8_PACK", KnobType::Int, "-1", "-1 | 0 | 1",
     "the int8 GEMV sums both activation pieces in one mma: -1 by its rule, 0 never, 1 always at 2..3 bits"},
    {Knob::I8Stages, "LOWBIT_I8_STAGES", KnobType::Int, "0", "0 | 2 | 3",
     "the int8 GEMV's cp.async ring stages: 0 by its rule, 2 or 3 everywhere"},
    {Knob::LutStreamRingX, "LOWBIT_LUT_STREAM_RING_X", KnobType::Bool, "1", "0 | 1",
     "the streamed shared-table GEMV stages x through its ring at batch 1 (0: x from global memory)"},
    {Knob::FoldRope, "LOWBIT_FOLD_ROPE", KnobType::Bool, "1", "0 | 1",
     "RoPE and the KV-cache store folded into one kernel in the decode step"},
    {Knob::MixedStep, "LOWBIT_MIXED_STEP", KnobType::Bool, "0", "0 | 1",
     "continuous batching: decode rows of different any-precision widths in one forward (the mixed-width GEMV) "
     "instead of one forward per width"},
    {Knob::ClusterCombine, "LOWBIT_CLUSTER_COMBINE", KnobType::Bool, "1", "0 | 1",
     "split-key decode attention combines its partial results within a thread-block cluster"},
    {Knob::AttnSplits, "LOWBIT_ATTN_SPLITS", KnobType::Int, "0", "0 | n >= 1",
     "decode attention's key splits: 0 by the rule, n forced (at most one per 256 keys)"},
    {Knob::TcAttention, "LOWBIT_TC_ATTENTION", KnobType::Bool, "1", "0 | 1",
     "prefill attention (16+ tokens per sequence, head dim 64 or 128) on tensor cores instead of the per-row kernel"},
    {Knob::Pdl, "LOWBIT_PDL", KnobType::Bool, "1", "0 | 1",
     "programmatic dependent launch (compute capability 9.0+) for the kernel classes in LOWBIT_PDL_MASK"},
    {Knob::PdlMask, "LOWBIT_PDL_MASK", KnobType::Int, kPdlDefaultMask, "a bit mask",
     "which kernel classes launch with PDL (backend_cuda/common/common.h PdlClass)"},
    {Knob::SourceDir, "LOWBIT_SOURCE_DIR", KnobType::String, "", "a folder",
     "tests: the repository root (fixtures), when the test binary runs outside the build tree"},
    {Knob::TokenizerJsonOut, "LOWBIT_TOKENIZER_JSON_OUT", KnobType::String, "", "a folder",
     "tests: keep the tokenizer.json files the writer test produces in this folder"},
    {Knob::RssModel, "LOWBIT_RSS_MODEL", KnobType::String, "", "a model path",
     "GPU tests: the model file whose load onto the GPU the host-memory test measures (default SmolLM2)"},
    {Knob::DemoCalib, "LOWBIT_DEMO_CALIB", KnobType::Int, "4", "n >= 1",
     "scripts/demo.sh: calibration windows of 512 tokens for the demo's Fisher pass (the paper uses 100)"},
    {Knob::BuildDir, "LOWBIT_BUILD_DIR", KnobType::String, "", "a folder",
     "scripts/demo.sh: use the lowbit binary already built there (no set-up, no build)"},
};
static_assert(std::size(kKnobs) == static_cast<size_t>(Knob::BuildDir) + 1, "one row per Knob");

constexpr bool rows_in_order() {
  for (size_t i = 0; i < std::size(kKnobs); ++i)
    if (static_cast<size_t>(kKnobs[i].id) != i) return false;
  return true;
}
static_assert(rows_in_order(), "kKnobs rows must follow the Knob enum's order");

std::optional<int64_t> parse_value(const KnobInfo& k, const char* s) {
  if (s == nullptr) return std::nullopt;
  const std::string_view v(s);
  if (k.type == KnobType::Bool) {
    if (v == "1") return 1;
    if (v == "0") return 0;
    return std::nullopt;
  }
  char* end = nullptr;
  const long long x = std::strtoll(s, &end, 0);
  if (end == s || *end != '\0') return std::nullopt;
  return x;
}

struct State {
  std::once_flag read;
  int64_t env_value = 0;
  bool env_set = false;
  std::optional<int64_t> overridden;
};
std::array<State, std::size(kKnobs)>& states() {
  static std::array<State, std::size(kKnobs)> s;
  return s;
}

State& state(Knob k) {
  const KnobInfo& info = knob_info(k);
  State& st = states()[static_cast<size_t>(k)];
  std::call_once(st.read, [&] {
    const char* raw = std::getenv(info.name);
    const std::optional<int64_t> v = parse_value(info, raw);
    st.env_set = v.has_value();
    st.env_value = v ? *v : *parse_value(info, info.default_value);
    if (raw != nullptr && !v)
      std::fprintf(stderr, "lowbit: ignoring %s=%s (accepts %s; default %s)\n", info.name, raw, info.values,
                   info.default_value);
  });
  return st;
}

int64_t numeric(Knob k) {
  LOWBIT_CHECK(knob_info(k).type != KnobType::String, knob_info(k).name, " is a string knob");
  State& st = state(k);
  return st.overridden ? *st.overridden : st.env_value;
}

}  // namespace

std::span<const KnobInfo> knob_table() { return kKnobs; }

const KnobInfo& knob_info(Knob k) {
  const auto i = static_cast<size_t>(k);
  LOWBIT_CHECK(i < std::size(kKnobs), "invalid knob id ", i);
  return kKnobs[i];
}

bool knob_bool(Knob k) { return numeric(k) != 0; }
int64_t knob_int(Knob k) { return numeric(k); }

std::string knob_string(Knob k) {
  const KnobInfo& info = knob_info(k);
  LOWBIT_CHECK(info.type == KnobType::String, info.name, " is not a string knob");
  const char* v = std::getenv(info.name);
  return v != nullptr ? v : "";
}

bool knob_is_set(Knob k) {
  if (knob_info(k).type == KnobType::String) return !knob_string(k).empty();
  const State& st = state(k);
  return st.env_set || st.overridden.has_value();
}

void set_knob(Knob k, int64_t value) {
  LOWBIT_CHECK(knob_info(k).type != KnobType::String, knob_info(k).name, " is a string knob");
  state(k).overridden = value;
}

void reset_knob(Knob k) { state(k).overridden.reset(); }

std::string knobs_markdown() {
  std::string out =
      "# Environment variables\n\n"
      "Every `LOWBIT_*` variable lowbit reads, generated from the registry in `src/core/knobs.cpp` (a test fails when\n"
      "this file and the registry differ, when code reads a variable outside the registry, or when no code reads a\n"
      "registered one). The tuning switches exist for measurements: their defaults are what the benchmarks measured\n"
      "fastest (docs/PERF.md). Each is read once, on first use.\n\n"
      "| variable | type | default | values | purpose |\n|---|---|---|---|---|\n";
  for (const KnobInfo& k : kKnobs) {
    const char* type = k.type == KnobType::Bool ? "switch" : k.type == KnobType::Int ? "integer" : "path";
    const std::string dflt = *k.default_value != '\0' ? std::string("`") + k.default_value + "`" : "(unset)";
    std::string values;   // "0 | 1" inside a table cell: the bars escaped
    for (const char* c = k.values; *c != '\0'; ++c) values += *c == '|' ? std::string("\\|") : std::string(1, *c);
    out += std::string("| `") + k.name + "` | " + type + " | " + dflt + " | " + values + " | " + k.purpose + " |\n";
  }
  return out;
}

}  // namespace lowbit
