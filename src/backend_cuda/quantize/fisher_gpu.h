// The empirical Fisher diagonal of every linear weight on the GPU, streaming the model one block at a time: the same
// quantity as fisher_diagonal() (model/backward.h) — F[W] = Σ_s (dLoss_s/dW)², Loss_s the mean next-token
// cross-entropy of window s — computed in fp32 with cuBLAS (default math, no TF32), for models whose weights and
// activations do not fit on the device together (Llama-2-70B within a 40 GiB peak).
//
// Flow (fisher_gpu.cu has the design block):
//   forward   embed every window, then block l = 0..L-1 over every window, storing block inputs (checkpoints)
//   head      final norm + head, loss and the gradient at the top of the residual stream, for every window
//   backward  block l = L-1..0: recompute the block forward of each window from its stored input with the
//             intermediates kept, backpropagate (backward_ops.h), square each window's weight gradients into the
//             block's accumulators; hand the block's diagonals to the caller, free them.
// Each block's weights are loaded twice (forward, backward), converted from the file as stored (block_loader.h); the
// next block loads on a worker thread while the current one computes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/weight_set.h"

namespace lowbit::cuda {

struct FisherGpuOptions {
  // Bytes of stored activations (block inputs and the running gradient, each [Σ window tokens, dim] fp32) kept on the
  // device; the rest goes to pinned host memory. 0: automatic, the free device memory less what the pass needs
  // besides, capped so that the whole pass stays under kFisherAutoDevicePeak (fisher_gpu.cu).
  size_t device_activation_budget = 0;
  // Pinned host bytes for the activations beyond the device budget. 0: automatic, 60% of the host's available memory.
  // When device + host cannot hold every block's input, only every K-th block input is stored and the blocks between
  // two stored inputs are recomputed in the backward (K as small as fits; one more forward per recomputed block).
  size_t host_activation_budget = 0;
};

struct FisherGpuReport {
  double mean_loss = 0;                 // mean over windows of Loss_s (fisher_diagonal's mean_loss)
  int sequences = 0;                    // windows
  double forward_seconds = 0;           // embedding, forward blocks and head
  double backward_seconds = 0;          // backward blocks with their recompute, without the time spent in on_block
  size_t peak_device_bytes = 0;         // device memory in use (cudaMemGetInfo), the largest value seen
  size_t host_spill_bytes = 0;          // pinned host memory holding activations
  size_t device_activation_bytes = 0;   // stored activations on the device
  int checkpoint_interval = 1;          // K: every K-th block input stored (1: all of them, no recompute)
};

// Called once per block, in order L-1 .. 0, on the calling thread, with the block's 7 Fisher diagonals on the host,
// canonical names -> [n*k] row-major (same layout as the CPU FisherDiag). The callee may std::move the vectors out.
using FisherBlockFn = std::function<void(int layer, std::map<std::string, std::vector<float>>& diag)>;

// windows: token ids, each 2..max_seq_len long (lengths may differ), ids in [0, vocab). ws: a full-precision model
// (no packed weights). progress(done, total), on the calling thread, counts block passes: L forward, the recomputed
// ones, L backward. Throws lowbit::Error for bad input, a missing device or too little memory (naming what is needed).
FisherGpuReport fisher_diagonal_gpu(const WeightSet& ws, const std::vector<std::vector<int32_t>>& windows,
                                    const FisherBlockFn& on_block, const FisherGpuOptions& opts = {},
                                    const std::function<void(int done, int total)>& progress = nullptr);

}  // namespace lowbit::cuda
