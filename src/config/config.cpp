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

const char* to_string(AnomalyAction a) {
  switch (a) {
    case AnomalyAction::stop: return "stop";
    case AnomalyAction::skip: return "skip";
    case AnomalyAction::rewind: return "rewind";
  }
  return "unknown";
}

const char* to_string(AnomalyKind k) {
  switch (k) {
    case AnomalyKind::nonfinite: return "nonfinite";
    case AnomalyKind::spike: return "spike";
  }
  return "unknown";
}

const char* to_string(ExpectNetwork e) {
  switch (e) {
    case ExpectNetwork::any: return "any";
    case ExpectNetwork::efa: return "efa";
    case ExpectNetwork::ib: return "ib";
    case ExpectNetwork::socket: return "socket";
  }
  return "unknown";
}

}  // namespace jumbo
