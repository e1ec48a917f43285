// The element-wise and attention kernels of the GPU forward pass (backend_cuda/model/gpu_model.cu). Activations are fp32
// [rows, width] row-major; the KV cache is fp16. Each op's CPU twin is the same step of Model::forward
// (src/model/forward.cpp); tests/test_cuda_model.cpp compares whole forwards.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lowbit::cuda {

struct QuikRowSink;   // quik.h: the attention output quantized for a QUIK o projection inside attention

// x [rows, dim] = fp32(emb[tokens[r]]) (emb fp16 [vocab, dim]).
void embed_rows(const __half* emb, const int32_t* tokens, int rows, int dim, float* x, cudaStream_t s);
// Per row: x += delta when delta != nullptr (the residual add, written back), then y = x / rms(x) * w (fp32,
// sum of squares accumulated per thread then reduced); also yh = fp16(y) when yh != nullptr.
// xmax != nullptr: xmax[r] = max |y[r]| (exact, NaN propagating: the int8 GEMV's column scale, packed_matmul's x_max);
// zero != nullptr: zero[r] = 0 (a slot that SwiGLU or attention atomically take the max into later in the step).
// Both need rmsnorm_writes_xmax(dim).
void rmsnorm(float* x, const float* delta, const float* w, float* y, __half* yh, int rows, int dim, float eps,
             cudaStream_t s, float* xmax = nullptr, float* zero = nullptr);
bool rmsnorm_writes_xmax(int dim);
// Where the KV cache keeps position pos of sequence seq in layer `layer`: caches are [blocks][layers][block][kv_dim]
// fp16 (k and v alike), the position in block table[seq * max_blocks + pos / block] at row pos % block of it. A
// contiguous cache (table == nullptr) is the case of one block of `block` = capacity positions per sequence, block
// seq: no table read. Paged caches (continuous batching) have blocks of 2^shift >= 16 positions.
struct KvMap {
  const int32_t* table = nullptr;
  int max_blocks = 1;
  int shift = 31;   // log2 of the block's positions (paged); 31 contiguous (pos >> 31 == 0)
  int block = 0;    // positions per block
  int layers = 0;
};
// Rotates q [rows, heads * hd] into q_out (compact rows; q_out == q with q_ld == heads * hd rotates in place) and
// k [rows, kv_heads * hd] (Hugging Face half-split pairs) at per-row positions pos[r] with tables cos/sin
// [max_pos, hd/2], and stores the rotated k and v as fp16 into the KV cache (map): row r goes to sequence seq[r],
// position pos[r] of `layer`. Rows of q are q_ld floats apart, rows of k and v kv_ld
// (all three views of one fused q/k/v output: q_ld = kv_ld = its width).
void rope_kv_store(const float* q, int64_t q_ld, const float* k, const float* v, int64_t kv_ld, float* q_out,
                   const int32_t* seq, const int32_t* pos, int rows, int heads, int kv_heads, int hd, const float* cos_t,
                   const float* sin_t, int layer, const KvMap& map, __half* kc, __half* vc, cudaStream_t s);
// Causal GQA attention of q [rows, heads * hd] (row r: sequence seq[r] at position pos[r], keys 0..pos[r], or the
// last `window` of them when window > 0) against the cache; out [rows, heads * hd]. Keys are split over `splits`
// blocks per (row, head) when splits > 1 (flash-decoding), partial results combined by a second kernel in
// `scratch` (>= rows * heads * splits * (hd + 2) floats). single_token: every row is its sequence's only new
// position (a decode step), so the cache holds every other key it reads from earlier kernels: the decode form loads
// them before waiting on the kernel before (launch.cuh), and only position pos[r] after.
// xmax_bits != nullptr: the max |out| of each row taken atomically into xmax_bits[r] (the bits of a non-negative
// float, NaN on top; the slot zeroed before): exact, as rmsnorm's xmax.
// RoPE and the KV store folded into decode attention (attention_folds_rope): the q / k / v rows as the linears wrote
// them (rows q_ld / kv_ld floats apart), the rotation tables, and the cache the new keys and values are written to.
// Each block rotates its head's q; the blocks whose key range holds the new position take its key and value from k / v
// (rounded to fp16 as rope_kv_store stores them) and one block per kv head writes them to the cache.
struct RopeIn {
  const float* q = nullptr;
  int64_t q_ld = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t kv_ld = 0;
  const float* cos_t = nullptr;
  const float* sin_t = nullptr;
  __half* kc = nullptr;
  __half* vc = nullptr;
};
// Whether attention() can take a RopeIn for this call: one new token per sequence, a decode grid (rows <= 8), head
// dimension 64 or 128, and the fold on (LOWBIT_FOLD_ROPE=0 in the environment turns it off, read once;
// set_fold_rope() overrides it: bench --e2e times both in one run, a captured decode graph is keyed on it).
bool attention_folds_rope(int rows, int hd, bool single_token);
bool fold_rope_enabled();
void set_fold_rope(bool on);
// Whether attention() over this many key splits merges them inside the kernel, in thread-block clusters of the splits
// of one row and head (2..8 splits; the first block reads the others' partials from their shared memory), instead of a
// combine kernel after it: on unless LOWBIT_CLUSTER_COMBINE=0 in the environment (read once); set_cluster_combine()
// overrides it (bench --e2e times both in one run, a captured decode graph is keyed on it).
bool attention_combines_in_cluster(int splits);
bool cluster_combine_enabled();
void set_cluster_combine(bool on);
// rope != nullptr (attention_folds_rope): q is ignored (rope->q is rotated in the kernel) and rope_kv_store must not
// have run for this step's positions.
// sink != nullptr (quik_row_sink for `rows` rows, heads * hd == sink->w.k): out is written as without it, and each row,
// once its heads are all written, is quantized into the sink (a row per group; the combine kernel, the cluster's first
// block or, unsplit, the head's block counts).
void attention(const float* q, const int32_t* seq, const int32_t* pos, int rows, int heads, int kv_heads, int hd,
               int layer, const KvMap& map, int window, const __half* kc, const __half* vc, float* out,
               int splits, float* scratch, bool single_token, cudaStream_t s, unsigned* xmax_bits = nullptr,
               const RopeIn* rope = nullptr, const QuikRowSink* sink = nullptr);
// Prefill attention on tensor cores (prefill_attention.cu): the rows of `seqs` sequences of n new tokens each, row
// b * n + i at position pos[b * n] + i of sequence seq[b * n] (the forward's layout), keys and mask as attention()'s;
// head dimension 64 or 128. q and the softmax weights are each split into fp16 hi + lo for the tensor cores (fp32
// accumulation). attention_on_tensor_cores(n, hd): whether the forward takes it for a step of n tokens per sequence
// (n >= 16, head dim 64 or 128, LOWBIT_TC_ATTENTION not 0; set_tc_attention() overrides it: tests and bench compare
// both kernels). sink: as attention()'s, a query tile of 64 rows per group; the grid then runs a tile's heads side by
// side (head fastest) so that its last block comes soon after its first and finds the rows in L2.
void prefill_attention(const float* q, const int32_t* seq, const int32_t* pos, int seqs, int n, int heads, int kv_heads,
                       int hd, int layer, const KvMap& map, int window, const __half* kc, const __half* vc, float* out,
                       cudaStream_t s, const QuikRowSink* sink = nullptr);
bool attention_on_tensor_cores(int n, int hd);
bool tc_attention_enabled();
void set_tc_attention(bool on);
// out [rows, width] = silu(g) * u, g and u rows ld floats apart (the two halves of a fused gate/up output: ld =
// 2 width; out may be g when ld == width).
// xmax_bits: as attention's (width a multiple of 32).
void swiglu_rows(const float* g, const float* u, int64_t ld, float* out, int rows, int64_t width, cudaStream_t s,
                 unsigned* xmax_bits = nullptr);
void add_bias_rows(float* y, const float* bias, int rows, int n, cudaStream_t s);   // y[r] += bias
// Per row r < rows: nll[r] = logsumexp(logits[r]) - logits[r][target[r]], hit[r] = argmax == target (ties: lowest).
void nll_rows(const float* logits, const int32_t* target, int rows, int vocab, float* nll, int* hit, cudaStream_t s);
// out[r] = argmax of logits[r] (lowest index on ties; NaN never chosen). With scratch (rows * kArgmaxSlices words)
// and a vocabulary of at least kArgmaxSplitVocab, each row is split over kArgmaxSlices blocks and combined by a
// second kernel (the same answer); otherwise one block per row.
inline constexpr int kArgmaxSlices = 32, kArgmaxSplitVocab = 16384;
void argmax_rows(const float* logits, int rows, int vocab, int32_t* out, cudaStream_t s, uint64_t* scratch = nullptr);
// pos[i] += 1 for i < count (advances a decode step inside a captured graph).
void increment(int32_t* pos, int count, cudaStream_t s);

}  // namespace lowbit::cuda
