// Streaming a model's weights onto the GPU one transformer block at a time, in fp32, for the quantizers: each
// tensor is converted from the file as stored (model/weight_convert.h: F32/F16/BF16/ggml blocks, or a random:
// source's generator) into a reused host buffer and copied up, so neither host nor device ever holds the whole
// model.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend_cuda/common/common.h"
#include "backend_cuda/quantize/block_f32.h"
#include "model/weight_set.h"

namespace lowbit::cuda {

// An owned fp32 device buffer (get(), size()).
using DeviceF32 = DeviceBuffer<float>;

// One tensor of ws as fp32 on the device (the same bits tensor_as_f32 gives the CPU model).
// host_scratch: reused between calls.
DeviceF32 upload_tensor_f32(const WeightSet& ws, const std::string& name, const std::vector<int64_t>& shape,
                            bool qk_rows, std::vector<float>& host_scratch, cudaStream_t stream);

// The weights of block `layer`, on the device. Linears in slot order q, k, v, o, gate, up, down (Model::linear_names).
struct DeviceBlock {
  int layer = 0;
  std::array<std::string, 7> names;                 // canonical weight names
  std::array<std::vector<int64_t>, 7> shapes;       // [n, k]
  std::array<DeviceF32, 7> linear;                  // device [n, k]
  DeviceF32 attn_norm, ffn_norm, bq, bk, bv;        // biases only when config.qkv_bias
  BlockWeightsF32 view() const;
  // Replaces linear i (slot order) by other weights of the same shape (the quantized ones: later blocks then see
  // what the quantized model computes).
  void replace(int i, DeviceF32 w);
};
DeviceBlock load_block_f32(const WeightSet& ws, int layer, std::vector<float>& host_scratch, cudaStream_t stream);

// The canonical names of block l's linears, in slot order.
std::array<std::string, 7> block_linear_names(int layer);

}  // namespace lowbit::cuda
