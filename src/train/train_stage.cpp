#include "jumbo/train/train_stage.h"

#include <utility>

namespace jumbo {
namespace {
// The weights are initialized before the gradient sync and the optimizer are built on them
// (AdamW's mixed-precision master starts from their values).
ModelStage& initialized(ModelStage& model, uint64_t seed) {
  model.initialize(seed);
  return model;
}
}  // namespace

TrainStage::TrainStage(RankStage place, const ModelConfig& model, const TrainConfig& train,
                       Backend& backend)
    : place_(std::move(place)),
      model_(make_model_stage(model, place_.options(), backend, place_.groups().tp)),
      grad_sync_(initialized(*model_, train.seed).trained_params(), place_.groups(), place_.plan()),
      optimizer_(model_->trained_params(), backend, train, place_.plan()),
      pipeline_(*model_, place_.groups().pp, place_.plan()) {}

TrainStage solo_train_stage(const ModelConfig& model, const Layout& layout,
                            const StepShape& shape, const TrainConfig& train, Backend& backend) {
  return TrainStage(solo_rank_stage(model, layout, shape), model, train, backend);
}

}  // namespace jumbo
