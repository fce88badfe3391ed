// Small helpers on the config types; loading is in load.cpp, checks in validate.cpp.
#include "jumbo/config/config.h"

namespace jumbo {

const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
  }
  return "unknown";
}

}  // namespace jumbo
