// Read-only memory-mapped file. Loaders hand out pointers into the mapping (zero copy); every offset
// taken from a file header must be checked with in_bounds() before it is dereferenced.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace lowbit {

class MappedFile {
 public:
  // Throws lowbit::Error("<path>: cannot open: <reason>") on failure. Empty files map to size 0.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // True when [offset, offset+length) lies inside the file, with overflow-safe arithmetic.
  bool in_bounds(uint64_t offset, uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lowbit
