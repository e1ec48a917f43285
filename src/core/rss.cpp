#include "core/rss.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace lowbit {

RssSnapshot read_rss() {
  RssSnapshot s;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return s;
  char line[256];
  // Lines look like "VmHWM:\t  123456 kB".
  auto field = [&](const char* key, uint64_t* out) {
    const size_t n = std::strlen(key);
    if (std::strncmp(line, key, n) != 0) return;
    unsigned long long kb = 0;
    if (std::sscanf(line + n, " %llu", &kb) == 1) *out = static_cast<uint64_t>(kb) * 1024;
  };
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    field("VmRSS:", &s.rss_bytes);
    field("RssAnon:", &s.anon_bytes);
    field("RssFile:", &s.file_bytes);
    field("VmHWM:", &s.peak_rss_bytes);
  }
  std::fclose(f);
  return s;
}

uint64_t peak_rss_bytes() { return read_rss().peak_rss_bytes; }

uint64_t anon_rss_bytes() { return read_rss().anon_bytes; }

AnonRssPeak::AnonRssPeak() : start_(anon_rss_bytes()), peak_(start_) {}

void AnonRssPeak::sample() { peak_ = std::max(peak_, anon_rss_bytes()); }

}  // namespace lowbit
