#pragma once
// Trainer: the step loop of one run, composed of the parts below it — the validated layout's
// grid and process groups, this rank's stage plan, the data, the model stage, the gradient
// sync, AdamW, the pipeline runner, the schedules, metrics and checkpoints.
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
#include "jumbo/model/gpt.h"
#include "jumbo/obs/emf.h"
#include "jumbo/obs/metrics.h"
#include "jumbo/parallel/groups.h"
#include "jumbo/parallel/pipeline_runner.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/obs/stragglers.h"
#include "jumbo/train/anomaly.h"
#include "jumbo/train/checkpoint_io.h"
#include "jumbo/train/fault_injection.h"
#include "jumbo/train/grad_sync.h"
#include "jumbo/train/optimizer.h"
#include "jumbo/train/run_data.h"
#include "jumbo/train/run_report.h"
#include "jumbo/train/schedule.h"
#include "jumbo/train/step.h"

namespace jumbo {

struct TrainSummary {
  int64_t steps = 0;        // the last step run (counting steps before a resume)
  int64_t first_step = 1;   // the first step this process ran (after a resume: its step + 1)
  double final_loss = 0;
  std::optional<double> final_val_loss;
  std::vector<double> losses;  // per step run by this process (a rewind drops the undone ones)
  std::vector<SkippedSamples> anomalies;  // every anomaly of the run, a resumed one's included
  // A graceful stop (stop_signal.h): the signal, and whether a checkpoint of `steps` was saved.
  int stop_signal = 0;
  bool stop_saved = false;
  // Stopped before a save because checkpoint.dir had no room for it (the newest complete
  // checkpoint kept): exits kExitStoppedForRequeue as well.
  bool stop_no_room = false;
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
  // Mean per-token loss over eval_batches microbatches of each set of data.valid into
  // m.val_losses, and their data.valid-weighted mean into m.val_loss.
  void evaluate(StepMetrics& m);
  GptModel& model() { return *model_; }
  const AdamW& optimizer() const { return *optimizer_; }
  Grid& grid() { return grid_; }

 private:
  void print(const std::string& line) const;
  void print_start();
  void collect_comm_bytes(StepMetrics& m);
  // Checkpoints (trainer_checkpoint.cpp): this rank's optimizer state as pieces, whether it
  // writes them, and the saves and the resume of the run.
  std::vector<PieceData> checkpoint_pieces(StateUse use);
  void upload_staged_state();  // after a load into the host copies of device state
  std::array<Tensor, 3> saved_state();  // master, Adam m, Adam v: what a checkpoint holds
  bool writes_checkpoint() const;
  // Collective. False, with the line printed, when checkpoint.dir has no room for it: nothing
  // was written and the run stops (summary.stop_no_room).
  bool save_checkpoint(int64_t step, double lr, int64_t batch);
  // Collective, before the resume: refuses a checkpoint.dir without room for one checkpoint.
  void check_checkpoint_room_at_start();
  void resume_from_checkpoint();
  // After a load into checkpoint_pieces(load): the state everywhere, the counters of `m`.
  void restore_loaded_state(const Manifest& m);
  // An anomalous step (trainer_anomaly.cpp): records it in the guard and in m, and acts on
  // train.on_anomaly; logs and throws UserError to stop (stop, or over train.max_anomalies).
  // Returns the step the run goes on from: the next, or after a rewind the checkpoint's + 1.
  int64_t handle_anomaly(StepMetrics& m, const AnomalyVerdict& verdict, int64_t first_sample,
                         int64_t batch, TrainSummary& summary);
  void log_step(StepMetrics& m, bool interval);  // JSON line, human line, EMF
  // After a stop signal: save (unless this step was just saved), wait, and report.
  void stop_for_signal(TrainSummary& summary, int signal, int64_t step, double lr, int64_t batch);

  RunConfig cfg_;  // validated for the world: cfg_.parallel is the run's layout
  Backend& backend_;
  std::shared_ptr<Comm> world_;
  Grid grid_;
  ProcessGroups groups_;
  StagePlan plan_;
  PlannedMemory planned_;
  std::unique_ptr<RunData> data_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<GradSync> grad_sync_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<PipelineRunner> pipeline_;
  std::unique_ptr<StepParts> step_parts_;
  std::unique_ptr<LrSchedule> lr_;
  std::unique_ptr<BatchRamp> ramp_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<EmfLog> emf_;  // rank 0, when log.emf_file or log.emf_address is set
  Peak peak_;
  std::array<std::vector<float>, 3> staged_state_;  // master, m, v (device runs, checkpoints)
  std::unique_ptr<Checkpointer> checkpointer_;
  AnomalyGuard anomalies_;
  FaultInjection faults_;
  std::unique_ptr<StragglerDetector> stragglers_;  // runs of several ranks
  // Where training stands (restored by a resume). consumed_samples_ is the position in the
  // data order (skipped samples included); consumed_tokens_ counts the tokens trained on.
  int64_t step_ = 0, consumed_samples_ = 0, consumed_tokens_ = 0;
};

}  // namespace jumbo
