// The empirical Fisher diagonal on the GPU (fisher_gpu.h), streaming the model block by block.
//
// Design. fisher_diagonal() (CPU) runs forward + backward one window at a time with the whole model resident. Here
// the outer loop is over blocks and the inner one over windows, so that only one block's weights (plus the next,
// loading on a worker thread) and one block's Fisher accumulators (plus the last block's, being copied out) are on
// the device at a time:
//
//   forward   X_0 = embed(windows); for l = 0..L-1: X_{l+1} = block_l(X_l), each window through block_forward_f32
//   head      per window: final norm, logits in row chunks, cross-entropy (loss, dlogits), dX_L = the gradient at
//             the top of the residual stream
//   backward  for l = L-1..0: per window, block_forward_f32 again from X_l with saving on (the intermediates of one
//             window: [heads, T, T] probabilities included), block_backward_f32 (backward_ops.h): dX_l from
//             dX_{l+1} in place, and each linear's dW = dYᵀX squared into the block's 7 accumulators; then the
//             accumulators go to the host and the caller (on_block), and are freed.
//
// Activations. Every stored tensor is one "slot": [Σ window tokens, dim] fp32, windows end to end. Slot R holds the
// running residual in the forward and the running gradient dX afterwards; checkpoint slots hold block inputs X_l.
// A slot lives on the device or in pinned host memory; windows are staged through two device window buffers (xw:
// the block input, dxw: its gradient) with cudaMemcpyAsync on the one stream, so a host slot costs a PCIe copy per
// window per block: 8 MB for 7B at T = 512 (~0.4 ms at 25 GB/s) against ~16 ms of the window's backward, a few %.
// Those copies are not overlapped with compute (one stream): not worth a second stream at that ratio.
// Sizes at 100 windows x 512 tokens: 7B 0.84 GB a slot, 33 slots (27.7 GB), all on the device under the 40 GB cap;
// 70B 1.68 GB a slot, 81 slots (136 GB) at K = 1: more than a 128 GB host pins, so K = 2 below (42 slots, ~14 on
// the device beside ~15 GB of weights, accumulators and workspace, ~47 GB pinned on the host).
//
// Checkpoint interval K. When device + host budgets cannot hold a slot for every block input (70B on a 128 GB host),
// only X_0, X_K, X_2K, ... are stored; the backward of segment [a, b) first recomputes X_{a+1}..X_{b-1} from X_a
// into K-1 segment slots (one more forward of those blocks, and one more load of their weights), then runs the
// segment's blocks backward as above. Slots: 1 + ceil(L/K) + (K-1), the smallest K that fits is used. The recomputed
// inputs are bit-identical to the stored ones (same kernels, same inputs), so K changes no result.
//
// Weights. Each block is loaded twice (forward, backward; three times when recomputed), converted from the file as
// stored by load_block_f32 on a worker thread one block ahead of the compute (two blocks resident): for 7B from
// fp16, ~0.5 s a block of conversion that the GPU would otherwise wait for.
//
// Accumulators leave the device on a second helper thread while the GPU runs the next block (two sets resident):
// copying them into fresh host vectors inline cost 7B ~0.4 s a block and 70B ~1.7 s a block of idle GPU.
//
// Threads: the caller's thread queues all GPU work (one stream) and calls on_block and progress; the loader and the
// accumulator copies run on helper threads, each with its own stream.
//
// Cost, measured on an H200 (fp32 sgemm ~50 TFLOP/s at these shapes, T = 512): Llama-2-7B shape, 100 windows:
// 63 s — forward 0.44 s a block (~48 TFLOP/s over the linears), head ~1 s, backward 1.44 s a block (3.3x the
// forward: the recomputed forward, dX and dW sgemms, the squares); peak 29 GiB with every block input on the device.
// A 70B-shaped block (dim 8192, hidden 28672, 8 kv heads; a 4-block model of that shape): 2.0 s forward, 5.9 s
// backward, so ~11 min for 80 blocks and ~12 min at K = 2 (40 more block forwards); that 4-block run at K = 2 with
// 3 of its 4 slots pinned on the host took 45 s against 37.5 s at K = 1 all on the device.
//
// Numerics: fp32 everywhere, cuBLAS default math (no TF32), reductions in double, as the CPU backward.
#include "backend_cuda/quantize/fisher_gpu.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>

#include "backend_cuda/common/common.h"
#include "backend_cuda/common/owned_stream.h"
#include "backend_cuda/dense/dense.h"
#include "backend_cuda/quantize/backward_ops.h"
#include "backend_cuda/quantize/block_f32.h"
#include "backend_cuda/quantize/block_loader.h"
#include "core/error.h"
#include "model/weight_convert.h"

namespace lowbit::cuda {

namespace {

// Automatic device budget: the whole pass (weights, workspace, activations) stays under this, so that a 70B model
// runs beside other work on an 80 GB card; activations beyond it go to pinned host memory, which costs a few %
// (see the design block), not a failure.
constexpr size_t kFisherAutoDevicePeak = size_t{40} * 1000 * 1000 * 1000;
// Left free on the device by the automatic budget: cuBLAS workspaces, allocator rounding, the driver.
constexpr size_t kDeviceHeadroom = size_t{1} << 30;
// Share of the host's available memory the automatic host budget may pin.
constexpr double kAutoHostShare = 0.6;
// Logit rows per head chunk: at most this many floats of logits (256 MB), so a 128k vocabulary takes a 512-token
// window in one chunk and the buffer stays bounded for any vocabulary.
constexpr int64_t kHeadChunkFloats = int64_t{1} << 26;
// Accumulator offsets are rounded to this many floats, keeping every tensor 16-byte aligned for float4 access.
constexpr int64_t kAccumAlign = 64;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double gib(size_t b) { return static_cast<double>(b) / static_cast<double>(size_t{1} << 30); }

// MemAvailable from /proc/meminfo in bytes (0 when unknown).
size_t host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// Windows laid end to end: window s is rows [offset[s], offset[s] + len[s]) of every slot.
struct WindowLayout {
  std::vector<int64_t> offset;
  std::vector<int> len;
  int64_t rows = 0;
  int max_t = 0;
};

// One slot: [rows, dim] fp32 on the device or in pinned host memory (unified addressing: cudaMemcpyDefault moves
// windows either way).
class Slot {
 public:
  Slot(size_t floats, bool on_device) : device_(on_device) {
    if (device_) LOWBIT_CUDA_CHECK(cudaMalloc(&p_, floats * sizeof(float)));
    else LOWBIT_CUDA_CHECK(cudaMallocHost(&p_, floats * sizeof(float)));
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot() {
    if (p_ == nullptr) return;
    if (device_) cudaFree(p_);
    else cudaFreeHost(p_);
  }
  float* data() const { return p_; }

 private:
  float* p_ = nullptr;
  bool device_ = true;
};

// How the activations are stored.
struct Plan {
  int interval = 1;          // K: block inputs X_0, X_K, ... stored
  int checkpoints = 0;       // ceil(L / K)
  int slots = 0;             // 1 (R) + (K-1) segment slots + checkpoints
  int device_slots = 0;      // the first device_slots slots (R, segment, checkpoints) are on the device
  size_t slot_bytes = 0;
  size_t fixed_bytes = 0;    // device bytes besides the slots
};

int slots_needed(int L, int K) { return 1 + (L + K - 1) / K + (K - 1); }

// Device bytes of everything but the slots, at the larger of the backward and head phases.
size_t fixed_device_bytes(const ModelConfig& c, const WindowLayout& wl) {
  const size_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim, V = c.vocab_size;
  const size_t linears = (qd * dim + 2 * kvd * dim + dim * qd + 3 * hid * dim) * sizeof(float);
  const size_t block = linears + (2 * dim + (c.qkv_bias ? qd + 2 * kvd : 0)) * sizeof(float);
  const size_t max_linear = dim * std::max(qd, hid) * sizeof(float);
  const size_t work = BlockWorkspace::bytes_needed(c, wl.max_t, true);
  const size_t buffers = 2 * static_cast<size_t>(wl.max_t) * dim * sizeof(float) +
                         static_cast<size_t>(wl.rows) * (sizeof(double) + sizeof(int32_t)) +
                         7 * kAccumAlign * sizeof(float);
  const size_t chunk = static_cast<size_t>(std::clamp<int64_t>(kHeadChunkFloats / static_cast<int64_t>(V), 1,
                                                               std::max(1, wl.max_t - 1)));
  // Two blocks' weights (the next one loading) and two sets of accumulators (the last block's being copied out).
  const size_t backward = 2 * block + 2 * linears + max_linear + work + buffers;
  const size_t head = block + (V * dim + dim + chunk * V) * sizeof(float) + work + buffers;
  return std::max(backward, head) + (size_t{64} << 20);   // cuBLAS's workspace and small allocations
}

Plan plan_memory(const ModelConfig& c, const WindowLayout& wl, const FisherGpuOptions& opts, size_t free_b,
                 size_t used_b) {
  Plan p;
  const int L = c.n_layers;
  p.slot_bytes = static_cast<size_t>(wl.rows) * static_cast<size_t>(c.dim) * sizeof(float);
  p.fixed_bytes = fixed_device_bytes(c, wl);
  LOWBIT_CHECK(free_b > p.fixed_bytes, "fisher_diagonal_gpu: one block's weights, gradients and workspace need ",
               gib(p.fixed_bytes), " GiB of device memory, ", gib(free_b), " GiB are free");
  size_t dev_budget = opts.device_activation_budget;
  if (dev_budget == 0) {
    const size_t by_free = free_b > p.fixed_bytes + kDeviceHeadroom ? free_b - p.fixed_bytes - kDeviceHeadroom : 0;
    const size_t by_cap =
        kFisherAutoDevicePeak > used_b + p.fixed_bytes ? kFisherAutoDevicePeak - used_b - p.fixed_bytes : 0;
    dev_budget = std::min(by_free, by_cap);
  }
  size_t host_budget = opts.host_activation_budget;
  if (host_budget == 0) host_budget = static_cast<size_t>(kAutoHostShare * static_cast<double>(host_available_bytes()));
  const size_t dev_max = dev_budget / p.slot_bytes, host_max = host_budget / p.slot_bytes;
  for (int K = 1; K <= L; ++K) {
    if (static_cast<size_t>(slots_needed(L, K)) > dev_max + host_max) continue;
    p.interval = K;
    p.checkpoints = (L + K - 1) / K;
    p.slots = slots_needed(L, K);
    p.device_slots = static_cast<int>(std::min<size_t>(dev_max, static_cast<size_t>(p.slots)));
    LOWBIT_CHECK(p.fixed_bytes + p.device_slots * p.slot_bytes <= free_b, "fisher_diagonal_gpu: a device budget of ",
                 gib(dev_budget), " GiB for activations exceeds the ", gib(free_b - p.fixed_bytes),
                 " GiB free besides the pass's own ", gib(p.fixed_bytes), " GiB");
    return p;
  }
  int best = 1;
  for (int K = 2; K <= L; ++K)
    if (slots_needed(L, K) < slots_needed(L, best)) best = K;
  fail("fisher_diagonal_gpu: the activations of ", wl.offset.size() - 1, " windows (", wl.rows,
       " tokens) need at least ", slots_needed(L, best), " x ", gib(p.slot_bytes), " GiB (one block input in ", best,
       " stored), but the device budget is ", gib(dev_budget), " GiB and the host budget ", gib(host_budget),
       " GiB; use fewer or shorter windows");
}

// Loads blocks in a fixed order on a worker thread, one ahead of the consumer (two blocks on the device at once).
class BlockPrefetcher {
 public:
  BlockPrefetcher(const WeightSet& ws, std::vector<int> order) : ws_(ws), order_(std::move(order)) {
    LOWBIT_CUDA_CHECK(cudaGetDevice(&device_));
    LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    start();
  }
  BlockPrefetcher(const BlockPrefetcher&) = delete;
  BlockPrefetcher& operator=(const BlockPrefetcher&) = delete;
  ~BlockPrefetcher() {
    if (pending_.valid()) pending_.wait();
    cudaStreamDestroy(stream_);
  }
  // The next block of the order (it must be `layer`); starts loading the one after.
  DeviceBlock next(int layer) {
    LOWBIT_CHECK(next_ < order_.size() && order_[next_] == layer, "fisher_diagonal_gpu: block ", layer,
                 " requested out of the planned order");
    DeviceBlock b = pending_.get();
    ++next_;
    start();
    return b;
  }

 private:
  void start() {
    if (next_ >= order_.size()) return;
    const int layer = order_[next_];
    pending_ = std::async(std::launch::async, [this, layer] {
      LOWBIT_CUDA_CHECK(cudaSetDevice(device_));   // a new thread starts on device 0
      return load_block_f32(ws_, layer, scratch_, stream_);
    });
  }

  const WeightSet& ws_;
  std::vector<int> order_;
  size_t next_ = 0;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<float> scratch_;   // the worker's conversion buffer (one load in flight at a time)
  std::future<DeviceBlock> pending_;
};

// y [rows, n] = x [rows, k] Wᵀ: column-major yᵀ [n, rows] = (W-as-stored [k, n])ᵀ · x-as-stored [k, rows].
void linear_forward(cublasHandle_t h, const float* x, int rows, const float* w, int64_t n, int64_t k, float* y) {
  const float one = 1.0f, zero = 0.0f;
  cublas_check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), rows, static_cast<int>(k), &one, w,
                           static_cast<int>(k), x, static_cast<int>(k), &zero, y, static_cast<int>(n)),
               "fisher head logits");
}

void validate(const WeightSet& ws, const std::vector<std::vector<int32_t>>& windows) {
  const ModelConfig& c = ws.config;
  LOWBIT_CHECK(!windows.empty(), "fisher_diagonal_gpu: no calibration windows");
  LOWBIT_CHECK(ws.packed.empty(), ws.path, ": the Fisher pass needs full-precision weights; this model is already ",
               "quantized");
  c.validate(ws.path);
  for (size_t s = 0; s < windows.size(); ++s) {
    const std::vector<int32_t>& w = windows[s];
    LOWBIT_CHECK(w.size() >= 2, "fisher_diagonal_gpu: window ", s, " has ", w.size(),
                 " tokens; need at least 2 (one prediction)");
    LOWBIT_CHECK(static_cast<int64_t>(w.size()) <= c.max_seq_len, "fisher_diagonal_gpu: window ", s, " has ",
                 w.size(), " tokens, more than the model's maximum of ", c.max_seq_len, " positions");
    for (int32_t id : w)
      LOWBIT_CHECK(id >= 0 && id < c.vocab_size, "fisher_diagonal_gpu: token id ", id, " in window ", s,
                   " out of range [0, ", c.vocab_size, ")");
  }
}

}  // namespace

FisherGpuReport fisher_diagonal_gpu(const WeightSet& ws, const std::vector<std::vector<int32_t>>& windows,
                                    const FisherBlockFn& on_block, const FisherGpuOptions& opts,
                                    const std::function<void(int done, int total)>& progress) {
  validate(ws, windows);
  std::string why;
  LOWBIT_CHECK(device_available(&why), "fisher_diagonal_gpu: no usable CUDA device (", why, ")");
  const ModelConfig& c = ws.config;
  const int L = c.n_layers, S = static_cast<int>(windows.size());
  const int64_t dim = c.dim, V = c.vocab_size;

  WindowLayout wl;
  wl.offset.resize(static_cast<size_t>(S) + 1);
  wl.len.resize(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    wl.len[static_cast<size_t>(s)] = static_cast<int>(windows[static_cast<size_t>(s)].size());
    wl.offset[static_cast<size_t>(s) + 1] = wl.offset[static_cast<size_t>(s)] + wl.len[static_cast<size_t>(s)];
    wl.max_t = std::max(wl.max_t, wl.len[static_cast<size_t>(s)]);
  }
  wl.rows = wl.offset[static_cast<size_t>(S)];

  FisherGpuReport rep;
  rep.sequences = S;
  size_t free_b = 0, total_b = 0;
  LOWBIT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  auto sample = [&] {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) == cudaSuccess) rep.peak_device_bytes = std::max(rep.peak_device_bytes, t - f);
  };
  sample();
  const Plan plan = plan_memory(c, wl, opts, free_b, total_b - free_b);
  const int K = plan.interval;
  rep.checkpoint_interval = K;

  const OwnedStream owned_stream;
  const cudaStream_t stream = owned_stream.get();

  // Slots: 0 = R (running residual, then gradient), 1..K-1 = segment inputs X_{a+1}..X_{a+K-1}, then the
  // checkpoints X_0, X_K, ...; the first device_slots on the device.
  std::vector<std::unique_ptr<Slot>> slots;
  const size_t slot_floats = static_cast<size_t>(wl.rows) * static_cast<size_t>(dim);
  for (int i = 0; i < plan.slots; ++i) {
    const bool dev = i < plan.device_slots;
    slots.push_back(std::make_unique<Slot>(slot_floats, dev));
    (dev ? rep.device_activation_bytes : rep.host_spill_bytes) += plan.slot_bytes;
  }
  auto seg_slot = [&](int i) { return slots[static_cast<size_t>(i)]->data(); };               // i in 1..K-1
  auto ckpt_slot = [&](int l) { return slots[static_cast<size_t>(K + l / K)]->data(); };     // l % K == 0
  float* R = slots[0]->data();

  BlockWorkspace bws(c, wl.max_t, true);
  DeviceF32 xw(static_cast<size_t>(wl.max_t) * dim), dxw(static_cast<size_t>(wl.max_t) * dim);
  DeviceBuffer<int32_t> tokens(static_cast<size_t>(wl.rows));
  DeviceBuffer<double> row_loss(static_cast<size_t>(wl.rows));
  {
    std::vector<int32_t> all;
    all.reserve(static_cast<size_t>(wl.rows));
    for (const auto& w : windows) all.insert(all.end(), w.begin(), w.end());
    tokens.upload(all.data(), all.size());
  }
  sample();

  // Window s of a slot <-> a device window buffer, in stream order.
  auto rows_of = [&](float* slot, int s) { return slot + wl.offset[static_cast<size_t>(s)] * dim; };
  auto bytes_of = [&](int s) { return static_cast<size_t>(wl.len[static_cast<size_t>(s)]) * dim * sizeof(float); };
  auto fetch = [&](float* dst, float* slot, int s) {
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(dst, rows_of(slot, s), bytes_of(s), cudaMemcpyDefault, stream));
  };
  auto store = [&](float* slot, int s, const float* src) {
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(rows_of(slot, s), src, bytes_of(s), cudaMemcpyDefault, stream));
  };

  // Load order: forward 0..L-1; then per segment [a, b) from the top: recompute a..b-2, backward b-1..a.
  std::vector<int> order;
  int recomputed = 0;
  for (int l = 0; l < L; ++l) order.push_back(l);
  for (int a = (plan.checkpoints - 1) * K; a >= 0; a -= K) {
    const int b = std::min(a + K, L);
    for (int j = a; j + 1 < b; ++j, ++recomputed) order.push_back(j);
    for (int j = b - 1; j >= a; --j) order.push_back(j);
  }
  const int total_passes = 2 * L + recomputed;
  int passes = 0;
  auto step = [&] {
    ++passes;
    if (progress) progress(passes, total_passes);
  };
  BlockPrefetcher loader(ws, order);

  // Runs block blk over every window: input window s from `src`, output to `dst` (slots; may be the same).
  auto forward_all = [&](const DeviceBlock& blk, float* src, float* dst) {
    const BlockWeightsF32 w = blk.view();
    for (int s = 0; s < S; ++s) {
      fetch(xw.get(), src, s);
      block_forward_f32(w, xw.get(), wl.len[static_cast<size_t>(s)], bws, stream);
      store(dst, s, xw.get());
    }
  };

  // ---- forward ----
  const double t_forward = now_s();
  {
    std::vector<float> scratch;
    const float* emb = tensor_as_f32(ws, "model.embed_tokens.weight", {V, dim}, false, scratch);
    std::vector<float> rows(static_cast<size_t>(wl.max_t) * dim);
    float* x0 = ckpt_slot(0);
    for (int s = 0; s < S; ++s) {
      const std::vector<int32_t>& w = windows[static_cast<size_t>(s)];
      for (size_t t = 0; t < w.size(); ++t)
        std::memcpy(rows.data() + t * dim, emb + static_cast<int64_t>(w[t]) * dim,
                    static_cast<size_t>(dim) * sizeof(float));
      store(x0, s, rows.data());
      LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));   // `rows` is refilled for the next window
    }
  }
  for (int l = 0; l < L; ++l) {
    const DeviceBlock blk = loader.next(l);
    sample();
    float* src = l % K == 0 ? ckpt_slot(l) : R;
    float* dst = l + 1 < L && (l + 1) % K == 0 ? ckpt_slot(l + 1) : R;
    forward_all(blk, src, dst);
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    step();
  }

  // ---- head: loss and dX_L per window (R: X_L in, dX_L out) ----
  {
    std::vector<float> scratch;
    const std::string head_name = c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    const DeviceF32 head = upload_tensor_f32(ws, head_name, {V, dim}, false, scratch, stream);
    const DeviceF32 final_norm = upload_tensor_f32(ws, "model.norm.weight", {dim}, false, scratch, stream);
    const int chunk = static_cast<int>(std::clamp<int64_t>(kHeadChunkFloats / V, 1, std::max(1, wl.max_t - 1)));
    DeviceF32 logits(static_cast<size_t>(chunk) * V);
    sample();
    cublasHandle_t cb = bws.cublas();
    cublas_check(cublasSetStream(cb, stream), "cublasSetStream");
    float* xn = bws.xn;     // [T, dim] normed rows
    float* dxn = bws.tmp;   // [T, dim] their gradient
    for (int s = 0; s < S; ++s) {
      const int T = wl.len[static_cast<size_t>(s)], N = T - 1;
      const int64_t off = wl.offset[static_cast<size_t>(s)];
      fetch(xw.get(), R, s);
      rmsnorm_f32(xw.get(), final_norm.get(), xn, T, static_cast<int>(dim), c.rms_eps, stream);
      for (int r0 = 0; r0 < N; r0 += chunk) {
        const int rows = std::min(chunk, N - r0);
        linear_forward(cb, xn + static_cast<int64_t>(r0) * dim, rows, head.get(), V, dim, logits.get());
        cross_entropy_f32(logits.get(), tokens.get() + off + r0 + 1, rows, static_cast<int>(V), N,
                          row_loss.get() + off + r0, stream);
        linear_input_grad_f32(cb, logits.get(), head.get(), rows, V, dim, 0.0f, dxn + static_cast<int64_t>(r0) * dim);
      }
      // The last position predicts nothing: no gradient enters its row.
      LOWBIT_CUDA_CHECK(cudaMemsetAsync(dxn + static_cast<int64_t>(N) * dim, 0, dim * sizeof(float), stream));
      LOWBIT_CUDA_CHECK(cudaMemsetAsync(dxw.get(), 0, static_cast<size_t>(T) * dim * sizeof(float), stream));
      rmsnorm_backward_f32(xw.get(), final_norm.get(), dxn, dxw.get(), T, static_cast<int>(dim), c.rms_eps, stream);
      store(R, s, dxw.get());
    }
    std::vector<double> losses(static_cast<size_t>(wl.rows));
    LOWBIT_CUDA_CHECK(cudaMemcpyAsync(losses.data(), row_loss.get(), losses.size() * sizeof(double),
                                      cudaMemcpyDeviceToHost, stream));
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    double loss_sum = 0.0;
    for (int s = 0; s < S; ++s) {
      const int N = wl.len[static_cast<size_t>(s)] - 1;
      double loss = 0.0;
      for (int r = 0; r < N; ++r) loss += losses[static_cast<size_t>(wl.offset[static_cast<size_t>(s)] + r)];
      loss_sum += loss / static_cast<double>(N);
    }
    rep.mean_loss = loss_sum / S;
  }
  rep.forward_seconds = now_s() - t_forward;

  // ---- backward ----
  const double t_backward = now_s();
  double callback_s = 0;
  const size_t max_linear = static_cast<size_t>(dim) * static_cast<size_t>(std::max(c.q_dim(), c.hidden_dim));
  DeviceF32 dw(max_linear);
  int device = 0;
  LOWBIT_CUDA_CHECK(cudaGetDevice(&device));
  const OwnedStream owned_download_stream;
  const cudaStream_t download_stream = owned_download_stream.get();
  // A finished block's accumulators on their way to the host: a helper thread copies them into the vectors handed
  // to on_block while the GPU computes the next block (3.4 GB for a 70B block: ~1 s of page faults and pageable
  // copies the GPU would otherwise wait for); on_block runs on this thread once the next block's windows are queued.
  struct Handoff {
    int layer = -1;
    DeviceF32 acc;   // declared before `diag`: destroyed after the copy that reads it has finished
    std::future<std::map<std::string, std::vector<float>>> diag;
  };
  std::unique_ptr<Handoff> pending;
  auto deliver = [&] {
    if (!pending) return;
    std::map<std::string, std::vector<float>> diag = pending->diag.get();
    const double tc = now_s();
    if (on_block) on_block(pending->layer, diag);
    callback_s += now_s() - tc;
    pending.reset();
    step();
  };
  auto hand_off = [&](const DeviceBlock& blk, DeviceF32 acc, const std::array<float*, 7>& fisher) {
    auto h = std::make_unique<Handoff>();
    h->layer = blk.layer;
    h->acc = std::move(acc);
    cudaEvent_t done = nullptr;
    LOWBIT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    LOWBIT_CUDA_CHECK(cudaEventRecord(done, stream));
    std::array<size_t, 7> count{};
    for (size_t i = 0; i < 7; ++i) count[i] = static_cast<size_t>(blk.shapes[i][0] * blk.shapes[i][1]);
    h->diag = std::async(std::launch::async, [device, done, download_stream, names = blk.names, fisher, count] {
      struct EventGuard {
        cudaEvent_t e;
        ~EventGuard() { cudaEventDestroy(e); }
      } event_guard{done};
      LOWBIT_CUDA_CHECK(cudaSetDevice(device));
      std::map<std::string, std::vector<float>> diag;
      for (size_t i = 0; i < 7; ++i) diag[names[i]].resize(count[i]);   // page faults before the wait
      LOWBIT_CUDA_CHECK(cudaStreamWaitEvent(download_stream, done, 0));
      for (size_t i = 0; i < 7; ++i)
        LOWBIT_CUDA_CHECK(cudaMemcpyAsync(diag[names[i]].data(), fisher[i], count[i] * sizeof(float),
                                          cudaMemcpyDeviceToHost, download_stream));
      LOWBIT_CUDA_CHECK(cudaStreamSynchronize(download_stream));
      return diag;
    });
    pending = std::move(h);
  };
  for (int a = (plan.checkpoints - 1) * K; a >= 0; a -= K) {
    const int b = std::min(a + K, L);
    auto input_of = [&](int j) { return j == a ? ckpt_slot(a) : seg_slot(j - a); };
    for (int j = a; j + 1 < b; ++j) {   // X_{a+1} .. X_{b-1} from X_a
      const DeviceBlock blk = loader.next(j);
      sample();
      forward_all(blk, input_of(j), seg_slot(j + 1 - a));
      deliver();
      LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      step();
    }
    for (int j = b - 1; j >= a; --j) {
      const DeviceBlock blk = loader.next(j);
      const BlockWeightsF32 w = blk.view();
      std::array<int64_t, 7> at{};
      int64_t total = 0;
      for (size_t i = 0; i < 7; ++i) {
        at[i] = total;
        total += (blk.shapes[i][0] * blk.shapes[i][1] + kAccumAlign - 1) / kAccumAlign * kAccumAlign;
      }
      DeviceF32 acc(static_cast<size_t>(total));
      LOWBIT_CUDA_CHECK(cudaMemsetAsync(acc.get(), 0, acc.bytes(), stream));
      std::array<float*, 7> fisher{};
      for (size_t i = 0; i < 7; ++i) fisher[i] = acc.get() + at[i];
      sample();
      float* src = input_of(j);
      for (int s = 0; s < S; ++s) {
        const int T = wl.len[static_cast<size_t>(s)];
        fetch(xw.get(), src, s);
        block_forward_f32(w, xw.get(), T, bws, stream);
        fetch(dxw.get(), R, s);
        block_backward_f32(w, bws, T, dxw.get(), dw.get(), fisher, stream);
        store(R, s, dxw.get());
      }
      deliver();   // the block before, while this one's queued windows run
      hand_off(blk, std::move(acc), fisher);
      LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));   // before blk's weights are freed
    }
  }
  deliver();
  rep.backward_seconds = now_s() - t_backward - callback_s;
  sample();
  return rep;
}

}  // namespace lowbit::cuda
