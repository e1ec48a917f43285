// The fp32 KV cache of one sequence on the CPU. Contiguous: k and v are [n_layers][capacity][kv_dim], owned. Paged
// (continuous batching's BatchCache on the CPU): positions live in blocks of a pool shared by many sequences, the pool
// [blocks][n_layers][block][kv_dim], position p in block table[p / block].
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
  // Paged: the pool and this sequence's block table (null: contiguous).
  float* pool_k = nullptr;
  float* pool_v = nullptr;
  const int32_t* table = nullptr;
  int block = 0;

  KVCache() = default;
  KVCache(int layers, int cap, int kvd)
      : n_layers(layers), capacity(cap), kv_dim(kvd),
        k(static_cast<size_t>(layers) * cap * kvd), v(static_cast<size_t>(layers) * cap * kvd) {}
  bool paged() const { return table != nullptr; }
  float* k_at(int layer, int pos) { return paged() ? paged_at(pool_k, layer, pos) : k.data() + offset(layer, pos); }
  float* v_at(int layer, int pos) { return paged() ? paged_at(pool_v, layer, pos) : v.data() + offset(layer, pos); }
  void clear() { len = 0; }

 private:
  size_t offset(int layer, int pos) const { return (static_cast<size_t>(layer) * capacity + pos) * kv_dim; }
  float* paged_at(float* pool, int layer, int pos) const {
    const size_t b = static_cast<size_t>(table[pos / block]);
    return pool + ((b * n_layers + layer) * block + pos % block) * kv_dim;
  }
};

}  // namespace lowbit
