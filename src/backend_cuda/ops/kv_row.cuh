// Where the KV cache keeps a position (KvMap, gpu_ops.h): shared by the attention kernels and the KV store.
#pragma once
#include <cstdint>

#include "backend_cuda/ops/gpu_ops.h"

namespace lowbit::cuda {

// The cache row (in units of kv_dim elements) of position pos of sequence seq in `layer`.
__device__ __forceinline__ int64_t kv_row(const KvMap& m, int seq, int layer, int pos) {
  const int blk = m.table != nullptr ? __ldg(m.table + static_cast<int64_t>(seq) * m.max_blocks + (pos >> m.shift)) : seq;
  return (static_cast<int64_t>(blk) * m.layers + layer) * m.block + (pos & static_cast<int>((1u << m.shift) - 1u));
}

}  // namespace lowbit::cuda
