// One front end over the devices a model runs on. perplexity() and generate() (and a server) are written once over
// Backend; a backend brings the model's forward pass, its KV caches and its way of picking tokens:
//   CpuBackend  (runtime/cpu_backend.h)               the fp32 Model of src/model, OpenBLAS + OpenMP;
//   CudaBackend (backend_cuda/model/cuda_backend.h)   cuda::GpuModel, loaded straight from the file (no fp32 copy of
//                                                      the model in host memory), fp16 weights or packed kernels.
// open_backend() reads the file once and hands its WeightSet to the device chosen. perplexity(Backend&, ...) and
// generate(Backend&, ...) are declared in runtime/perplexity.h and runtime/generate.h (included here).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weight_set.h"
#include "runtime/generate.h"
#include "runtime/perplexity.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace lowbit {

enum class Device { Auto, Cpu, Cuda };
const char* device_option_name(Device d);   // "auto", "cpu", "cuda"

struct BackendOptions {
  Device device = Device::Auto;
  LoadOptions load;
  bool reference = false;   // CPU only: every forward through the scalar oracle (Model::forward_ref; tests)
};

// What loading cost: wall time and host memory. peak_anon_rss_bytes is the largest RssAnon (core/rss.h) seen
// during the load (the CUDA backend samples it after every tensor's upload, while its conversion scratch is still
// alive; the CPU backend once the model is loaded); anon_rss_before_bytes is RssAnon when the load began, so the
// load's own peak is the difference. vm_hwm_bytes is VmHWM after the load, which also counts mapped file pages.
struct LoadStats {
  double seconds = 0;
  uint64_t anon_rss_before_bytes = 0, peak_anon_rss_bytes = 0, vm_hwm_bytes = 0;
};

// One sequence's KV cache on the backend's device: positions [0, length()) filled, room for capacity().
class Sequence {
 public:
  virtual ~Sequence();
  virtual int capacity() const = 0;
  virtual int length() const = 0;
};

// Positions per block of continuous batching's paged KV cache (BatchCache).
inline constexpr int kKvBlock = 16;
// Blocks for `slots` sequences of `capacity` positions each, all full.
inline int full_kv_blocks(int slots, int capacity) { return slots * ((capacity + kKvBlock - 1) / kKvBlock); }

// The KV cache of continuous batching (runtime/batch.h), paged: a pool of blocks of block_size() positions shared by
// `slots` sequences of up to capacity() positions each. A sequence holds a table of the blocks it fills (position p
// lives in block table[p / block_size()]), taken from the pool as it grows (reserve()) and given back when it ends or
// ends (clear()), so the pool holds what the sequences use, not slots x capacity. The backends'
// batch_extend / batch_verify / batch_decode refuse positions a slot has not reserved: running out of blocks is the
// scheduler's decision (runtime/batch.h waits or preempts), never a write past a sequence's blocks.
class BatchCache {
 public:
  BatchCache(int slots, int capacity, int blocks, int block_size);
  virtual ~BatchCache();
  BatchCache(const BatchCache&) = delete;
  BatchCache& operator=(const BatchCache&) = delete;
  int slots() const { return static_cast<int>(tables_.size()); }
  int capacity() const { return capacity_; }   // positions per sequence at most
  int block_size() const { return block_; }
  int blocks_total() const { return blocks_; }
  int blocks_free() const { return static_cast<int>(free_.size()); }
  int blocks_held(int slot) const { return static_cast<int>(tables_[checked(slot)].size()); }
  int reserved(int slot) const { return blocks_held(slot) * block_; }   // positions the slot can fill
  // Blocks a sequence of `positions` positions needs.
  int blocks_for(int positions) const { return (positions + block_ - 1) / block_; }
  // Makes room for `positions` positions (<= capacity()) in the slot, taking free blocks as needed; false, with
  // nothing taken, when too few are free.
  bool reserve(int slot, int positions);
  virtual int length(int slot) const = 0;      // positions filled in the slot
  void clear(int slot);                        // empties the slot; its blocks go back to the pool
  // Keeps the slot's first `length` positions (<= length(slot)), its blocks still reserved: speculative decoding
  // drops rejected draft tokens and fills their positions again next round.
  void truncate(int slot, int length);
  virtual uint64_t bytes() const = 0;          // memory the cache holds now
  // The backends: throws unless the slot has reserved `positions` positions.
  void check_room(int slot, int positions) const;
  const std::vector<int32_t>& table(int slot) const { return tables_[checked(slot)]; }

 protected:
  virtual void set_length(int slot, int length) = 0;
  virtual void table_changed(int slot) = 0;    // the slot's block table changed (the GPU uploads it)
  size_t checked(int slot) const;

 private:
  int capacity_, block_, blocks_;
  std::vector<std::vector<int32_t>> tables_;   // each reserved to capacity / block entries: data() never moves
  std::vector<int32_t> free_;                  // a stack: the block freed last is taken first
};

// Negative log-likelihood summed over a window's predicted positions and how many of them the model ranked first.
struct WindowScore {
  double nll_sum = 0;
  int64_t top1_hits = 0;
};

// Token by token generation on one sequence. The backend picks how for the whole generation from the sampling
// parameters, so that each device takes its fastest exact path (the GPU: argmax on the device and CUDA-graph decode
// steps for greedy decoding without a repetition penalty; its own sampling kernel, seeded like the CPU Sampler, for
// temperature / top-k / top-p; the CPU Sampler on downloaded logits with a repetition penalty).
class Decoder {
 public:
  virtual ~Decoder();
  // Runs the prompt at the start of the sequence (which must be empty) and keeps its last position's logits.
  virtual void prefill(std::span<const int32_t> prompt) = 0;
  // The next token from the last logits. history = the prompt and every token generated so far (the repetition
  // penalty reads it).
  virtual int32_t next(const std::vector<int32_t>& history) = 0;
  // Runs `token` (normally the one next() returned) at the next position, producing the logits next() reads.
  virtual void advance(int32_t token) = 0;
  // Waits until the device has finished the work queued so far (timings).
  virtual void wait() = 0;
};

class Backend {
 public:
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual std::string device_name() const = 0;   // "cpu" or "cuda: NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"
  virtual const ModelConfig& config() const = 0;
  virtual bool has_tokenizer() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;   // throws lowbit::Error when the file has none
  virtual std::vector<int> widths() const = 0;      // any-precision widths served; empty = single precision
  virtual void check_bits(int bits) const = 0;      // one-line error unless 0 or a served width
  virtual uint64_t weight_bytes_per_token(int bits) const = 0;   // weight bytes one decode step reads at that width
  virtual LoadStats load_stats() const = 0;

  // The file it was loaded from, as given, and its format.
  const std::string& path() const { return path_; }
  ModelFormat model_format() const { return format_; }

  // A KV cache for one sequence of up to `capacity` positions (at most the model's max_seq_len).
  virtual std::unique_ptr<Sequence> new_sequence(int capacity) = 0;
  // Scores tokens as one window from a fresh context, in seq (its contents are replaced; tokens.size() <= its
  // capacity, >= 2): every position t < n-1 predicts token t+1. reference: the scalar oracle forward (CPU only).
  virtual WindowScore score_window(Sequence& seq, std::span<const int32_t> tokens, int bits, bool reference) = 0;
  // A decoder that generates into seq at width `bits` (0: the widest), picking tokens as `sampling` says.
  virtual std::unique_ptr<Decoder> new_decoder(Sequence& seq, const SamplingParams& sampling, int bits) = 0;

  // --- continuous batching (runtime/batch.h) ---
  // KV bytes one position of one sequence takes on this device (every layer's K and V).
  virtual uint64_t kv_bytes_per_position() const = 0;
  // slots sequences of up to capacity positions each, sharing a pool of `blocks` blocks of kKvBlock positions
  // (0: enough for every slot to fill its capacity).
  virtual std::unique_ptr<BatchCache> new_batch_cache(int slots, int capacity, int blocks = 0) = 0;
  // KV bytes this device could give a batch cache now (the GPU: its free memory less a margin for the forward's
  // workspace; the CPU: unbounded, its pool pages are committed as they are written).
  virtual uint64_t kv_bytes_available() const = 0;
  // Runs tokens (a prompt, or a chunk of one) at the end of the slot's sequence at width `bits` (the positions
  // reserved: BatchCache::reserve); the last position's logits into logits [vocab] (host memory) when not null.
  virtual void batch_extend(BatchCache& cache, int slot, std::span<const int32_t> tokens, int bits, float* logits) = 0;
  // batch_extend with every position's logits: logits [tokens.size(), vocab] (host memory). Speculative decoding
  // verifies a draft with it.
  virtual void batch_verify(BatchCache& cache, int slot, std::span<const int32_t> tokens, int bits, float* logits) = 0;
  // One decode step of several sequences: tokens[i] at the end of slots[i] (distinct slots) at width bits[i] (one
  // entry: every row's). logits [logit_rows, vocab] (host memory) receives the first logit_rows rows' logits; greedy
  // (when not null) receives every row's argmax token (the first index of the largest logit), so that rows decoded
  // greedily need no logits copied (the GPU picks them on the device). Rows of different widths run in one forward
  // where the device can (the GPU: packed_matmul_mixed), else one forward per width. Returns the forwards it ran.
  virtual int batch_decode(BatchCache& cache, std::span<const int> slots, std::span<const int32_t> tokens,
                           std::span<const int> bits, float* logits, size_t logit_rows, int32_t* greedy) = 0;

 protected:
  Backend(std::string path, ModelFormat format) : path_(std::move(path)), format_(format) {}

 private:
  std::string path_;
  ModelFormat format_;
};

// Reads the model file and opens it on a device.
// Auto: the GPU when one is present, the build has CUDA, every packed format of the model runs there
//       (formats/format_table.h: GpuSupport other than None; QUIK does not yet) and reference is off; else the CPU.
// Cuda: exactly the GPU, or a one-line error: built without CUDA, no device (and why), a format without a GPU path
//       (naming the tensor), reference requested.
// Cpu:  the CPU.
// A missing or malformed file fails with the reader's one-line error (for Cuda, after the build and device checks).
std::unique_ptr<Backend> open_backend(const std::string& path, const BackendOptions& opts);

// The CPU backend over a model file (what open_backend gives for Device::Cpu).
std::unique_ptr<Backend> open_cpu_backend(WeightSet ws, const BackendOptions& opts);
// The packed weight of ws that keeps it off the GPU (formats/format_table.h gpu_refusal), or "" when every one runs there.
std::string first_cpu_only_weight(const WeightSet& ws);

// How open_backend reaches the CUDA backend, which lives in a library of its own (lowbit_cuda): a build with CUDA
// defines open_backend there and passes these; a build without passes none.
struct CudaBackendHooks {
  bool (*available)(std::string* why);
  std::unique_ptr<Backend> (*open)(WeightSet ws, const BackendOptions& opts);
};
std::unique_ptr<Backend> open_backend_with(const std::string& path, const BackendOptions& opts,
                                           const CudaBackendHooks* cuda);

}  // namespace lowbit
