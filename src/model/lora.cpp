#include "jumbo/model/lora.h"

#include <fmt/format.h>

#include <cmath>

#include "jumbo/model/spec.h"

namespace jumbo {
namespace {

// Adapters are matrices: they decay as the base's matrices do.
ParamInfo lora_matrix(std::string name, std::vector<int64_t> global, std::vector<int64_t> offset,
                      std::vector<int64_t> local, InitKind init, float std, bool replicated) {
  return make_param(std::move(name), std::move(global), std::move(offset), std::move(local), init,
                    std, true, replicated);
}

const char* map_name(LoraTarget t) {
  switch (t) {
    case LoraTarget::qkv: return "attn.qkv";
    case LoraTarget::proj: return "attn.proj";
    case LoraTarget::fc1: return "mlp.fc1";
    case LoraTarget::fc2: return "mlp.fc2";
    case LoraTarget::q: return "attn.q";
    case LoraTarget::k: return "attn.k";
    case LoraTarget::v: return "attn.v";
    case LoraTarget::gate: return "mlp.gate";
    case LoraTarget::up: return "mlp.up";
  }
  return "?";
}

}  // namespace

int64_t lora_output_width(const ModelSpec& m, LoraTarget t) {
  switch (t) {
    case LoraTarget::qkv: return m.qkv_width();
    case LoraTarget::q: return m.heads * m.head_dim;
    case LoraTarget::k:
    case LoraTarget::v: return m.kv_heads * m.head_dim;
    case LoraTarget::fc1: return m.up_width();
    case LoraTarget::gate:
    case LoraTarget::up: return m.ffn;
    case LoraTarget::proj:
    case LoraTarget::fc2: return m.d_model;
  }
  return 0;
}

std::string lora_param_name(int64_t layer, LoraTarget target, bool b_matrix) {
  return fmt::format("layers.{}.{}.lora_{}", layer, map_name(target), b_matrix ? "b" : "a");
}

std::string lora_base_name(int64_t layer, LoraTarget target) {
  const bool qkv_part = target == LoraTarget::q || target == LoraTarget::k || target == LoraTarget::v;
  return fmt::format("layers.{}.{}.weight", layer, qkv_part ? "attn.qkv" : map_name(target));
}

std::vector<ParamInfo> lora_stage_params(const ModelConfig& cfg, const StageOptions& opts,
                                         int64_t tp_rank, int64_t tp_size) {
  std::vector<ParamInfo> out;
  const LoraShape& lora = opts.lora;
  if (lora.rank <= 0) return out;
  const ModelSpec m = model_spec(cfg, tp_size);
  const int64_t r = lora.rank, c = m.d_model, f = m.ffn;
  const int64_t num_layers = opts.num_layers < 0 ? cfg.layers - opts.first_layer : opts.num_layers;
  for (int64_t chunk = 0; chunk < opts.chunks; ++chunk) {
    const int64_t first = opts.first_layer + chunk * opts.chunk_stride;
    for (int64_t layer = first; layer < first + num_layers; ++layer) {
      for (LoraTarget t : kLoraTargets) {
        if (!lora.targets.has(t)) continue;
        const bool row_parallel = t == LoraTarget::proj || t == LoraTarget::fc2;
        const int64_t in = t == LoraTarget::fc2 ? f : t == LoraTarget::proj ? m.attn_width() : c;
        const int64_t outs = lora_output_width(m, t);
        const float a_std = 1.0f / std::sqrt(static_cast<float>(in));
        if (row_parallel) {  // A by input columns, B whole
          const int64_t in_local = in / tp_size;
          out.push_back(lora_matrix(lora_param_name(layer, t, false), {r, in}, {0, tp_rank * in_local},
                               {r, in_local}, InitKind::normal, a_std, false));
          out.push_back(lora_matrix(lora_param_name(layer, t, true), {outs, r}, {0, 0}, {outs, r},
                               InitKind::zeros, 0, true));
        } else {  // A whole (its gradient a partial sum over tp), B by output rows
          ParamInfo a = lora_matrix(lora_param_name(layer, t, false), {r, in}, {0, 0}, {r, in},
                               InitKind::normal, a_std, true);
          a.tp_partial_grad = tp_size > 1;
          out.push_back(a);
          const int64_t out_local = outs / tp_size;
          out.push_back(lora_matrix(lora_param_name(layer, t, true), {outs, r}, {tp_rank * out_local, 0},
                               {out_local, r}, InitKind::zeros, 0, false));
        }
      }
    }
  }
  return out;
}

std::vector<LoraLayerParams> lora_layer_index(const StageOptions& opts) {
  std::vector<LoraLayerParams> out;
  if (opts.lora.rank <= 0) return out;
  int next = 0;
  for (int64_t i = 0; i < opts.chunks * opts.num_layers; ++i) {
    LoraLayerParams lp;
    for (LoraTarget t : kLoraTargets) {
      if (!opts.lora.targets.has(t)) continue;
      lp.a[static_cast<size_t>(t)] = next++;
      lp.b[static_cast<size_t>(t)] = next++;
    }
    out.push_back(lp);
  }
  return out;
}

}  // namespace jumbo
