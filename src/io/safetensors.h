// safetensors reader/writer. Format: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data section. The reader maps the file and validates: header inside the file, JSON well formed,
// known dtype, offsets inside the data section, size == numel * itemsize, no two tensors overlapping.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mmap_file.h"
#include "core/tensor.h"

namespace lowbit {

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;   // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::shared_ptr<MappedFile> file() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsWriteTensor {
  std::string name;
  DType dtype;                  // F32, F16, BF16, I8, I16, I32, I64, U8, F64, BOOL
  std::vector<int64_t> shape;
  const void* data;             // numel * itemsize bytes, not owned
};
// Writes atomically (temp file + rename) so an interrupted write never leaves a half file under `path`.
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace lowbit
