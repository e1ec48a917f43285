// A non-owning view of a tensor inside a mapped file (or inside a buffer the loader owns).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace lowbit {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;   // outermost first, PyTorch order: a linear weight is [n_out, k_in]
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[576, 1536]"

}  // namespace lowbit
