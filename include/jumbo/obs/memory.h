#pragma once
#include <cstdint>
namespace jumbo {
uint64_t peak_rss_bytes();     // the process's peak resident set (getrusage)
uint64_t current_rss_bytes();  // from /proc/self/statm
}  // namespace jumbo
