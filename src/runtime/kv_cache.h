// Contiguous fp32 KV cache for one sequence on the CPU: k and v are [n_layers][capacity][kv_dim].
#pragma once
#include <cstdint>
#include <vector>

namespace lowbit {

struct KVCache {
  int n_layers = 0;
  int capacity = 0;   // max positions
  int kv_dim = 0;
  int len = 0;        // positions filled so far (the next token goes at position len)
  std::vector<float> k, v;

  KVCache() = default;
  KVCache(int layers, int cap, int kvd)
      : n_layers(layers), capacity(cap), kv_dim(kvd),
        k(static_cast<size_t>(layers) * cap * kvd), v(static_cast<size_t>(layers) * cap * kvd) {}
  float* k_at(int layer, int pos) { return k.data() + (static_cast<size_t>(layer) * capacity + pos) * kv_dim; }
  float* v_at(int layer, int pos) { return v.data() + (static_cast<size_t>(layer) * capacity + pos) * kv_dim; }
  void clear() { len = 0; }
};

}  // namespace lowbit
