#pragma once
// Trainer: the step loop of one run, composed of the parts below it — the data, this rank's
// TrainStage (grid, process groups, stage plan, model stage, gradient sync, AdamW, pipeline
// runner), the schedules, metrics and checkpoints.
#include <algorithm>
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
#include "jumbo/model/stage.h"
#include "jumbo/obs/emf.h"
#include "jumbo/obs/metrics.h"
#include "jumbo/obs/step_meter.h"
#include "jumbo/obs/stragglers.h"
#include "jumbo/train/anomaly.h"
#include "jumbo/train/checkpoint_io.h"
#include "jumbo/train/fault_injection.h"
#include "jumbo/train/run_data.h"
#include "jumbo/train/run_progress.h"
#include "jumbo/train/run_report.h"
#include "jumbo/train/schedule.h"
#include "jumbo/train/step.h"
#include "jumbo/train/train_stage.h"

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

  void record_step(int64_t step, double loss) {
    losses.push_back(loss);
    final_loss = loss;
    steps = step;
  }
  // A rewind to a checkpoint's `step`: the steps after it are undone.
  void rewind_to(int64_t step) {
    const auto kept = static_cast<size_t>(std::max<int64_t>(0, step - first_step + 1));
    if (step < first_step - 1) first_step = step + 1;
    losses.resize(std::min(losses.size(), kept));
    steps = step;
  }
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
  ModelStage& model() { return stage_->model(); }
  const AdamW& optimizer() const { return stage_->optimizer(); }
  Grid& grid() { return stage_->grid(); }

 private:
  // One step from its data to its metrics; the step that `progress_` is at + 1.
  struct StepOutcome {
    StepMetrics metrics;
    StepResult result;
    AnomalyVerdict verdict;
    int64_t first_sample = 0, batch = 0;  // its samples: [first_sample, first_sample + batch)
  };
  StepOutcome train_one_step(int64_t step, StepMeter& meter);
  void finish_run(TrainSummary& summary);  // waits for saves and weights; the memory report
  void print(const std::string& line) const;
  void print_start();
  void collect_comm_bytes(StepMetrics& m);
  // Checkpoints (trainer_checkpoint.cpp): this rank's optimizer state as pieces, whether it
  // writes them, and the saves and the resume of the run.
  std::vector<PieceData> checkpoint_pieces(StateUse use);
  void upload_staged_state();  // after a load into the host copies of device state
  std::array<Tensor, 3> saved_state();  // master, Adam m, Adam v: what a checkpoint holds
  bool writes_checkpoint() const;
  // Collective: a checkpoint of progress_ (lr and batch: its last step's). False, with the
  // line printed, when checkpoint.dir has no room for it: nothing was written and the run
  // stops (summary.stop_no_room).
  bool save_checkpoint(double lr, int64_t batch);
  // Collective, before the resume: refuses a checkpoint.dir without room for one checkpoint.
  void check_checkpoint_room_at_start();
  // False when no checkpoint was resumed (a fresh start).
  bool resume_from_checkpoint();
  // Collective, on a fresh start with train.init_from: the weights of that checkpoint (any
  // layout) into the master weights; Adam's moments and progress stay fresh.
  void init_from_checkpoint();
  // Collective: LoRA's frozen base from the checkpoint at `path` (its model checked, and its
  // fingerprint when one is given), recorded as init_from_.
  void load_frozen_base(const std::string& path, const std::string& where,
                        const std::string& fingerprint);
  // After a load into checkpoint_pieces(load): the state on every rank (replicas, the
  // weights' compute copy, ZeRO-1's gather).
  void distribute_loaded_state();
  // distribute_loaded_state, then the optimizer's steps and progress_ from `m`.
  void restore_loaded_state(const Manifest& m);
  // An anomalous step (trainer_anomaly.cpp): records it in the guard and in its metrics, and
  // acts on train.on_anomaly; logs and throws UserError to stop (stop, or over
  // train.max_anomalies). A rewind restores progress_ to the newest checkpoint before it.
  enum class AfterAnomaly { go_on, rewound };
  AfterAnomaly handle_anomaly(StepOutcome& s, TrainSummary& summary);
  void log_step(StepMetrics& m, bool interval);  // JSON line, human line, EMF
  // Collective, after progress_.step: true when a rank got a stop signal (the first decides)
  // before the last step; then saves (unless this step was just saved), waits, and reports.
  bool stop_on_signal(TrainSummary& summary, double lr, int64_t batch);

  RunConfig cfg_;  // validated for the world: cfg_.parallel is the run's layout
  Backend& backend_;
  std::shared_ptr<Comm> world_;
  PlannedMemory planned_;
  std::unique_ptr<RunData> data_;
  std::unique_ptr<TrainStage> stage_;  // built after the data: a mismatch fails before allocation
  std::unique_ptr<LrSchedule> lr_;
  std::unique_ptr<BatchRamp> ramp_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<EmfLog> emf_;  // rank 0, when log.emf_file or log.emf_address is set
  Peak peak_;
  std::array<std::vector<float>, 3> staged_state_;  // master, m, v (device runs, checkpoints)
  std::unique_ptr<Checkpointer> checkpointer_;
  AnomalyGuard anomalies_;
  StepFaults faults_;
  std::unique_ptr<StragglerDetector> stragglers_;  // runs of several ranks
  RunProgress progress_;  // saved by every checkpoint, restored by a resume or a rewind
  InitialWeights init_from_;  // where the weights came from (train.init_from), in every manifest
};

}  // namespace jumbo
