#include "jumbo/model/stage.h"

#include "jumbo/model/decoder.h"
#include "jumbo/model/transformer.h"

namespace jumbo {

// Every family the spec's components describe runs on the one transformer; a family with
// another block (mixture-of-experts, say) is another ModelStage chosen here.
std::unique_ptr<ModelStage> make_model_stage(const ModelConfig& cfg, const StageOptions& opts,
                                             Backend& backend, Comm& tp) {
  return std::make_unique<TransformerStage>(cfg, opts, backend, tp);
}

std::unique_ptr<DecodeStage> make_decode_stage(const ModelConfig& cfg, const StageOptions& stage,
                                               const DecodeShape& shape, Backend& backend,
                                               Comm& tp) {
  return std::make_unique<TransformerDecoder>(cfg, stage, shape, backend, tp);
}

}  // namespace jumbo
