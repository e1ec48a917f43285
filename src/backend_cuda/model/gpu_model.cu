#include "backend_cuda/model/gpu_model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <set>

#include "backend_cuda/ops/gpu_ops.h"
#include "formats/format_table.h"
#include "formats/mixed24/layout.h"
#include "model/weight_convert.h"
#include "core/knobs.h"

namespace lowbit::cuda {
namespace {

constexpr int kMinKeysPerSplit = 32;   // attention: one warp's chunk of keys, the least worth a block of its own
constexpr int kKeysPerBlockShort = 256; // below this many keys a split, the splits stop at one block per SM (below)
constexpr int kMaxSplits = 32;
// Split the keys (flash-decoding) only when the (row, head) blocks alone cannot fill the GPU twice over (decode):
// as many splits as take the grid to two blocks per SM, each split keeping at least kMinKeysPerSplit keys. Short
// spans stop earlier, at one block per SM or kKeysPerBlockShort keys a split, whichever allows more: there the step is
// a chain of latencies, and each split adds blocks to merge (H200, Llama-2-7B 3-bit, 385-key cache, splits forced:
// batch 1 with 4 splits 528.5 / 516.0 tok/s against 520.0 / 504.2 with the 9 of the grid and key rules alone, 16
// splits 494.8; batch 8 with 1 split 2,835.1 against 2,710.9 with 2). Long spans follow the grid and key rules alone
// (their keys are worth the bandwidth of many blocks).
int splits_for(int span, int rows, int heads, int sms) {
  const int64_t blocks = static_cast<int64_t>(rows) * heads, want = 2LL * sms;
  if (blocks >= want) return 1;
  const int by_grid = static_cast<int>((want + blocks - 1) / blocks);
  const int by_keys = (span + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  const int short_cap = static_cast<int>(std::max<int64_t>(sms / blocks, span / kKeysPerBlockShort));
  return std::clamp(std::min({by_grid, by_keys, short_cap}), 1, kMaxSplits);
}

// What a captured decode graph baked in besides its shapes and buffers: the PDL launch classes and which paths run the
// linears (packed.h: fused_gemm_enabled,
// dense_gemv_enabled, int8_tables_enabled, producer_xmax_enabled; gpu_ops.h:
// fold_rope_enabled, cluster_combine_enabled; packed.h: fold_swiglu_enabled, group_gemv_enabled, gemv_balance_enabled, i8_pack_mode;
// quik.h: quik_producer_act_enabled, quik_attention_act_mode).
unsigned graph_launch_key() {
  return pdl_launch_classes() | (fused_gemm_enabled() ? 0u : 0x20000u) |
         (dense_gemv_enabled() ? 0u : 0x40000u) | (int8_tables_enabled() ? 0u : 0x80000u) |
         (producer_xmax_enabled() ? 0u : 0x100000u) | (fold_rope_enabled() ? 0u : 0x200000u) |
         (fold_swiglu_enabled() ? 0u : 0x400000u) | (cluster_combine_enabled() ? 0u : 0x800000u) |
         (group_gemv_enabled() ? 0u : 0x1000000u) | (gemv_balance_enabled() ? 0u : 0x2000000u) |
         (static_cast<unsigned>(i8_pack_mode() + 1) << 26) | (quik_producer_act_enabled() ? 0u : 0x10000000u) |
         (static_cast<unsigned>(quik_attention_act_mode() + 1) << 29);
}

// Drops the pages holding [p, p + n) from the process's resident set when they lie in one of ws's file mappings:
// they were read once to upload a tensor and stay in the page cache, and a later read maps them in again from there
// (the mappings are read-only and private: no page of them was ever written). Buffers the reader owns (ws.owned) are
// anonymous memory and are left alone. Advice only: where it fails, the pages simply stay resident.
void release_file_pages(const WeightSet& ws, const uint8_t* p, uint64_t n) {
  if (p == nullptr || n == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + n;
  for (const auto& f : ws.files) {
    if (f->data() == nullptr) continue;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(f->data()), hi = lo + f->size();
    if (a < lo || b > hi) continue;
    const uintptr_t begin = a & ~(page - 1);   // >= lo: a mapping starts on a page boundary
    const uintptr_t end = (b + page - 1) & ~(page - 1);   // within the mapping's last page
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    return;
  }
}

// The weights a packed weight encodes, [n, k] fp32, for a format the GPU runs as an fp16 copy (GpuSupport::Dequantized).
void dequantize_packed(const PackedWeight& w, const std::string& where, float* out) {
  switch (w.format) {
    case FormatId::Mixed24: unpack_mixed24(w, where).dequantize(out); return;
    case FormatId::Uniform:
    case FormatId::AnyPrec:
    case FormatId::Mixed24A:
    case FormatId::Quik: break;
  }
  fail(where, ": ", format_name(w.format), " has no fp16 decoder for the GPU");
}

}  // namespace

// Stage timing: an event at the start of every stage (mark()) and one at the end of the step. Uncaptured forwards
// record fresh events, read and destroyed by accumulate(); a profiled decode graph holds its events as event-record
// nodes, re-timed by every replay (the events live as long as that graph).
struct GpuModel::StageTimer {
  std::vector<std::pair<std::string, cudaEvent_t>> marks;   // the stage that starts at each event
  std::vector<std::pair<std::string, double>> total_ms;       // in first-seen order
  bool paused = false;                                         // marks off (the step run before a capture)
  cudaGraphExec_t graph = nullptr;                             // the profiled decode step
  int graph_seqs = -1, graph_bits = -1;
  bool graph_mixed = false;
  uint64_t graph_cache = 0;   // GpuKVCache::id
  uint64_t graph_gemm_gen = 0;
  unsigned graph_pdl = 0;

  ~StageTimer() {
    if (graph != nullptr) cudaGraphExecDestroy(graph);
    for (auto& [name, ev] : marks) cudaEventDestroy(ev);
  }
  // Adds the time between consecutive marks of the last step(s) to total_ms ("end" closes a step).
  void accumulate(cudaStream_t s, bool destroy) {
    if (marks.empty()) return;
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i + 1 < marks.size(); ++i) {
      if (marks[i].first == "end") continue;   // host time between two uncaptured steps: not part of a step
      float ms = 0;
      LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i].second, marks[i + 1].second));
      auto it = std::find_if(total_ms.begin(), total_ms.end(), [&](const auto& p) { return p.first == marks[i].first; });
      if (it == total_ms.end()) total_ms.emplace_back(marks[i].first, ms);
      else it->second += ms;
    }
    if (destroy) {
      for (auto& [name, ev] : marks) cudaEventDestroy(ev);
      marks.clear();
    }
  }
};

void GpuModel::enable_profile(bool on) {
  if (on && !prof_) prof_ = std::make_unique<StageTimer>();
  if (!on && prof_) {
    synchronize();
    prof_.reset();
  }
}

std::vector<std::pair<std::string, double>> GpuModel::take_profile() {
  if (!prof_) return {};
  if (prof_->graph == nullptr) prof_->accumulate(stream_, true);
  auto r = std::move(prof_->total_ms);
  prof_->total_ms.clear();
  return r;
}

void GpuModel::mark(const char* stage) {
  if (!prof_ || prof_->paused) return;
  cudaEvent_t e;
  LOWBIT_CUDA_CHECK(cudaEventCreate(&e));
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  LOWBIT_CUDA_CHECK(cudaStreamIsCapturing(stream_, &cs));
  // Inside a capture a plain record is only a dependency marker; External makes it an event-record node of the
  // graph, recorded (and timed) by every replay.
  LOWBIT_CUDA_CHECK(cs == cudaStreamCaptureStatusActive ? cudaEventRecordWithFlags(e, stream_, cudaEventRecordExternal)
                                                        : cudaEventRecord(e, stream_));
  prof_->marks.emplace_back(stage, e);
}

uint64_t GpuLinear::bytes_read(int bits) const {
  if (packed) return packed->bytes_read(bits == 0 && packed->served_widths() != 0 ? 31 - __builtin_clz(packed->served_widths()) : bits);
  return static_cast<uint64_t>(n * k) * 2 + bias.bytes();
}

void GpuModel::init_common() {
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<GemmContext>(stream_);
  sms_ = device_sm_count();
  xmax_ = DeviceBuffer<float>(3 * kMaxGemvBatch);
}

GpuModel::~GpuModel() {
  invalidate_graph();
  gemm_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

GpuModel::GpuModel(const WeightSet& ws, const std::function<void()>& after_tensor) : c_(ws.config) {
  load(ws, nullptr, after_tensor);
}

GpuModel::GpuModel(const Model& cpu) : c_(cpu.config()) { load(cpu.weights(), &cpu, {}); }

void GpuModel::load(const WeightSet& ws, const Model* cpu, const std::function<void()>& after_tensor) {
  c_.validate(ws.path);
  init_common();
  const int64_t dim = c_.dim, hid = c_.hidden_dim, qd = c_.q_dim(), kvd = c_.kv_dim(), V = c_.vocab_size;
  std::vector<float> scratch;   // one tensor's fp32 at a time (its capacity grows to the largest)
  std::set<std::string> used;
  // A dense tensor's fp32 values, its shape checked: the CPU model's, or converted from the file into scratch.
  auto values = [&](const std::string& name, const std::vector<int64_t>& shape, bool qk_rows) -> const float* {
    used.insert(name);
    return cpu != nullptr ? cpu->tensor_f32(name) : tensor_as_f32(ws, name, shape, qk_rows, scratch);
  };
  // Called once a tensor is on the device (cudaMemcpy from pageable memory returns once the host bytes are staged, so
  // scratch and the file pages may be reused from here on).
  auto uploaded = [&](const std::vector<const TensorView*>& views) {
    if (after_tensor) after_tensor();
    if (cpu == nullptr)
      for (const TensorView* t : views) release_file_pages(ws, t->data, t->nbytes);
  };
  auto uploaded_tensor = [&](const std::string& name) {
    const auto it = ws.tensors.find(name);
    uploaded(it != ws.tensors.end() ? std::vector<const TensorView*>{&it->second} : std::vector<const TensorView*>{});
  };
  auto numel = [](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  };
  // fp32 on the host -> fp16 on the device (converted there). Uploads are cudaMemcpy from pageable memory on the
  // legacy stream, which may return before the DMA lands, and stream_ is non-blocking: the device is synchronised
  // before stream_ reads an upload.
  auto upload_f16 = [&](const float* host, int64_t count) -> const __half* {
    DeviceBuffer<float> tmp(host, static_cast<size_t>(count));
    dense_.emplace_back(static_cast<size_t>(count));
    LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
    f32_to_f16(tmp.get(), dense_.back().get(), count, stream_);
    synchronize();
    return dense_.back().get();
  };
  auto f16 = [&](const std::string& name, const std::vector<int64_t>& shape, bool qk_rows) -> const __half* {
    const __half* d = upload_f16(values(name, shape, qk_rows), numel(shape));
    uploaded_tensor(name);
    return d;
  };
  auto f32 = [&](const std::string& name, const std::vector<int64_t>& shape, bool qk_rows) {
    DeviceBuffer<float> b(values(name, shape, qk_rows), static_cast<size_t>(numel(shape)));
    uploaded_tensor(name);
    return b;
  };
  bool first_packed = true;
  auto linear = [&](GpuLinear& l, const std::string& name, int64_t n, int64_t k, bool qk_rows, const std::string& bias) {
    l.n = n;
    l.k = k;
    const PackedWeight* pw = find_packed_linear(ws, name, n, k, qk_rows);
    if (pw == nullptr) {
      l.dense = f16(name, {n, k}, qk_rows);
    } else {
      const std::string where = ws.path + ": " + name;
      switch (packed_format(pw->format).gpu) {
        case GpuSupport::None:
          fail(where, " is stored as ", format_name(pw->format), ", which has no GPU kernels yet (run it on the CPU)");
        case GpuSupport::Dequantized:
          // No kernel over this format's bytes yet: an fp16 copy of exactly the weights it encodes.
          scratch.resize(static_cast<size_t>(n * k));
          dequantize_packed(*pw, where, scratch.data());
          l.dense = upload_f16(scratch.data(), n * k);
          ++dequantized_linears_;
          break;
        case GpuSupport::Packed: {
          try {
            l.packed = std::make_unique<DevicePackedWeight>(*pw);
          } catch (const Error& e) {
            fail(where, ": ", e.what());
          }
          const uint32_t w = l.packed->served_widths();
          if (w != 0) widths_ = first_packed ? w : (widths_ & w);
          first_packed = false;
          break;
        }
      }
      std::vector<const TensorView*> parts;
      for (const auto& [part, view] : pw->parts) parts.push_back(&view);
      uploaded(parts);
    }
    if (!bias.empty()) l.bias = f32(bias, {n}, qk_rows);
  };
  emb_ = f16("model.embed_tokens.weight", {V, dim}, false);
  layers_.resize(static_cast<size_t>(c_.n_layers));
  for (int i = 0; i < c_.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& L = layers_[static_cast<size_t>(i)];
    L.attn_norm = f32(p + "input_layernorm.weight", {dim}, false);
    L.ffn_norm = f32(p + "post_attention_layernorm.weight", {dim}, false);
    linear(L.q, p + "self_attn.q_proj.weight", qd, dim, true, c_.qkv_bias ? p + "self_attn.q_proj.bias" : "");
    linear(L.k, p + "self_attn.k_proj.weight", kvd, dim, true, c_.qkv_bias ? p + "self_attn.k_proj.bias" : "");
    linear(L.v, p + "self_attn.v_proj.weight", kvd, dim, false, c_.qkv_bias ? p + "self_attn.v_proj.bias" : "");
    linear(L.o, p + "self_attn.o_proj.weight", dim, qd, false, "");
    linear(L.gate, p + "mlp.gate_proj.weight", hid, dim, false, "");
    linear(L.up, p + "mlp.up_proj.weight", hid, dim, false, "");
    linear(L.down, p + "mlp.down_proj.weight", dim, hid, false, "");
  }
  final_norm_ = f32("model.norm.weight", {dim}, false);
  head_.n = V;
  head_.k = dim;
  head_.dense = c_.tie_embeddings ? emb_ : f16("lm_head.weight", {V, dim}, false);
  check_no_unexpected_tensors(ws, [&](const std::string& name) { return used.count(name) != 0; });
  scratch = std::vector<float>();
  fuse_linears();
  note_dense_layers();
  if (cpu != nullptr) {
    const size_t rope_n = static_cast<size_t>(c_.max_seq_len) * (c_.head_dim / 2);
    rope_cos_ = DeviceBuffer<float>(cpu->rope_cos(), rope_n);
    rope_sin_ = DeviceBuffer<float>(cpu->rope_sin(), rope_n);
  } else {
    const RopeTables rope = rope_tables(c_);
    rope_cos_ = DeviceBuffer<float>(rope.cos);
    rope_sin_ = DeviceBuffer<float>(rope.sin);
  }
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());
}

GpuModel::GpuModel(const ModelConfig& c, RandomKind kind, uint64_t seed) : c_(c) {
  init_common();
  const int64_t dim = c_.dim, hid = c_.hidden_dim, qd = c_.q_dim(), kvd = c_.kv_dim(), V = c_.vocab_size;
  uint64_t sd = seed;
  auto f16 = [&](int64_t count, float scale) -> const __half* {
    dense_.emplace_back(static_cast<size_t>(count));
    fill_random_half(dense_.back().get(), count, ++sd, -scale, scale, stream_);
    return dense_.back().get();
  };
  auto ones = [&](int64_t count) {
    DeviceBuffer<float> b(static_cast<size_t>(count));
    fill_random_float(b.get(), count, ++sd, 0.9f, 1.1f, stream_);
    return b;
  };
  auto linear = [&](GpuLinear& l, int64_t n, int64_t k) {
    l.n = n;
    l.k = k;
    if (kind == RandomKind::AnyPrec) l.packed = std::make_unique<DevicePackedWeight>(DevicePackedWeight::random_anyprec(n, k, ++sd));
    else if (kind == RandomKind::Mixed24a) l.packed = std::make_unique<DevicePackedWeight>(DevicePackedWeight::random_mixed24a(n, k, 0.0035, ++sd));
    else if (kind == RandomKind::UniformW4G128 || kind == RandomKind::UniformW3G128)
      l.packed = std::make_unique<DevicePackedWeight>(
          DevicePackedWeight::random_uniform(n, k, kind == RandomKind::UniformW4G128 ? 4 : 3, 128, ++sd));
    else if (kind == RandomKind::QuikW4A8 || kind == RandomKind::QuikW8A8 || kind == RandomKind::QuikW4Fp8)
      l.packed = std::make_unique<DevicePackedWeight>(
          DevicePackedWeight::random_quik(n, k, kind == RandomKind::QuikW8A8 ? 8 : 4, k / 16, ++sd, 8,
                                          kind == RandomKind::QuikW4Fp8));
    else l.dense = f16(n * k, 1.0f / std::sqrt(static_cast<float>(k)));
  };
  emb_ = f16(V * dim, 1.0f);
  layers_.resize(static_cast<size_t>(c_.n_layers));
  for (Layer& L : layers_) {
    L.attn_norm = ones(dim);
    L.ffn_norm = ones(dim);
    linear(L.q, qd, dim);
    linear(L.k, kvd, dim);
    linear(L.v, kvd, dim);
    linear(L.o, dim, qd);
    linear(L.gate, hid, dim);
    linear(L.up, hid, dim);
    linear(L.down, dim, hid);
  }
  widths_ = kind == RandomKind::AnyPrec ? 0x1FCu : 0u;
  fuse_linears();
  note_dense_layers();
  final_norm_ = ones(dim);
  head_.n = V;
  head_.k = dim;
  head_.dense = c_.tie_embeddings ? emb_ : f16(V * dim, 1.0f / std::sqrt(static_cast<float>(dim)));
  const int half = c_.head_dim / 2;
  std::vector<float> cs(static_cast<size_t>(c_.max_seq_len) * half), sn(cs.size());
  for (int p = 0; p < c_.max_seq_len; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = p * std::pow(static_cast<double>(c_.rope_theta), -2.0 * i / c_.head_dim);
      cs[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(a));
      sn[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
  rope_cos_ = DeviceBuffer<float>(cs);
  rope_sin_ = DeviceBuffer<float>(sn);
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());   // the packed weights were filled on the legacy stream
}

std::vector<const GpuLinear*> GpuModel::linears(const Layer& L) {
  std::vector<const GpuLinear*> out;
  for (const GpuLinear* l : {&L.q, &L.k, &L.v, &L.qkv, &L.o, &L.gate, &L.up, &L.gate_up, &L.down})
    if (l->n > 0 && (l->packed || l->dense != nullptr)) out.push_back(l);   // stacked parts hold no weights
  return out;
}

void GpuModel::fuse_linears() {
  auto release_dense = [&](const __half* p) {
    dense_.erase(std::remove_if(dense_.begin(), dense_.end(), [&](const DeviceBuffer<__half>& d) { return d.get() == p; }),
                 dense_.end());
  };
  auto fuse = [&](GpuLinear& out, std::initializer_list<GpuLinear*> parts) {
    int64_t N = 0;
    bool dense = true, packed = true, bias = false;
    for (const GpuLinear* p : parts) {
      N += p->n;
      dense = dense && p->dense != nullptr && !p->packed;
      packed = packed && p->packed != nullptr;
      bias = bias || p->bias.size() > 0;
    }
    const int64_t k = (*parts.begin())->k;
    if (dense) {
      DeviceBuffer<__half> w(static_cast<size_t>(N * k));
      int64_t row = 0;
      for (GpuLinear* p : parts) {
        LOWBIT_CUDA_CHECK(cudaMemcpy(w.get() + row * k, p->dense, static_cast<size_t>(p->n * k) * sizeof(__half),
                                     cudaMemcpyDeviceToDevice));
        row += p->n;
      }
      out.dense = w.get();
      dense_.push_back(std::move(w));
      for (GpuLinear* p : parts) {
        release_dense(p->dense);
        p->dense = nullptr;
      }
    } else if (packed) {
      std::vector<const DevicePackedWeight*> ws;
      for (const GpuLinear* p : parts) ws.push_back(p->packed.get());
      out.packed = DevicePackedWeight::concat_rows(ws);
      if (!out.packed) return;
      for (GpuLinear* p : parts) p->packed.reset();
    } else {
      return;
    }
    if (bias) {   // missing biases are zeros
      out.bias = DeviceBuffer<float>(static_cast<size_t>(N));
      LOWBIT_CUDA_CHECK(cudaMemset(out.bias.get(), 0, out.bias.bytes()));
      int64_t row = 0;
      for (GpuLinear* p : parts) {
        if (p->bias.size() > 0)
          LOWBIT_CUDA_CHECK(cudaMemcpy(out.bias.get() + row, p->bias.get(), p->bias.bytes(), cudaMemcpyDeviceToDevice));
        p->bias = DeviceBuffer<float>();
        row += p->n;
      }
    }
    out.n = N;
    out.k = k;
    for (GpuLinear* p : parts) p->n = 0;   // the parts hold no weights any more (run_linear must not see them)
  };
  LOWBIT_CUDA_CHECK(cudaDeviceSynchronize());   // the parts were written on other streams
  for (Layer& L : layers_) {
    fuse(L.qkv, {&L.q, &L.k, &L.v});
    fuse(L.gate_up, {&L.gate, &L.up});
  }
}

void GpuModel::note_dense_layers() {
  dense_layers_ = false;
  for (const Layer& L : layers_) {
    const bool fused_qkv = L.qkv.n > 0, fused_gu = L.gate_up.n > 0;
    for (const GpuLinear* l : {fused_qkv ? &L.qkv : &L.q, fused_qkv ? &L.qkv : &L.k, fused_qkv ? &L.qkv : &L.v,
                               fused_gu ? &L.gate_up : &L.gate, fused_gu ? &L.gate_up : &L.up})
      dense_layers_ = dense_layers_ || !l->packed;
  }
}

std::vector<int> GpuModel::widths() const {
  std::vector<int> w;
  for (int b = 2; b <= 8; ++b)
    if ((widths_ >> b) & 1u) w.push_back(b);
  return w;
}

void GpuModel::check_bits(int bits) const {
  if (bits == 0) return;
  LOWBIT_CHECK(widths_ != 0, "--bits ", bits, ": this model is not any-precision (it has one width)");
  LOWBIT_CHECK(bits >= 2 && bits <= 8 && ((widths_ >> bits) & 1u), "--bits ", bits, " is not served by this model");
}

uint64_t GpuModel::weight_bytes() const {
  uint64_t b = final_norm_.bytes() + rope_cos_.bytes() + rope_sin_.bytes();
  for (const auto& d : dense_) b += d.bytes();
  for (const Layer& L : layers_) {
    b += L.attn_norm.bytes() + L.ffn_norm.bytes();
    for (const GpuLinear* l : linears(L)) b += (l->packed ? l->packed->bytes() : 0) + l->bias.bytes();
  }
  return b;
}

uint64_t GpuModel::weight_bytes_per_token(int bits) const {
  uint64_t b = head_.bytes_read(0);
  for (const Layer& L : layers_)
    for (const GpuLinear* l : linears(L)) b += l->bytes_read(bits);
  return b;
}

namespace {
uint64_t next_cache_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}
}  // namespace

GpuKVCache GpuModel::cache_of_blocks(int seqs, int capacity, int blocks, int block) const {
  LOWBIT_CHECK(capacity <= c_.max_seq_len, "KV cache: ", capacity, " positions exceed the model context of ", c_.max_seq_len);
  LOWBIT_CHECK(static_cast<int64_t>(blocks) * c_.n_layers * block < (int64_t{1} << 31), "KV cache: ", blocks,
               " blocks of ", block, " positions exceed the attention kernels' 2^31 cache rows");
  GpuKVCache kv;
  kv.id = next_cache_id();
  kv.seqs = seqs;
  kv.layers = c_.n_layers;
  kv.capacity = capacity;
  kv.kv_dim = c_.kv_dim();
  kv.block = block;
  kv.blocks = blocks;
  const size_t n = static_cast<size_t>(blocks) * c_.n_layers * block * c_.kv_dim();
  kv.k = DeviceBuffer<__half>(n);
  kv.v = DeviceBuffer<__half>(n);
  kv.len.assign(static_cast<size_t>(seqs), 0);
  return kv;
}

GpuKVCache GpuModel::new_cache(int seqs, int capacity) const {
  LOWBIT_CHECK(seqs >= 1 && capacity >= 1, "KV cache: ", seqs, " sequences of ", capacity, " positions");
  return cache_of_blocks(seqs, capacity, seqs, capacity);   // one block of the whole capacity per sequence
}

GpuKVCache GpuModel::new_paged_cache(int seqs, int capacity, int blocks, int block) const {
  LOWBIT_CHECK(seqs >= 1 && capacity >= 1 && blocks >= 1 && block >= 16 && (block & (block - 1)) == 0, "KV cache: ",
               seqs, " sequences of ", capacity, " positions, ", blocks, " blocks of ", block,
               " (a power of two, at least 16)");
  GpuKVCache kv = cache_of_blocks(seqs, capacity, blocks, block);
  kv.shift = std::countr_zero(static_cast<unsigned>(block));
  kv.max_blocks = (capacity + block - 1) / block;
  kv.table.assign(static_cast<size_t>(seqs) * kv.max_blocks, 0);
  kv.table_dev = DeviceBuffer<int32_t>(kv.table.size());
  kv.table_dirty = true;
  return kv;
}

void GpuModel::upload_table(GpuKVCache& cache) {
  if (!cache.table_dirty) return;
  // From pageable memory: the call returns once the table is staged, so the host copy may change right after.
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(cache.table_dev.get(), cache.table.data(), sizeof(int32_t) * cache.table.size(),
                                    cudaMemcpyHostToDevice, stream_));
  cache.table_dirty = false;
}

void GpuModel::synchronize() const { LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void GpuModel::ensure_workspace(int rows, int seqs, bool all_logits) {
  const int logit_rows = all_logits ? rows : seqs;
  if (rows <= ws_rows_ && logit_rows <= ws_logit_rows_) return;
  synchronize();
  invalidate_graph();   // the captured step points into the old buffers
  ws_rows_ = std::max(rows, ws_rows_);
  ws_logit_rows_ = std::max(logit_rows, ws_logit_rows_);
  const size_t R = static_cast<size_t>(ws_rows_);
  const size_t wide = static_cast<size_t>(std::max({c_.dim, c_.q_dim(), c_.hidden_dim}));
  x_ = DeviceBuffer<float>(R * c_.dim);
  xn_ = DeviceBuffer<float>(R * wide);
  xnh_ = DeviceBuffer<__half>(R * c_.dim);
  q_ = DeviceBuffer<float>(R * c_.q_dim());
  kk_ = DeviceBuffer<float>(R * c_.kv_dim());
  vv_ = DeviceBuffer<float>(R * c_.kv_dim());
  att_ = DeviceBuffer<float>(R * c_.q_dim());
  g_ = DeviceBuffer<float>(R * c_.hidden_dim);
  u_ = DeviceBuffer<float>(R * c_.hidden_dim);
  tmp_ = DeviceBuffer<float>(R * c_.dim);
  const bool fused_qkv = std::any_of(layers_.begin(), layers_.end(), [](const Layer& L) { return L.qkv.n > 0; });
  const bool fused_gu = std::any_of(layers_.begin(), layers_.end(), [](const Layer& L) { return L.gate_up.n > 0; });
  qkv_ = DeviceBuffer<float>(fused_qkv ? R * (c_.q_dim() + 2 * c_.kv_dim()) : 0);
  gu_ = DeviceBuffer<float>(fused_gu ? R * 2 * c_.hidden_dim : 0);
  // The largest quantization a producer writes, over every layer's shared weights (whether the producers are on now
  // or not: the switch may change later), at any row count up to R: the GEMV's forms (m <= 8) take more bytes per
  // element than the GEMM's (FP8 as int32, A16 as fp32), so both ends of the range are sized.
  size_t acts = 0;
  for (const Layer& L : layers_)
    for (const DevicePackedWeight* w : {quik_act_shared({&L.q, &L.k, &L.v}, c_.dim), quik_act_shared({&L.gate, &L.up}, c_.dim),
                                        quik_act_shared({&L.down}, c_.hidden_dim), quik_act_shared({&L.o}, c_.q_dim())})
      if (w != nullptr)
        for (const int64_t m : {std::min<int64_t>(static_cast<int64_t>(R), 8), static_cast<int64_t>(R)})
          acts = std::max(acts, quik_act_scratch_bytes(w->quik(), m));
  quik_acts_ = DeviceBuffer<uint8_t>(acts);
  // Attention's row-group counts for the o projection's quantization (quik.h: QuikRowSink), zero between uses.
  sink_done_ = DeviceBuffer<unsigned>(acts > 0 ? R : 0);
  if (sink_done_.size() > 0) LOWBIT_CUDA_CHECK(cudaMemsetAsync(sink_done_.get(), 0, sink_done_.bytes(), stream_));
  logits_ = DeviceBuffer<float>(static_cast<size_t>(ws_logit_rows_) * c_.vocab_size);
  nll_ = DeviceBuffer<float>(R);
  argmax_keys_ = DeviceBuffer<uint64_t>(static_cast<size_t>(ws_logit_rows_) * kArgmaxSlices);
  hit_ = DeviceBuffer<int32_t>(R);
  tok_in_ = DeviceBuffer<int32_t>(R);
  seq_dev_ = DeviceBuffer<int32_t>(R);
  pos_dev_ = DeviceBuffer<int32_t>(R);
  if (tok_dev_.size() < R) {   // keep the decode tokens already set
    DeviceBuffer<int32_t> grown(R);
    if (tok_dev_.size() > 0)
      LOWBIT_CUDA_CHECK(cudaMemcpy(grown.get(), tok_dev_.get(), tok_dev_.bytes(), cudaMemcpyDeviceToDevice));
    tok_dev_ = std::move(grown);
  }
}

void GpuModel::ensure_attn_scratch(int rows, int splits) {
  if (splits <= 1) return;
  const size_t need = static_cast<size_t>(rows) * c_.n_heads * splits * (c_.head_dim + 2);
  if (attn_scratch_.size() >= need) return;
  synchronize();
  invalidate_graph();
  attn_scratch_ = DeviceBuffer<float>(need);
}

// LOWBIT_ATTN_SPLITS=n (core/knobs.h) forces n splits (at most one per kMinKeysPerSplit keys): for
// measuring the rule above.
int GpuModel::decode_splits(int seqs, int capacity) const {
  static const int forced = static_cast<int>(std::clamp<int64_t>(knob_int(Knob::AttnSplits), 0, kMaxSplits));
  if (forced > 0) return std::clamp(forced, 1, std::max(1, (capacity + kMinKeysPerSplit - 1) / kMinKeysPerSplit));
  return splits_for(capacity, seqs, c_.n_heads, sms_);
}

void GpuModel::invalidate_graph() {
  for (DecodeGraph& g : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

bool GpuModel::run_group(const std::vector<const GpuLinear*>& ls, const float* x, int64_t m, const std::vector<float*>& ys,
                         const float* x_max) {
  std::vector<const DevicePackedWeight*> ws;
  for (const GpuLinear* l : ls) ws.push_back(l->packed.get());
  if (mixed_ || !packed_group_runs(ws, m)) return false;
  packed_matmul_group(ws, x, m, ys, *gemm_, x_max);
  for (size_t i = 0; i < ls.size(); ++i)
    if (ls[i]->bias.size() > 0) add_bias_rows(ys[i], ls[i]->bias.get(), static_cast<int>(m), static_cast<int>(ls[i]->n), stream_);
  return true;
}

const DevicePackedWeight* GpuModel::quik_act_shared(const std::vector<const GpuLinear*>& ls, int64_t width) const {
  if (mixed_) return nullptr;
  for (const GpuLinear* l : ls)
    if (l->n == 0 || !l->packed || l->packed->format() != FormatId::Quik || !quik_same_activations(*l->packed, *ls.front()->packed))
      return nullptr;
  const DevicePackedWeight* w = ls.front()->packed.get();
  return quik_producer_quantizes(w->quik(), width) ? w : nullptr;
}

const DevicePackedWeight* GpuModel::quik_act_target(const std::vector<const GpuLinear*>& ls, int64_t width) const {
  return quik_producer_act_enabled() ? quik_act_shared(ls, width) : nullptr;
}

const DevicePackedWeight* GpuModel::quik_attention_target(const Layer& L) const {
  const DevicePackedWeight* w = quik_act_target({&L.o}, c_.q_dim());
  return w != nullptr && quik_attention_quantizes(w->quik(), c_.q_dim()) ? w : nullptr;
}

void GpuModel::run_linear(const GpuLinear& l, const float* x, const __half* xh, int64_t m, float* y, int bits, const float* x_max,
                          const void* acts) {
  if (acts != nullptr) {
    quik_matmul_quantized(l.packed->quik(), acts, m, y, *gemm_);
    if (l.bias.size() > 0) add_bias_rows(y, l.bias.get(), static_cast<int>(m), static_cast<int>(l.n), stream_);
    return;
  }
  if (!l.packed && pick_kernel({std::nullopt, l.n, l.k, m, 0, true}, runtime_gpu()) == Kernel::DenseGemv &&
      dense_gemv_fits(l.dense, l.n, l.k, m, x)) {
    // Batch 1..2 on fp16 weights: our GEMV reads the fp32 activations and adds the bias itself.
    dense_f16_gemv(l.dense, l.n, l.k, x, static_cast<int>(m), l.bias.size() > 0 ? l.bias.get() : nullptr, y, stream_);
    return;
  }
  if (l.packed && mixed_) packed_matmul_mixed(*l.packed, bits, row_bits_dev_.get(), x, m, y, *gemm_);
  else if (l.packed) packed_matmul(*l.packed, bits, x, m, y, *gemm_, OutlierMode::Fused, x_max);
  else if (xh != nullptr) dense_f16_matmul_h(l.dense, l.n, l.k, xh, m, y, *gemm_);
  else dense_f16_matmul(l.dense, l.n, l.k, x, m, y, *gemm_);
  if (l.bias.size() > 0) add_bias_rows(y, l.bias.get(), static_cast<int>(m), static_cast<int>(l.n), stream_);
}

// Whether a linear of the layers runs the int8 GEMV at this width and batch (Auto's choice, as packed_matmul makes it;
// the layers share their shapes, so the first layer answers): only then are the rows' maxima worth taking.
bool GpuModel::runs_int8_gemv(int bits, int rows) const {
  if (layers_.empty()) return false;
  const std::vector<const GpuLinear*> ls = linears(layers_.front());
  return std::any_of(ls.begin(), ls.end(), [&](const GpuLinear* l) { return l->packed && packed_runs_int8_gemv(*l->packed, bits, rows); });
}

void GpuModel::forward_device(int rows, int seqs, int n, GpuKVCache& cache, bool all_logits, int bits, int splits) {
  const int dim = c_.dim, H = c_.n_heads, KVH = c_.n_kv_heads, hd = c_.head_dim;
  cudaStream_t s = stream_;
  // The normalised activations in fp16 as well when a dense (cuBLAS) linear reads them: converted once per norm.
  __half* xh = dense_layers_ ? xnh_.get() : nullptr;
  // The rows' max |x| for the int8 GEMVs' activation kernels, taken by the kernels that produce x (packed_matmul's
  // x_max: the x kernel then skips its row-wide reduction): slot N by every RMSNorm (q/k/v, gate/up), A by attention
  // (o; zeroed by the RMSNorm before the layer), S by SwiGLU (down; zeroed by the RMSNorm before gate/up).
  const bool xm = !mixed_ && producer_xmax_enabled() && rows <= kMaxGemvBatch && rmsnorm_writes_xmax(dim) && c_.hidden_dim % 32 == 0 &&
                  runs_int8_gemv(bits, rows);
  float* slot_n = xm ? xmax_.get() : nullptr;
  float* slot_a = xm ? xmax_.get() + kMaxGemvBatch : nullptr;
  float* slot_s = xm ? xmax_.get() + 2 * kMaxGemvBatch : nullptr;
  // QUIK: the RMSNorm (SwiGLU) quantizes the activations of the linears after it once for all of them (quik.h),
  // unless a dense linear wants the fp16 copy or an int8 GEMV the row maxima; acts then points at that quantization.
  auto norm = [&](const float* delta, const float* nw, __half* yh, float* xmax, float* zero,
                  const DevicePackedWeight* target) -> const void* {
    if (target != nullptr && yh == nullptr && xmax == nullptr && zero == nullptr && quik_rmsnorm_quantizes(target->quik(), dim)) {
      quik_rmsnorm_quantize(target->quik(), x_.get(), delta, nw, xn_.get(), rows, dim, c_.rms_eps, quik_acts_.get(),
                            quik_acts_.bytes(), s);
      return quik_acts_.get();
    }
    rmsnorm(x_.get(), delta, nw, xn_.get(), yh, rows, dim, c_.rms_eps, s, xmax, zero);
    return nullptr;
  };
  auto qkv_target = [&](const Layer& L) { return quik_act_target({&L.q, &L.k, &L.v}, dim); };
  mark("norms + residuals");
  const void* acts = norm(nullptr, layers_[0].attn_norm.get(), xh, slot_n, slot_a, qkv_target(layers_[0]));
  for (int l = 0; l < c_.n_layers; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    mark("q/k/v linears");
    const int64_t qd = static_cast<int64_t>(H) * hd, kvd = static_cast<int64_t>(KVH) * hd;
    const float *qin = q_.get(), *kin = kk_.get(), *vin = vv_.get();
    int64_t q_ld = qd, kv_ld = kvd;
    if (acts != nullptr) {
      run_linear(L.q, xn_.get(), xh, rows, q_.get(), bits, nullptr, acts);
      run_linear(L.k, xn_.get(), xh, rows, kk_.get(), bits, nullptr, acts);
      run_linear(L.v, xn_.get(), xh, rows, vv_.get(), bits, nullptr, acts);
    } else if (L.qkv.n > 0) {   // one GEMV; q, k, v are column ranges of its rows
      run_linear(L.qkv, xn_.get(), xh, rows, qkv_.get(), bits, slot_n);
      qin = qkv_.get();
      kin = qin + qd;
      vin = kin + kvd;
      q_ld = kv_ld = L.qkv.n;
    } else if (!run_group({&L.q, &L.k, &L.v}, xn_.get(), rows, {q_.get(), kk_.get(), vv_.get()}, slot_n)) {
      run_linear(L.q, xn_.get(), xh, rows, q_.get(), bits, slot_n);
      run_linear(L.k, xn_.get(), xh, rows, kk_.get(), bits, slot_n);
      run_linear(L.v, xn_.get(), xh, rows, vv_.get(), bits, slot_n);
    }
    // Decode: RoPE and the KV store inside the attention kernel (one kernel fewer per layer, measured faster on the
    // H200 with Llama-2-7B 3-bit); prefill: their own kernel.
    const bool fold = attention_folds_rope(rows, hd, n == 1);
    const RopeIn rope{qin, q_ld, kin, vin, kv_ld, rope_cos_.get(), rope_sin_.get(), cache.k.get(), cache.v.get()};
    if (!fold) {
      mark("RoPE + KV store");
      rope_kv_store(qin, q_ld, kin, vin, kv_ld, q_.get(), seq_dev_.get(), pos_dev_.get(), rows, H, KVH, hd, rope_cos_.get(),
                    rope_sin_.get(), l, cache.map(), cache.k.get(), cache.v.get(), s);
    }
    mark("attention");
    // QUIK: attention quantizes the o projection's input on the way out (quik.h: QuikRowSink).
    const DevicePackedWeight* o_target = slot_a == nullptr && quik_attention_act_at(rows) ? quik_attention_target(L) : nullptr;
    QuikRowSink sink;
    if (o_target != nullptr)
      sink = quik_row_sink(o_target->quik(), rows, quik_acts_.get(), quik_acts_.bytes(), sink_done_.get(),
                           static_cast<int64_t>(sink_done_.size()), s);
    const QuikRowSink* sk = o_target != nullptr ? &sink : nullptr;
    if (slot_a == nullptr && attention_on_tensor_cores(n, hd))
      prefill_attention(q_.get(), seq_dev_.get(), pos_dev_.get(), seqs, n, H, KVH, hd, l, cache.map(), c_.sliding_window,
                        cache.k.get(), cache.v.get(), att_.get(), s, sk);
    else
      attention(q_.get(), seq_dev_.get(), pos_dev_.get(), rows, H, KVH, hd, l, cache.map(), c_.sliding_window, cache.k.get(),
                cache.v.get(), att_.get(), splits, attn_scratch_.get(), n == 1, s, reinterpret_cast<unsigned*>(slot_a),
                fold ? &rope : nullptr, sk);
    mark("o linear");
    run_linear(L.o, att_.get(), nullptr, rows, tmp_.get(), bits, slot_a, sk != nullptr ? quik_acts_.get() : nullptr);
    mark("norms + residuals");
    acts = norm(tmp_.get(), L.ffn_norm.get(), xh, slot_n, slot_s, quik_act_target({&L.gate, &L.up}, dim));   // x += attention out
    mark("gate/up linears");
    const int64_t hid = c_.hidden_dim;
    const DevicePackedWeight* down_target = slot_s == nullptr ? quik_act_target({&L.down}, hid) : nullptr;
    const void* down_acts = nullptr;
    if (!mixed_ && L.gate_up.n > 0 && slot_s != nullptr && L.gate_up.packed && L.gate_up.bias.size() == 0 &&
        packed_swiglu_fuses(*L.gate_up.packed, bits, rows)) {
      // SwiGLU in the GEMV's epilogue, its row maxima into slot S (one kernel fewer per layer: faster on the H200 with
      // Llama-2-7B).
      packed_matmul_swiglu(*L.gate_up.packed, bits, xn_.get(), rows, g_.get(), *gemm_, slot_n, reinterpret_cast<unsigned*>(slot_s));
    } else if (L.gate_up.n > 0) {
      run_linear(L.gate_up, xn_.get(), xh, rows, gu_.get(), bits, slot_n);
      mark("SwiGLU");
      swiglu_rows(gu_.get(), gu_.get() + hid, 2 * hid, g_.get(), rows, hid, s, reinterpret_cast<unsigned*>(slot_s));
    } else {   // separate gate and up (acts: QUIK weights, L.gate_up is empty)
      if (acts != nullptr) {
        run_linear(L.gate, xn_.get(), xh, rows, g_.get(), bits, nullptr, acts);
        run_linear(L.up, xn_.get(), xh, rows, u_.get(), bits, nullptr, acts);
      } else if (!run_group({&L.gate, &L.up}, xn_.get(), rows, {g_.get(), u_.get()}, slot_n)) {
        run_linear(L.gate, xn_.get(), xh, rows, g_.get(), bits, slot_n);
        run_linear(L.up, xn_.get(), xh, rows, u_.get(), bits, slot_n);
      }
      mark("SwiGLU");
      if (down_target != nullptr) {
        quik_swiglu_quantize(down_target->quik(), g_.get(), u_.get(), hid, g_.get(), rows, hid, quik_acts_.get(),
                             quik_acts_.bytes(), s);
        down_acts = quik_acts_.get();
      } else {
        swiglu_rows(g_.get(), u_.get(), hid, g_.get(), rows, hid, s, reinterpret_cast<unsigned*>(slot_s));
      }
    }
    mark("down linear");
    run_linear(L.down, g_.get(), nullptr, rows, tmp_.get(), bits, slot_s, down_acts);
    mark(l + 1 < c_.n_layers ? "norms + residuals" : "final norm + head");
    // x += MLP out, then the next layer's attention norm (or, after the last layer, the final norm).
    // The fp16 copy: for the next layer's dense linears, or after the last layer for the (fp16, cuBLAS) head.
    const bool last = l + 1 == c_.n_layers;
    const float* next_norm = last ? final_norm_.get() : layers_[static_cast<size_t>(l) + 1].attn_norm.get();
    acts = norm(tmp_.get(), next_norm, last ? xnh_.get() : xh, slot_n, slot_a, last ? nullptr : qkv_target(layers_[static_cast<size_t>(l) + 1]));
  }
  if (all_logits || n == 1) {   // every row's logits, or one row per sequence (decode)
    run_linear(head_, xn_.get(), xnh_.get(), rows, logits_.get(), 0);
  } else {
    // The last row of each sequence (rows n-1, 2n-1, ...), already normalised.
    LOWBIT_CUDA_CHECK(cudaMemcpy2DAsync(tmp_.get(), sizeof(float) * dim, xn_.get() + static_cast<int64_t>(n - 1) * dim,
                                        sizeof(float) * dim * n, sizeof(float) * dim, seqs, cudaMemcpyDeviceToDevice, s));
    run_linear(head_, tmp_.get(), nullptr, seqs, logits_.get(), 0);
  }
  mark("argmax");
}

const float* GpuModel::forward(const int32_t* tokens, int seqs, int n, GpuKVCache& cache, bool all_logits, int bits,
                              int slot0) {
  LOWBIT_CHECK(n >= 1 && seqs >= 1 && slot0 >= 0 && slot0 + seqs <= cache.seqs, "forward: ", seqs, " sequences of ", n,
               " tokens from slot ", slot0, " (cache holds ", cache.seqs, ")");
  check_bits(bits);
  int max_span = 0;
  for (int b = slot0; b < slot0 + seqs; ++b) {
    LOWBIT_CHECK(cache.len[static_cast<size_t>(b)] + n <= cache.capacity, "forward: ", cache.len[static_cast<size_t>(b)] + n,
                 " positions exceed the KV cache of ", cache.capacity);
    max_span = std::max(max_span, cache.len[static_cast<size_t>(b)] + n);
  }
  const int rows = seqs * n;
  for (int r = 0; r < rows; ++r)
    LOWBIT_CHECK(tokens[r] >= 0 && tokens[r] < c_.vocab_size, "forward: token id ", tokens[r], " out of range [0, ",
                 c_.vocab_size, ")");
  ensure_workspace(rows, seqs, all_logits);
  std::vector<int32_t> seq(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    seq[static_cast<size_t>(r)] = slot0 + r / n;
    pos[static_cast<size_t>(r)] = cache.len[static_cast<size_t>(slot0 + r / n)] + r % n;
  }
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(tok_in_.get(), tokens, sizeof(int32_t) * rows, cudaMemcpyHostToDevice, stream_));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(seq_dev_.get(), seq.data(), sizeof(int32_t) * rows, cudaMemcpyHostToDevice, stream_));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(pos_dev_.get(), pos.data(), sizeof(int32_t) * rows, cudaMemcpyHostToDevice, stream_));
  upload_table(cache);
  embed_rows(emb_, tok_in_.get(), rows, c_.dim, x_.get(), stream_);
  const int splits = splits_for(max_span, rows, c_.n_heads, sms_);
  ensure_attn_scratch(rows, splits);
  forward_device(rows, seqs, n, cache, all_logits, bits, splits);
  LOWBIT_CUDA_CHECK(cudaGetLastError());
  for (int b = slot0; b < slot0 + seqs; ++b) cache.len[static_cast<size_t>(b)] += n;
  return logits_.get();
}

void GpuModel::score_window(const int32_t* tokens, int n, GpuKVCache& cache, int bits, double* nll_sum, int64_t* hits) {
  LOWBIT_CHECK(n >= 2, "score_window: a window needs at least 2 tokens");
  std::fill(cache.len.begin(), cache.len.end(), 0);
  const float* logits = forward(tokens, 1, n, cache, true, bits);
  nll_rows(logits, tok_in_.get() + 1, n - 1, c_.vocab_size, nll_.get(), hit_.get(), stream_);
  std::vector<float> nll(static_cast<size_t>(n - 1));
  std::vector<int32_t> hit(static_cast<size_t>(n - 1));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(nll.data(), nll_.get(), sizeof(float) * (n - 1), cudaMemcpyDeviceToHost, stream_));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(hit.data(), hit_.get(), sizeof(int32_t) * (n - 1), cudaMemcpyDeviceToHost, stream_));
  synchronize();
  double s = 0;
  int64_t h = 0;
  for (int i = 0; i < n - 1; ++i) {
    s += nll[static_cast<size_t>(i)];
    h += hit[static_cast<size_t>(i)];
  }
  *nll_sum = s;
  *hits = h;
}

void GpuModel::set_decode_tokens(const std::vector<int32_t>& toks) {
  LOWBIT_CHECK(!toks.empty(), "decode: no tokens");
  for (int32_t t : toks) LOWBIT_CHECK(t >= 0 && t < c_.vocab_size, "decode: token id ", t, " out of range");
  ensure_workspace(static_cast<int>(toks.size()), static_cast<int>(toks.size()), false);
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(tok_dev_.get(), toks.data(), sizeof(int32_t) * toks.size(), cudaMemcpyHostToDevice, stream_));
  synchronize();
  decode_seqs_ = static_cast<int>(toks.size());
}

void GpuModel::greedy_from_last_logits(int seqs) {
  LOWBIT_CHECK(seqs >= 1 && seqs <= ws_logit_rows_, "greedy: ", seqs, " sequences, the last forward produced ",
               ws_logit_rows_, " rows of logits at most");
  argmax_rows(logits_.get(), seqs, c_.vocab_size, tok_dev_.get(), stream_, argmax_keys_.get());
  decode_seqs_ = seqs;
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

void GpuModel::sample_from_last_logits(int seqs, const GpuSamplingParams& p, const std::vector<float>& u) {
  LOWBIT_CHECK(seqs >= 1 && seqs <= ws_logit_rows_ && static_cast<int>(u.size()) == seqs, "sample: ", seqs,
               " sequences, ", u.size(), " uniforms, ", ws_logit_rows_, " rows of logits at most");
  if (u_dev_.size() < u.size()) u_dev_ = DeviceBuffer<float>(u.size());
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(u_dev_.get(), u.data(), sizeof(float) * u.size(), cudaMemcpyHostToDevice, stream_));
  sample_rows(logits_.get(), seqs, c_.vocab_size, p, u_dev_.get(), tok_dev_.get(), stream_);
  decode_seqs_ = seqs;
}

std::vector<int32_t> GpuModel::get_decode_tokens(int seqs) const {
  std::vector<int32_t> t(static_cast<size_t>(seqs));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(t.data(), tok_dev_.get(), sizeof(int32_t) * seqs, cudaMemcpyDeviceToHost, stream_));
  synchronize();
  return t;
}

void GpuModel::decode_step_greedy(GpuKVCache& cache, int bits, bool use_graph) {
  check_bits(bits);
  const int seqs = cache.seqs;
  LOWBIT_CHECK(decode_seqs_ == seqs, "decode: tokens were set for ", decode_seqs_, " sequences, the cache holds ", seqs,
               " (set_decode_tokens / greedy_from_last_logits first)");
  for (int b = 0; b < seqs; ++b)
    LOWBIT_CHECK(cache.len[static_cast<size_t>(b)] + 1 <= cache.capacity, "decode: the KV cache of ", cache.capacity,
                 " positions is full");
  ensure_workspace(seqs, seqs, false);
  std::vector<int32_t> seq(static_cast<size_t>(seqs)), pos(cache.len.begin(), cache.len.end());
  for (int b = 0; b < seqs; ++b) seq[static_cast<size_t>(b)] = b;
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(seq_dev_.get(), seq.data(), sizeof(int32_t) * seqs, cudaMemcpyHostToDevice, stream_));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(pos_dev_.get(), pos.data(), sizeof(int32_t) * seqs, cudaMemcpyHostToDevice, stream_));
  decode_rows(cache, seqs, bits, use_graph, /*argmax=*/true);
  for (int b = 0; b < seqs; ++b) ++cache.len[static_cast<size_t>(b)];
}

int GpuModel::decode_bucket(int rows) {
  if (rows <= 1) return 1;
  if (rows <= 2) return 2;
  if (rows <= 4) return 4;
  return (rows + 7) / 8 * 8;
}

const float* GpuModel::decode_slots(GpuKVCache& cache, const std::vector<int>& slots, const std::vector<int32_t>& tokens,
                                    int bits, bool use_graph) {
  check_bits(bits);
  const int n = static_cast<int>(slots.size());
  const int pad_slot = cache.seqs - 1;
  LOWBIT_CHECK(n >= 1 && tokens.size() == slots.size() && n <= pad_slot, "decode_slots: ", n, " slots, ", tokens.size(),
               " tokens, a cache of ", cache.seqs, " slots (the last kept as padding)");
  const int rows = std::min(decode_bucket(n), pad_slot + 1);
  std::vector<int32_t> seq(static_cast<size_t>(rows), pad_slot), pos(static_cast<size_t>(rows), 0),
      tok(static_cast<size_t>(rows), 0);
  std::vector<bool> seen(static_cast<size_t>(cache.seqs), false);
  for (int i = 0; i < n; ++i) {
    const int s = slots[static_cast<size_t>(i)];
    LOWBIT_CHECK(s >= 0 && s < pad_slot && !seen[static_cast<size_t>(s)], "decode_slots: slot ", s,
                 " is out of range or repeated");
    seen[static_cast<size_t>(s)] = true;
    LOWBIT_CHECK(cache.len[static_cast<size_t>(s)] + 1 <= cache.capacity, "decode: the KV cache of ", cache.capacity,
                 " positions is full");
    const int32_t t = tokens[static_cast<size_t>(i)];
    LOWBIT_CHECK(t >= 0 && t < c_.vocab_size, "decode: token id ", t, " out of range");
    seq[static_cast<size_t>(i)] = s;
    pos[static_cast<size_t>(i)] = cache.len[static_cast<size_t>(s)];
    tok[static_cast<size_t>(i)] = t;
  }
  ensure_workspace(rows, rows, false);
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(tok_dev_.get(), tok.data(), sizeof(int32_t) * rows, cudaMemcpyHostToDevice, stream_));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(seq_dev_.get(), seq.data(), sizeof(int32_t) * rows, cudaMemcpyHostToDevice, stream_));
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(pos_dev_.get(), pos.data(), sizeof(int32_t) * rows, cudaMemcpyHostToDevice, stream_));
  upload_table(cache);
  decode_rows(cache, rows, bits, use_graph, /*argmax=*/true);
  for (int i = 0; i < n; ++i) ++cache.len[static_cast<size_t>(slots[static_cast<size_t>(i)])];
  return logits_.get();
}

bool GpuModel::mixed_decode_serves(int rows) const {
  if (widths_ == 0 || decode_bucket(rows) > kMaxGemvBatch) return false;
  for (const Layer& L : layers_)
    for (const GpuLinear* l : linears(L))
      if (l->packed && !packed_mixed_serves(*l->packed, decode_bucket(rows))) return false;
  return true;
}

const float* GpuModel::decode_slots(GpuKVCache& cache, const std::vector<int>& slots, const std::vector<int32_t>& tokens,
                                    const std::vector<int>& row_bits, bool use_graph) {
  LOWBIT_CHECK(row_bits.size() == slots.size() && !slots.empty(), "decode_slots: ", row_bits.size(), " widths for ",
               slots.size(), " slots");
  const int widest = 31 - std::countl_zero(widths_ | 1u);
  std::vector<int32_t> rb(row_bits.begin(), row_bits.end());
  for (int32_t& b : rb) {
    check_bits(b);
    if (b == 0) b = widest;
  }
  const int top = *std::max_element(rb.begin(), rb.end());
  if (std::all_of(rb.begin(), rb.end(), [&](int32_t b) { return b == top; })) return decode_slots(cache, slots, tokens, top, use_graph);
  LOWBIT_CHECK(mixed_decode_serves(static_cast<int>(slots.size())), "decode_slots: rows of different widths need an ",
               "any-precision model and at most ", kMaxGemvBatch, " rows (mixed_decode_serves)");
  const int rows = decode_bucket(static_cast<int>(slots.size()));
  rb.resize(static_cast<size_t>(rows), top);   // padding rows at the widest
  if (row_bits_dev_.size() < static_cast<size_t>(kMaxGemvBatch)) row_bits_dev_ = DeviceBuffer<int32_t>(kMaxGemvBatch);
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(row_bits_dev_.get(), rb.data(), sizeof(int32_t) * rb.size(), cudaMemcpyHostToDevice, stream_));
  mixed_ = true;
  try {
    const float* out = decode_slots(cache, slots, tokens, top, use_graph);
    mixed_ = false;
    return out;
  } catch (...) {
    mixed_ = false;
    throw;
  }
}

void GpuModel::decode_rows(GpuKVCache& cache, int seqs, int bits, bool use_graph, bool argmax) {
  const int splits = decode_splits(seqs, cache.capacity);   // fixed per cache: one graph, every position
  ensure_attn_scratch(seqs, splits);
  auto body = [&] {
    embed_rows(emb_, tok_dev_.get(), seqs, c_.dim, x_.get(), stream_);
    forward_device(seqs, seqs, 1, cache, false, bits, splits);
    if (argmax) argmax_rows(logits_.get(), seqs, c_.vocab_size, tok_dev_.get(), stream_, argmax_keys_.get());
    mark("end");
  };
  // Runs this call's step uncaptured (which also sizes the GEMM scratch: nothing may be allocated during a capture),
  // then captures the step into *exec for the next calls: the capture only records, it executes nothing.
  auto run_and_capture = [&](cudaGraphExec_t* exec) {
    if (prof_) prof_->paused = true;   // stage events only as nodes of the profiled graph
    body();
    synchronize();
    if (prof_) prof_->paused = false;
    cudaGraph_t g = nullptr;
    LOWBIT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    body();
    LOWBIT_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    LOWBIT_CUDA_CHECK(cudaGraphInstantiate(exec, g, 0));
    cudaGraphDestroy(g);
  };
  if (prof_ && use_graph) {
    // Profiling: a graph of the same step with the stage events as nodes, timed replay by replay.
    StageTimer& p = *prof_;
    if (p.graph != nullptr && p.graph_seqs == seqs && p.graph_bits == bits && p.graph_mixed == mixed_ && p.graph_cache == cache.id &&
        p.graph_gemm_gen == gemm_->generation() && p.graph_pdl == graph_launch_key()) {
      LOWBIT_CUDA_CHECK(cudaGraphLaunch(p.graph, stream_));
      p.accumulate(stream_, false);
    } else {
      if (p.graph != nullptr) cudaGraphExecDestroy(p.graph);
      p.graph = nullptr;
      p.accumulate(stream_, true);   // marks of earlier uncaptured steps (or of the old graph)
      run_and_capture(&p.graph);
      p.graph_seqs = seqs;
      p.graph_bits = bits;
      p.graph_mixed = mixed_;
      p.graph_cache = cache.id;
      p.graph_gemm_gen = gemm_->generation();
      p.graph_pdl = graph_launch_key();
    }
  } else if (!use_graph) {
    body();
  } else {
    const uint64_t gen = gemm_->generation();
    const unsigned pdl = graph_launch_key();
    auto hit = std::find_if(graphs_.begin(), graphs_.end(), [&](const DecodeGraph& g) {
      return g.seqs == seqs && g.bits == bits && g.mixed == mixed_ && g.capacity == cache.capacity && g.cache == cache.id &&
             g.gemm_gen == gen && g.pdl == pdl && g.argmax == argmax;
    });
    if (hit != graphs_.end()) {
      hit->last_use = ++graph_clock_;
      LOWBIT_CUDA_CHECK(cudaGraphLaunch(hit->exec, stream_));
    } else {
      DecodeGraph g;
      g.seqs = seqs, g.bits = bits, g.mixed = mixed_, g.capacity = cache.capacity, g.cache = cache.id, g.pdl = pdl,
      g.argmax = argmax;
      run_and_capture(&g.exec);
      ++graph_captures_;
      g.gemm_gen = gemm_->generation();   // after the uncaptured step, which may have grown the scratch
      g.last_use = ++graph_clock_;
      // Graphs over an older GEMM scratch point into freed memory and can never match again; then the least recent.
      const auto stale = std::remove_if(graphs_.begin(), graphs_.end(), [&](const DecodeGraph& o) {
        if (o.gemm_gen == g.gemm_gen) return false;
        cudaGraphExecDestroy(o.exec);
        return true;
      });
      graphs_.erase(stale, graphs_.end());
      if (graphs_.size() >= kMaxDecodeGraphs) {
        auto lru = std::min_element(graphs_.begin(), graphs_.end(),
                                    [](const DecodeGraph& a, const DecodeGraph& b) { return a.last_use < b.last_use; });
        cudaGraphExecDestroy(lru->exec);
        graphs_.erase(lru);
      }
      graphs_.push_back(g);
    }
  }
  LOWBIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lowbit::cuda
