// The Llama-family forward pass on one GPU: weights uploaded once from the model file (unquantized tensors as fp16,
// packed anyprec / mixed24a weights exactly as stored — no dequantized copy is kept), one stream, fp32 activations, an fp16 KV
// cache holding a batch of sequences, decode steps replayable as a CUDA graph. Mirrors Model::forward
// (src/model/forward.cpp) step for step; tests/test_cuda_model.cpp compares the two.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend_cuda/common/common.h"
#include "backend_cuda/dispatch/packed.h"
#include "backend_cuda/ops/gpu_ops.h"
#include "backend_cuda/ops/sampling.h"
#include "model/model.h"

namespace lowbit::cuda {

// fp16 KV cache of `seqs` sequences, k and v each [blocks][layers][block][kv_dim] (ops/gpu_ops.h, KvMap); len[b] =
// positions filled in sequence b. Contiguous (new_cache): one block of `capacity` positions per sequence. Paged
// (new_paged_cache, continuous batching): sequence b's position p in block table[b][p / block], the table kept on the
// host and uploaded before a forward that follows a change (table_dirty).
struct GpuKVCache {
  int seqs = 0, layers = 0, capacity = 0, kv_dim = 0;
  int block = 0, blocks = 0, max_blocks = 1, shift = 31;
  // Unique per cache made by new_cache (never reused): the decode graphs are keyed by it, not by the buffers'
  // addresses, which a later cache may get again while a graph still points at the old v buffer.
  uint64_t id = 0;
  DeviceBuffer<__half> k, v;
  std::vector<int> len;
  std::vector<int32_t> table;   // paged: [seqs][max_blocks] (entries past a sequence's blocks unused)
  DeviceBuffer<int32_t> table_dev;
  bool table_dirty = false;
  bool paged() const { return table_dev.size() > 0; }
  KvMap map() const { return KvMap{paged() ? table_dev.get() : nullptr, max_blocks, shift, block, layers}; }
  uint64_t bytes() const { return k.bytes() + v.bytes() + table_dev.bytes(); }
};

// One linear layer on the device: fp16 dense or a packed weight, optional fp32 bias.
struct GpuLinear {
  int64_t n = 0, k = 0;
  const __half* dense = nullptr;                 // [n, k] (owned by the model, or shared with the embedding)
  std::unique_ptr<DevicePackedWeight> packed;
  DeviceBuffer<float> bias;
  uint64_t bytes_read(int bits) const;
};

class GpuModel {
 public:
  // Loads a model file's weights as stored (model/weight_set.h), one tensor at a time: a dense tensor is converted to
  // fp32 in one scratch buffer (model/weight_convert.h: the conversion Model::load makes, q/k rows permuted alike),
  // uploaded and made fp16 on the device, and its file pages are dropped from the process's resident set (they stay
  // in the page cache), so host memory peaks at about one tensor's fp32 copy whatever the model's size. Packed
  // weights go by their format's GPU support (formats/format_table.h): Packed formats (uniform, anyprec, mixed24a)
  // are uploaded as stored and run their kernels over the packed bytes; Dequantized ones (the generic mixed24 layout)
  // run as an fp16 copy of exactly the weights they encode (counted by dequantized_linears()); a format
  // without a GPU path (QUIK) is refused, naming the tensor. after_tensor (optional) is called after each tensor's
  // upload while its scratch is still held (load_stats samples host memory there).
  explicit GpuModel(const WeightSet& ws, const std::function<void()>& after_tensor = {});
  // The same weights taken from a loaded CPU model's fp32 tensors (and its WeightSet's packed weights) instead of
  // converted from the file: what a test compares the file path against.
  explicit GpuModel(const Model& cpu);
  // A model with this config and random weights generated on the device (benchmarks of shapes that are not on
  // disk): fp16 everywhere, or every linear as a random anyprec (8-bit parent, widths 2..8), mixed24a (0.35%
  // outliers), uniform (4 or 3 bits, groups of 128, asymmetric) or QUIK weight (W4A8 / W8A8, outlier columns 1/16 of
  // the input width, as the quantizer's default).
  enum class RandomKind { Fp16, AnyPrec, Mixed24a, UniformW4G128, UniformW3G128, QuikW4A8, QuikW8A8, QuikW4Fp8 };
  GpuModel(const ModelConfig& c, RandomKind kind, uint64_t seed);
  ~GpuModel();

  const ModelConfig& config() const { return c_; }
  int dequantized_linears() const { return dequantized_linears_; }
  std::vector<int> widths() const;            // served any-precision widths (empty: single precision)
  void check_bits(int bits) const;
  uint64_t weight_bytes() const;              // device bytes of all weights
  uint64_t weight_bytes_per_token(int bits) const;   // bytes one decode step reads (linears + head)
  GpuKVCache new_cache(int seqs, int capacity) const;
  // A paged cache: `blocks` blocks of `block` positions (a power of two, at least 16) shared by `seqs` sequences of up to
  // `capacity` positions; every table entry starts at block 0.
  GpuKVCache new_paged_cache(int seqs, int capacity, int blocks, int block) const;
  int decode_splits(int seqs, int capacity) const;   // attention's key splits in a decode step over such a cache

  // Runs n new tokens for each of `seqs` sequences (tokens sequence-major, host memory) at positions
  // cache.len[b]..; cache.len[b] += n. Returns device logits: [seqs * n, vocab] when all_logits, else [seqs, vocab]
  // for each sequence's last token; valid until the next call.
  // slot0: the sequences are the cache's slot0 .. slot0 + seqs - 1 (continuous batching extends one slot's sequence).
  const float* forward(const int32_t* tokens, int seqs, int n, GpuKVCache& cache, bool all_logits, int bits,
                       int slot0 = 0);
  // Per predicted position of one window (tokens[0..n) scored from a fresh context): sum of NLL and top-1 hits.
  void score_window(const int32_t* tokens, int n, GpuKVCache& cache, int bits, double* nll_sum, int64_t* hits);

  // Decode loop building block: one step for all sequences from device-resident tokens (set_decode_tokens), the
  // greedy next tokens written back in their place (get_decode_tokens). With use_graph the step is captured once
  // per (sequences, bits, cache) and replayed (the first such call runs uncaptured and records the graph); graphs of
  // up to kMaxDecodeGraphs such keys are kept, so switching width between steps or requests replays the width's
  // graph. The positions are uploaded before each step. cache.len advances by one.
  void decode_step_greedy(GpuKVCache& cache, int bits, bool use_graph);
  // Continuous batching's decode step: tokens[i] (host) at the end of the cache's slot slots[i] (distinct, below
  // cache.seqs - 1), every row at width `bits`. The rows are padded to a bucket (1, 2, 4, 8, then multiples of 8) with
  // rows of the cache's last slot, kept as padding, at position 0, so that one captured graph per (bucket, width,
  // cache) serves every mix of slots and positions (use_graph). Returns device logits [bucket, vocab], the first
  // slots.size() rows the sequences'; valid until the next call. Each row's argmax token is left in the decode tokens
  // (get_decode_tokens). The slots' lengths advance by one.
  const float* decode_slots(GpuKVCache& cache, const std::vector<int>& slots, const std::vector<int32_t>& tokens,
                            int bits, bool use_graph);
  // The same step with each row at its own width (row_bits[i] for slots[i]; 0 = the widest): every packed linear reads
  // the widest present width's planes once for all rows (packed_matmul_mixed), so a step mixing widths costs about
  // one forward at the widest, not one forward per width. The row widths are uploaded like the positions, so one
  // captured graph per (bucket, widest width) serves every mix. Needs mixed_decode_serves(slots.size()).
  const float* decode_slots(GpuKVCache& cache, const std::vector<int>& slots, const std::vector<int32_t>& tokens,
                            const std::vector<int>& row_bits, bool use_graph);
  // Whether decode_slots with per-row widths serves `rows` rows: an any-precision model (every packed linear), a
  // bucket within the GEMV batch.
  bool mixed_decode_serves(int rows) const;
  static int decode_bucket(int rows);
  int32_t* decode_tokens() { return tok_dev_.get(); }
  void set_decode_tokens(const std::vector<int32_t>& toks);
  // The greedy tokens of the logits the last forward() returned ([seqs, vocab]) into the decode tokens.
  void greedy_from_last_logits(int seqs);
  // The same with temperature / top-k / top-p sampling on the GPU, u[b] uniform in [0, 1) per sequence.
  void sample_from_last_logits(int seqs, const GpuSamplingParams& p, const std::vector<float>& u);
  std::vector<int32_t> get_decode_tokens(int seqs) const;
  // The logits of the last decode step (device, [seqs, vocab]); valid until the next step or forward().
  const float* decode_logits() const { return logits_.get(); }
  cudaStream_t stream() const { return stream_; }
  // How often decode_step_greedy captured a graph (once per batch / width / cache; replays reuse it, also after
  // steps at other widths in between).
  int graph_captures() const { return graph_captures_; }
  // Decode graphs kept at most (continuous batching: 11 buckets up to 64 rows, times the widths served).
  static constexpr size_t kMaxDecodeGraphs = 64;
  size_t cached_graphs() const { return graphs_.size(); }
  void synchronize() const;

  // Stage timing (CUDA events at the stages of every layer: norms, q/k/v, RoPE + KV store, attention, o, gate/up,
  // SwiGLU, down, head). Uncaptured forwards record events as they go; graph decode steps run a graph of their own
  // with the events as nodes, so a replay is timed as it runs. take_profile() returns milliseconds per stage summed
  // since enable_profile(true) (or the last take_profile()), and resets them.
  void enable_profile(bool on);
  std::vector<std::pair<std::string, double>> take_profile();

 private:
  void init_common();
  // The constructors' body: every weight of ws uploaded, dense tensors as fp32 from cpu when given, else converted
  // from the file.
  void load(const WeightSet& ws, const Model* cpu, const std::function<void()>& after_tensor);
  void ensure_workspace(int rows, int seqs, bool all_logits);
  void ensure_attn_scratch(int rows, int splits);
  void invalidate_graph();
  // The fields and buffers both cache forms share: `blocks` blocks of `block` positions (new_cache: one per sequence).
  GpuKVCache cache_of_blocks(int seqs, int capacity, int blocks, int block) const;
  void upload_table(GpuKVCache& cache);   // a paged cache's table, when it changed since the last upload
  void note_dense_layers();
  bool runs_int8_gemv(int bits, int rows) const;   // some linear takes the int8 GEMV at this width and batch
  // x_max: the rows' exact max |x| (packed_matmul), or null.
  // acts != nullptr: l is a QUIK weight whose activations were quantized into acts by their producer (quik.h).
  void run_linear(const GpuLinear& l, const float* x, const __half* xh, int64_t m, float* y, int bits, const float* x_max = nullptr,
                  const void* acts = nullptr);
  // The QUIK weight whose activation quantization the RMSNorm before ls (q / k / v or gate / up), or SwiGLU before
  // down, produces for all of them: every one a QUIK weight quantizing alike (quik_same_activations) from rows of
  // `width`; null where that does not hold or the producers' quantization is off.
  const DevicePackedWeight* quik_act_target(const std::vector<const GpuLinear*>& ls, int64_t width) const;
  // The same whether or not the producers' quantization is on (sizing quik_acts_).
  const DevicePackedWeight* quik_act_shared(const std::vector<const GpuLinear*>& ls, int64_t width) const;
  // ls (q / k / v, or gate / up) in one launch where packed_group_runs serves them (biases added after); false: not run.
  bool run_group(const std::vector<const GpuLinear*>& ls, const float* x, int64_t m, const std::vector<float*>& ys, const float* x_max);
  // The body shared by forward() and the captured decode step: positions/sequence ids already on the device.
  void forward_device(int rows, int seqs, int n, GpuKVCache& cache, bool all_logits, int bits, int splits);
  // A decode step of rows whose tokens (tok_dev_), sequence ids and positions are on the device already, replayed
  // from a graph keyed by (rows, bits, cache, argmax) when use_graph; argmax: greedy tokens into tok_dev_.
  void decode_rows(GpuKVCache& cache, int rows, int bits, bool use_graph, bool argmax);

  // q/k/v and gate/up stacked into one linear each (qkv, gate_up; n == 0 when not) where their weights allow it:
  // all fp16, or all any-precision with the same parent (2/4/16 weights each permute their inputs their own way and
  // stay separate). One GEMV over the stacked rows instead of three or two: fewer launches, and larger matrices run
  // closer to the copy bandwidth. The parts then hold no weights.
  struct Layer {
    DeviceBuffer<float> attn_norm, ffn_norm;
    GpuLinear q, k, v, o, gate, up, down;
    GpuLinear qkv, gate_up;
  };
  void fuse_linears();
  // The linears that hold the layer's weights (the stacked ones in place of their parts).
  static std::vector<const GpuLinear*> linears(const Layer& L);
  // The o projection whose input attention can quantize (a QUIK weight, the producers' switch on), or null.
  const DevicePackedWeight* quik_attention_target(const Layer& L) const;
  ModelConfig c_;
  cudaStream_t stream_ = nullptr;
  int sms_ = 1;   // multiprocessors of the device (attention's key splitting)
  std::unique_ptr<GemmContext> gemm_;
  std::vector<DeviceBuffer<__half>> dense_;     // fp16 weights (embedding first)
  const __half* emb_ = nullptr;
  DeviceBuffer<float> final_norm_, rope_cos_, rope_sin_;
  GpuLinear head_;
  std::vector<Layer> layers_;
  uint32_t widths_ = 0;
  int dequantized_linears_ = 0;
  bool dense_layers_ = false;   // some q/k/v/gate/up linear runs on cuBLAS: the norms also write fp16
  // Workspace.
  int ws_rows_ = 0, ws_logit_rows_ = 0;
  DeviceBuffer<__half> xnh_;   // xn_ in fp16 (dense linears' input)
  DeviceBuffer<float> xmax_;   // [3][kMaxGemvBatch]: the rows' max |x| slots of forward_device
  DeviceBuffer<float> x_, xn_, q_, kk_, vv_, att_, g_, u_, tmp_, logits_, attn_scratch_, nll_;
  DeviceBuffer<uint8_t> quik_acts_;   // the producers' QUIK activation quantization (quik_act_target)
  DeviceBuffer<unsigned> sink_done_;  // attention's row-group counts when it quantizes for the o projection
  DeviceBuffer<float> qkv_, gu_;   // outputs of the stacked linears [rows, qd + 2 kvd] / [rows, 2 hidden]
  DeviceBuffer<int32_t> tok_in_, seq_dev_, pos_dev_, tok_dev_, hit_;
  DeviceBuffer<int32_t> row_bits_dev_;   // a mixed-width decode step's width per row
  bool mixed_ = false;                   // the forward being run or captured is a mixed-width step
  DeviceBuffer<uint64_t> argmax_keys_;   // [logit rows][kArgmaxSlices]: the split argmax's partial keys
  DeviceBuffer<float> u_dev_;
  struct StageTimer;
  std::unique_ptr<StageTimer> prof_;
  void mark(const char* stage);
  // The captured decode graphs, one per (sequences, width, cache, GEMM scratch, PDL classes), so that a request at
  // another any-precision width replays its own graph instead of re-capturing (kMaxDecodeGraphs, least recently used
  // evicted first; graphs over a GEMM scratch that has since grown are dropped, they can never match again).
  struct DecodeGraph {
    cudaGraphExec_t exec = nullptr;
    int seqs = -1, bits = -1, capacity = -1;
    bool argmax = true;
    bool mixed = false;   // per-row widths (row_bits_dev_), bits the widest
    uint64_t cache = 0;   // GpuKVCache::id
    uint64_t gemm_gen = 0;
    unsigned pdl = 0;   // the PDL kernel classes the graph was captured with (0: none; backend_cuda/common/launch.cuh)
    uint64_t last_use = 0;
  };
  std::vector<DecodeGraph> graphs_;
  uint64_t graph_clock_ = 0;
  int decode_seqs_ = 0, graph_captures_ = 0;
};

}  // namespace lowbit::cuda
