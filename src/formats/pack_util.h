// Small helpers every packed format's packer and reader share.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace lowbit {

// An owned byte copy of v (kept alive by the caller's storage vector).
template <typename T>
std::shared_ptr<std::vector<uint8_t>> bytes_of(const std::vector<T>& v) {
  auto buf = std::make_shared<std::vector<uint8_t>>(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(buf->data(), v.data(), buf->size());
  return buf;
}

inline TensorView view_of(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          const std::shared_ptr<std::vector<uint8_t>>& buf) {
  return TensorView{name, dtype, std::move(shape), buf->data(), buf->size()};
}

// Parts may sit at any byte offset of a mapped file: read elements with memcpy, never through a cast pointer.
template <typename T>
T element(const TensorView& v, int64_t i) {
  T out;
  std::memcpy(&out, v.data + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return out;
}

}  // namespace lowbit
