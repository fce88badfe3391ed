#include "jumbo/config/layout.h"

#include <fmt/format.h>

namespace jumbo {

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "unknown";
}

const char* to_string(Device d) {
  switch (d) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "unknown";
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
