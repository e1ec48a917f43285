// Streaming weights onto the GPU (block_loader.h).
#include "backend_cuda/quantize/block_loader.h"

#include "model/weight_convert.h"

namespace lowbit::cuda {

DeviceF32 upload_tensor_f32(const WeightSet& ws, const std::string& name, const std::vector<int64_t>& shape,
                            bool qk_rows, std::vector<float>& host_scratch, cudaStream_t stream) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const float* src = tensor_as_f32(ws, name, shape, qk_rows, host_scratch);
  DeviceF32 out(static_cast<size_t>(n));
  // Synchronous on purpose: host_scratch is reused by the next call.
  LOWBIT_CUDA_CHECK(cudaMemcpyAsync(out.get(), src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice,
                                    stream));
  LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

std::array<std::string, 7> block_linear_names(int layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  return {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
          p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight",    p + "mlp.up_proj.weight",
          p + "mlp.down_proj.weight"};
}

BlockWeightsF32 DeviceBlock::view() const {
  BlockWeightsF32 v;
  v.attn_norm = attn_norm.get();
  v.ffn_norm = ffn_norm.get();
  v.wq = linear[0].get();
  v.wk = linear[1].get();
  v.wv = linear[2].get();
  v.wo = linear[3].get();
  v.wg = linear[4].get();
  v.wu = linear[5].get();
  v.wd = linear[6].get();
  v.bq = bq.size() ? bq.get() : nullptr;
  v.bk = bk.size() ? bk.get() : nullptr;
  v.bv = bv.size() ? bv.get() : nullptr;
  return v;
}

void DeviceBlock::replace(int i, DeviceF32 w) {
  LOWBIT_CHECK(i >= 0 && i < 7 && w.size() == linear[static_cast<size_t>(i)].size(), "DeviceBlock::replace: ",
               names[static_cast<size_t>(i)], " needs ", linear[static_cast<size_t>(i)].size(), " values, got ",
               w.size());
  linear[static_cast<size_t>(i)] = std::move(w);
}

DeviceBlock load_block_f32(const WeightSet& ws, int layer, std::vector<float>& host_scratch, cudaStream_t stream) {
  const ModelConfig& c = ws.config;
  LOWBIT_CHECK(layer >= 0 && layer < c.n_layers, ws.path, ": no block ", layer);
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim;
  DeviceBlock b;
  b.layer = layer;
  b.names = block_linear_names(layer);
  const std::array<std::vector<int64_t>, 7> shapes = {std::vector<int64_t>{qd, dim}, {kvd, dim}, {kvd, dim},
                                                      {dim, qd}, {hid, dim}, {hid, dim}, {dim, hid}};
  for (size_t i = 0; i < 7; ++i) {
    b.shapes[i] = shapes[i];
    b.linear[i] = upload_tensor_f32(ws, b.names[i], shapes[i], i < 2, host_scratch, stream);
  }
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  b.attn_norm = upload_tensor_f32(ws, p + "input_layernorm.weight", {dim}, false, host_scratch, stream);
  b.ffn_norm = upload_tensor_f32(ws, p + "post_attention_layernorm.weight", {dim}, false, host_scratch, stream);
  if (c.qkv_bias) {
    b.bq = upload_tensor_f32(ws, p + "self_attn.q_proj.bias", {qd}, true, host_scratch, stream);
    b.bk = upload_tensor_f32(ws, p + "self_attn.k_proj.bias", {kvd}, true, host_scratch, stream);
    b.bv = upload_tensor_f32(ws, p + "self_attn.v_proj.bias", {kvd}, false, host_scratch, stream);
  }
  return b;
}

}  // namespace lowbit::cuda
