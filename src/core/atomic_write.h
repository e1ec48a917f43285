// Atomic file output: the bytes go to a temp file beside `path`, are flushed to disk, and are renamed over `path`,
// so a reader (or a crash) never sees a half-written file and an existing file is only replaced when the new one
// is complete. Used by every writer (safetensors, GGUF, tokenizer/config JSON).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lowbit {

// Throws lowbit::Error("<path>: cannot write: <reason>").
void write_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& pieces);
inline void write_atomically(const std::string& path, std::string_view bytes) {
  write_atomically(path, {{bytes.data(), bytes.size()}});
}

}  // namespace lowbit
