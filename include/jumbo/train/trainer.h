#pragma once
// Trainer: the step loop. Owns the model, optimizer, data and metrics of one run.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/comm/comm.h"
#include "jumbo/comm/grid.h"
#include "jumbo/config/config.h"
#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/sampler.h"
#include "jumbo/model/gpt.h"
#include "jumbo/obs/emf.h"
#include "jumbo/obs/metrics.h"
#include "jumbo/train/batch.h"
#include "jumbo/train/grad_sync.h"
#include "jumbo/train/optimizer.h"
#include "jumbo/train/schedule.h"
#include "jumbo/train/step.h"

namespace jumbo {

struct TrainSummary {
  int64_t steps = 0;        // the last step run (counting steps before a resume)
  int64_t first_step = 1;   // the first step this process ran (after a resume: its step + 1)
  double final_loss = 0;
  std::optional<double> final_val_loss;
  std::vector<double> losses;  // per step run by this process, for tests
  // A graceful stop (stop_signal.h): the signal, and whether a checkpoint of `steps` was saved.
  int stop_signal = 0;
  bool stop_saved = false;
  // Peak resident memory, the largest over the ranks, and the plan's estimate (fullest stage).
  uint64_t measured_peak_bytes = 0;
  double planned_bytes = 0;
};

class Trainer {
 public:
  // Validates the config against the world and the data (tokenizer, dataset headers) and
  // allocates everything; throws UserError on a mistake.
  Trainer(const RunConfig& cfg, Backend& backend, std::shared_ptr<Comm> world);
  ~Trainer();
  TrainSummary run();
  // Mean per-token loss over eval_batches microbatches of the validation set.
  double evaluate();
  GptModel& model() { return *model_; }
  Grid& grid() { return grid_; }

 private:
  void print(const std::string& line) const;
  void collect_comm_bytes(StepMetrics& m);
  // This rank's optimizer state as checkpoint pieces, and whether it writes them.
  std::vector<PieceData> checkpoint_pieces(bool for_saving);
  void upload_staged_state();  // after a load into the host copies of device state
  std::array<Tensor, 3> saved_state();  // master, Adam m, Adam v: what a checkpoint holds
  bool writes_checkpoint() const;
  void save_checkpoint(int64_t step, double lr, int64_t batch);
  void resume_from_checkpoint();
  // Estimated memory of this layout: on train.gpu (throws UserError if it cannot fit) and on
  // this CPU rank (compared with the measured peak at the end).
  void check_planned_memory();
  // After a stop signal: save (unless this step was just saved), wait, and report.
  void stop_for_signal(TrainSummary& summary, int signal, int64_t step, double lr, int64_t batch);

  RunConfig cfg_;
  Backend& backend_;
  std::shared_ptr<Comm> world_;
  Grid grid_;
  int64_t seq_;
  std::unique_ptr<GradSync> grad_sync_;
  StepGroups groups_;
  std::vector<int64_t> stage_layers_;
  std::vector<PipeOp> schedule_;
  int64_t schedule_micro_steps_ = -1;
  PipelineState pipeline_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<IndexedDataset> train_data_, valid_data_;
  std::unique_ptr<GptSampler> train_sampler_, valid_sampler_;
  std::unique_ptr<DatasetBatches> train_batches_, valid_batches_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<EmfLog> emf_;  // rank 0, when log.emf_file or log.emf_address is set
  std::unique_ptr<LrSchedule> lr_;
  std::unique_ptr<BatchRamp> ramp_;
  std::vector<int32_t> tokens_, targets_;
  double peak_tflops_ = 0;
  double planned_cpu_bytes_ = 0, planned_gpu_bytes_ = 0;
  std::array<std::vector<float>, 3> staged_state_;  // master, m, v (device runs, checkpoints)
  std::unique_ptr<Checkpointer> checkpointer_;
  // Where training stands (restored by a resume).
  int64_t step_ = 0, consumed_samples_ = 0, consumed_tokens_ = 0;
};

}  // namespace jumbo
