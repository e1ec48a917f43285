// The process's resident memory, read from /proc/self/status (Linux), for measuring what loading a model costs.
//
// VmHWM (the peak resident set) counts the pages of memory-mapped model files, which are page cache the kernel
// can drop at any time: loading a 13 GB fp16 file by mmap shows ~13 GB of VmHWM however little the loader
// allocates. RssAnon counts only the process's own (heap, stack, driver) pages: what a loader must keep small.
// The kernel keeps no peak of RssAnon, so a loader samples it (AnonRssPeak) at its high points, e.g. after each
// tensor's conversion while its scratch is still alive.
#pragma once
#include <cstdint>

namespace lowbit {

struct RssSnapshot {
  uint64_t rss_bytes = 0;        // VmRSS: resident now (anonymous + file + shared memory)
  uint64_t anon_bytes = 0;       // RssAnon: anonymous pages resident now
  uint64_t file_bytes = 0;       // RssFile: pages of mapped files resident now (page cache)
  uint64_t peak_rss_bytes = 0;   // VmHWM: the peak of VmRSS since the process started
};

// 0 in every field where /proc/self/status is unavailable or lacks the line (not Linux, old kernels).
RssSnapshot read_rss();
// VmHWM in bytes (0 when unknown).
uint64_t peak_rss_bytes();
// RssAnon in bytes (0 when unknown).
uint64_t anon_rss_bytes();

// The largest RssAnon seen by sample(), starting from the value at construction.
class AnonRssPeak {
 public:
  AnonRssPeak();
  void sample();
  uint64_t start_bytes() const { return start_; }
  uint64_t peak_bytes() const { return peak_; }

 private:
  uint64_t start_ = 0, peak_ = 0;
};

}  // namespace lowbit
