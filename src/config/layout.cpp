#include "jumbo/config/layout.h"

#include <fmt/format.h>

namespace jumbo {

// Names in enum order (the config loader reads them the same way).
const char* to_string(Recompute r) {
  constexpr const char* kNames[] = {"none", "selective", "full"};
  return kNames[static_cast<size_t>(r)];
}

const char* to_string(Device d) {
  constexpr const char* kNames[] = {"cpu", "cuda"};
  return kNames[static_cast<size_t>(d)];
}

std::string Layout::describe() const {
  std::string out = fmt::format("tp {} x pp {} x dp {}, micro batch {}, recompute {}", tp, pp,
                                dp, micro_batch, to_string(recompute));
  if (virtual_stages > 1) out += fmt::format(", {} chunks per stage", virtual_stages);
  if (zero1_active()) out += ", ZeRO-1";
  if (sequence_parallel_active()) out += ", sequence parallel";
  return out;
}

}  // namespace jumbo
