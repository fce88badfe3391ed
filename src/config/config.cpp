// Small helpers on the config types; loading is in load.cpp, checks in validate.cpp.
#include "jumbo/config/config.h"

#include <fmt/format.h>

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

const char* to_string(CommEmulation e) {
  switch (e) {
    case CommEmulation::none: return "none";
    case CommEmulation::nccl: return "nccl";
  }
  return "unknown";
}

const char* to_string(Norm n) { return n == Norm::rmsnorm ? "rmsnorm" : "layernorm"; }
const char* to_string(PositionEncoding p) { return p == PositionEncoding::rope ? "rope" : "learned"; }
const char* to_string(RopeScaling r) { return r == RopeScaling::llama3 ? "llama3" : "none"; }
const char* to_string(Mlp m) { return m == Mlp::swiglu ? "swiglu" : "gelu"; }

const char* to_string(FineTune f) {
  switch (f) {
    case FineTune::none: return "none";
    case FineTune::full: return "full";
    case FineTune::lora: return "lora";
  }
  return "?";
}

const char* to_string(LoraTarget t) {
  switch (t) {
    case LoraTarget::qkv: return "qkv";
    case LoraTarget::proj: return "proj";
    case LoraTarget::fc1: return "fc1";
    case LoraTarget::fc2: return "fc2";
    case LoraTarget::q: return "q";
    case LoraTarget::k: return "k";
    case LoraTarget::v: return "v";
    case LoraTarget::gate: return "gate";
    case LoraTarget::up: return "up";
  }
  return "?";
}

int64_t LoraTargetSet::count() const {
  int64_t n = 0;
  for (LoraTarget t : kLoraTargets) n += has(t) ? 1 : 0;
  return n;
}

std::optional<LoraTargetSet> parse_lora_targets(std::string_view list) {
  LoraTargetSet set = LoraTargetSet::none();
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    bool known = false;
    for (LoraTarget t : kLoraTargets) {
      if (name != to_string(t)) continue;
      if (set.has(t)) return std::nullopt;  // a repeat is a typo, not a wider set
      set.add(t);
      known = true;
    }
    if (!known) return std::nullopt;
    if (comma == std::string_view::npos) return set;
    list.remove_prefix(comma + 1);
  }
}

std::optional<LoraTargetSet> parse_lora_targets(std::string_view list, const ModelConfig& model) {
  if (list == "all") return every_lora_target(model);
  return parse_lora_targets(list);
}

LoraTargetSet every_lora_target(const ModelConfig& model) {
  static constexpr LoraTarget gelu[] = {LoraTarget::qkv, LoraTarget::proj, LoraTarget::fc1,
                                        LoraTarget::fc2};
  static constexpr LoraTarget swiglu[] = {LoraTarget::q,    LoraTarget::k,  LoraTarget::v,
                                          LoraTarget::proj, LoraTarget::gate, LoraTarget::up,
                                          LoraTarget::fc2};
  LoraTargetSet set = LoraTargetSet::none();
  if (model.mlp == Mlp::swiglu) {
    for (LoraTarget t : swiglu) set.add(t);
  } else {
    for (LoraTarget t : gelu) set.add(t);
  }
  return set;
}

LoraTargetSet adaptable_lora_targets(const ModelConfig& model) {
  LoraTargetSet set = every_lora_target(model);
  for (LoraTarget t : {LoraTarget::qkv, LoraTarget::q, LoraTarget::k, LoraTarget::v}) set.add(t);
  return set;
}

std::string lora_targets_problem(LoraTargetSet targets, const ModelConfig& model) {
  if (model.mlp == Mlp::swiglu && targets.has(LoraTarget::fc1)) {
    return "fc1 with model.mlp = \"swiglu\": expected gate and up (SwiGLU's two up maps)";
  }
  if (model.mlp == Mlp::gelu && (targets.has(LoraTarget::gate) || targets.has(LoraTarget::up))) {
    return "gate or up with model.mlp = \"gelu\": expected fc1 (a GELU MLP has one up map)";
  }
  if (targets.has(LoraTarget::qkv) &&
      (targets.has(LoraTarget::q) || targets.has(LoraTarget::k) || targets.has(LoraTarget::v))) {
    return "qkv with q, k or v: expected the whole map or its parts, not both";
  }
  return "";
}

std::string describe(LoraTargetSet targets) {
  std::string out;
  for (LoraTarget t : kLoraTargets)
    if (targets.has(t)) out += fmt::format("{}{}", out.empty() ? "" : ", ", to_string(t));
  return out;
}

LoraShape FinetuneConfig::lora(const ModelConfig& model) const {
  if (method != FineTune::lora) return {};
  return {lora_rank, lora_alpha,
          parse_lora_targets(lora_targets, model).value_or(every_lora_target(model))};
}

}  // namespace jumbo
