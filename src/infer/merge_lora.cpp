#include "jumbo/infer/merge_lora.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/ckpt/resolve.h"
#include "jumbo/infer/whole_checkpoint.h"
#include "jumbo/model/layer.h"
#include "jumbo/model/lora.h"
#include "jumbo/model/spec.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/plan/storage.h"

namespace jumbo {
namespace {

// The whole tensors of one tp 1 x pp 1 x dp 1 stage (every weight, or with `lora` its
// adapters), their masters read from `ckpt` into host memory at the plan's flat offsets.
struct WholeStage {
  StagePlan plan;
  std::vector<float> master;
  std::vector<PieceData> pieces;  // for saving, pointing into master

  WholeStage(const ModelConfig& model, const LoraShape& lora, const ResolvedCheckpoint& ckpt)
      : plan(plan_stage(model, Layout{}, StepShape{.lora = lora}, GridCoords{})),
        master(static_cast<size_t>(plan.params.total_numel()), 0.0f) {
    std::vector<PieceData> load;
    for (StatePiece& sp : state_pieces(plan.params, plan.optimizer_ranges, StateUse::load)) {
      load.push_back({std::move(sp.piece), {master.data() + sp.flat, nullptr, nullptr}});
    }
    load_checkpoint_pieces(*ckpt.storage, ckpt.dir, ckpt.manifest, load);
    for (StatePiece& sp : state_pieces(plan.params, plan.optimizer_ranges, StateUse::save)) {
      pieces.push_back({std::move(sp.piece), {master.data() + sp.flat, nullptr, nullptr}});
    }
  }
  float* tensor(const std::string& name, int64_t& rows, int64_t& cols) {
    for (size_t i = 0; i < plan.params.size(); ++i) {
      const ParamInfo& p = plan.params.info(static_cast<int>(i));
      if (p.name != name) continue;
      rows = p.slice.shape[0];
      cols = p.slice.shape.size() > 1 ? p.slice.shape[1] : 1;
      return master.data() + p.flat_offset;
    }
    throw std::logic_error("merge_lora: no tensor " + name);
  }
};

}  // namespace

ColumnBlocks lora_delta_rows(const ModelConfig& model, LoraTarget target) {
  // q, k and v adapt their rows of the grouped q/k/v weight (tp 1: the whole model's).
  const bool qkv_part = target == LoraTarget::q || target == LoraTarget::k || target == LoraTarget::v;
  return qkv_part ? lora_output_blocks(model_spec(model), target) : ColumnBlocks{};
}

void add_lora_delta(float* w, int64_t in, const float* a, const float* b, int64_t b_rows,
                    int64_t r, float scale, const ColumnBlocks& part) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < b_rows; ++o) {
    const int64_t row = part.block == 0 ? o : part.first + o / part.block * part.period + o % part.block;
    for (int64_t k = 0; k < r; ++k) {
      const float bk = scale * b[o * r + k];
      for (int64_t i = 0; i < in; ++i) w[row * in + i] += bk * a[k * in + i];
    }
  }
}

LoraMergeStats merge_lora(const std::string& adapter_path, const std::string& out_root,
                          const S3Options& s3) {
  const bool root_existed = check_new_checkpoint_root(out_root);
  const ResolvedCheckpoint adapter = resolve_checkpoint(adapter_path, s3);
  const Manifest& am = adapter.manifest;
  const std::string where = "--adapter " + adapter_path;
  if (am.lora.rank <= 0 || am.init_from.from.empty()) {
    check_adapter_base(am, where, Manifest{}, "");  // names what is missing
  }
  const ResolvedCheckpoint base = resolve_checkpoint(am.init_from.from, s3);
  check_adapter_base(am, where, base.manifest, "the base " + am.init_from.from);

  LoraMergeStats stats;
  stats.adapter = adapter.storage->url(adapter.dir);
  stats.base = base.storage->url(base.dir);
  stats.lora = am.lora;
  WholeStage weights(am.model, LoraShape{}, base);
  WholeStage adapters(am.model, am.lora, adapter);
  stats.adapter_params = adapters.plan.params.total_numel();
  const float scale = static_cast<float>(am.lora.scale());
  for (int64_t layer = 0; layer < am.model.layers; ++layer) {
    for (LoraTarget t : kLoraTargets) {
      if (!am.lora.targets.has(t)) continue;
      int64_t out = 0, in = 0, r = 0, r2 = 0, out2 = 0, in2 = 0;
      float* w = weights.tensor(lora_base_name(layer, t), out, in);
      const float* a = adapters.tensor(lora_param_name(layer, t, false), r, in2);
      const float* b = adapters.tensor(lora_param_name(layer, t, true), out2, r2);
      const ColumnBlocks part = lora_delta_rows(am.model, t);
      if (in2 != in || r2 != r || (part.block == 0 ? out2 != out : out2 % part.block != 0)) {
        throw std::logic_error("merge_lora: shapes");
      }
      add_lora_delta(w, in, a, b, out2, r, scale, part);
      ++stats.merged_maps;
    }
  }
  Manifest header;  // a start (step 0) whose weights came from the adapters on their base
  header.model = am.model;
  header.precision = Precision::fp32;
  header.tokenizer = base.manifest.tokenizer;
  header.data_train = am.data_train;
  header.chat_template = am.chat_template;
  header.init_from = {stats.adapter, am.progress.step, weights_fingerprint(am)};
  std::vector<TensorPiece> pieces;
  for (const PieceData& pd : weights.pieces) pieces.push_back(pd.piece);
  size_t next = 0;  // write_whole_checkpoint asks for the pieces in their order
  stats.bytes = write_whole_checkpoint(
      out_root, root_existed, pieces,
      [&](const TensorPiece& piece, float* master) {
        const PieceData& pd = weights.pieces.at(next++);
        std::copy(pd.state[0], pd.state[0] + piece.count(), master);
      },
      std::move(header), {});
  stats.checkpoint_dir = (std::filesystem::path(out_root) / checkpoint_dir_name(0)).string();
  return stats;
}

}  // namespace jumbo
