// Process memory as the kernel accounts it: what MFU-style reports call "memory".
#include "jumbo/obs/memory.h"

#include <cstdio>
#include <sys/resource.h>
#include <unistd.h>

namespace jumbo {

uint64_t peak_rss_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

uint64_t current_rss_bytes() {
  // statm: size resident shared text lib data dt, all in pages.
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (!statm) return 0;
  unsigned long long size_pages = 0, resident_pages = 0;
  const int fields = std::fscanf(statm, "%llu %llu", &size_pages, &resident_pages);
  std::fclose(statm);
  if (fields != 2) return 0;
  return static_cast<uint64_t>(resident_pages) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace jumbo
