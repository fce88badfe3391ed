#pragma once
// Checkpointer: saves and finds checkpoints for one run. Every call marked "collective" is
// made by every rank of `world` in the same order.
//
// A save: each rank that holds unique state builds its HDF5 shard in memory (the copy that
// lets training go on), writes it under a temporary name and renames it; rank 0 gathers every
// rank's file record and writes manifest.json last, then the `latest` pointer. A crash at any
// moment leaves the previous checkpoint complete: a directory without a manifest is ignored.
// With checkpoint.async the writes run on a background thread; all MPI stays on the calling
// thread (poll() finishes a save once every rank's file is written).
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/ckpt/shard.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"

namespace jumbo {

// A FIFO of tasks on one background thread.
class BackgroundWorker {
 public:
  BackgroundWorker();
  ~BackgroundWorker();  // finishes queued tasks
  void submit(std::function<void()> task);
  void drain();         // waits until the queue is empty and the current task done
  bool idle();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

// checkpoint.s3_region and s3_endpoint as the S3 client's options.
S3Options s3_options(const CheckpointConfig& c);
// Collective: every rank learns whether any rank's `error` is set, and the lowest such rank's
// message ("rank R: ..."), so that all ranks fail alike instead of waiting for one that threw.
std::optional<std::string> first_error(Comm& world, const std::string& error);

// Loads `targets` from one checkpoint: reads each shard file that overlaps them (whole, to
// verify its size and CRC-32), copies the overlapping elements, and checks every element of
// every target was found. A null state pointer is not read (inference loads the master
// weights alone). Throws UserError naming the file or tensor.
void load_checkpoint_pieces(Storage& storage, const std::string& dir, const Manifest& manifest,
                            const std::vector<PieceData>& targets);

// The last step of a save, on one process: the manifest of `header` plus the file records
// gathered from every rank (each rank's bytes hold zero or more records, one JSON per line),
// written to dir/manifest.json, then `latest`. Returns the manifest written.
Manifest write_manifest(Storage& storage, const std::string& dir, Manifest header,
                        const std::vector<std::vector<char>>& gathered);

// The free space a save needs on top of the next checkpoint's bytes: 5% (a file system
// allocates whole blocks and keeps its own metadata; the size formula may be off by that much
// on a model of unusual shapes) plus 1 MiB (the manifest's growth, `latest`, last_save.json).
int64_t checkpoint_room_needed(int64_t checkpoint_bytes);

struct SaveStats {
  double snapshot_s = 0;  // the blocking part: shards built in memory
  double total_s = 0;     // until the manifest was written
  int64_t bytes = 0;      // this rank's shard
};

class Checkpointer {
 public:
  Checkpointer(const RunConfig& cfg, Comm& world);
  ~Checkpointer();

  // A save is due after `step` (every checkpoint.every steps, and at the last step).
  bool due(int64_t step, int64_t last_step) const;
  // Collective. `header` carries progress, model, layout and data; `pieces` this rank's
  // unique state (ignored unless `writer`), saved as dir/step_N/`file_name`.
  void save(const Manifest& header, const std::vector<PieceData>& pieces, bool writer,
            const std::string& file_name);
  // Collective, every step: completes an asynchronous save whose files are all written.
  void poll();
  // Collective: completes the pending save, waiting for it.
  void wait();
  // Collective: finds the checkpoint checkpoint.resume names and loads it into `targets` (on
  // ranks where `reader`); nullopt for a fresh start. With "auto" an unusable checkpoint is
  // reported and the previous complete one is tried.
  std::optional<Manifest> resume(const std::vector<PieceData>& targets, bool reader);
  // Collective (train.on_anomaly = "rewind"): completes a pending save, then loads the newest
  // complete checkpoint under checkpoint.dir whose step is below `before_step` into `targets`;
  // nullopt when there is none. Unusable ones are reported and skipped, as with "auto".
  std::optional<Manifest> rewind(const std::vector<PieceData>& targets, bool reader,
                                 int64_t before_step);

  // The bytes of one checkpoint from the format (plan/storage.h checkpoint_size), for the
  // free-space check until a save has measured them. Needed on rank 0 only.
  void set_expected_bytes(int64_t bytes) { expected_bytes_ = bytes; }
  // Collective: whether checkpoint.dir has room for one more checkpoint (its bytes measured on
  // the last save, else the expected bytes, plus checkpoint_room_needed's margin). Finishes a
  // pending save and its retention first. Rank 0 measures (statvfs; S3 has no limit: always
  // enough, no line) and every rank gets its verdict and the line naming the directory, its
  // free and the needed bytes.
  struct Room {
    bool enough = true;
    std::string line;
  };
  Room check_room();
  // The newest checkpoint known complete (saved or resumed by this process), or -1.
  int64_t last_complete_step() const { return last_complete_step_; }

  const SaveStats& last_save() const { return last_save_; }
  double last_load_seconds() const { return load_s_; }
  Storage& storage() { return *storage_; }

 private:
  void finish_save();
  // File I/O of a save: on the background thread with checkpoint.async, else now.
  void run_io(std::function<void()> task);
  // The steps of the checkpoint directories under the root below `step`, newest first.
  std::vector<int64_t> steps_before(int64_t step);
  void apply_retention(int64_t saved_step);
  void write_last_save(int64_t step);  // rank 0: checkpoint.dir/last_save.json
  void print(const std::string& line) const;
  // The newest loadable checkpoint with step < before_step, and its directory; `complete`
  // counts those with a manifest that failed to load.
  std::optional<Manifest> load_newest(const std::vector<PieceData>& targets, bool reader,
                                      int64_t before_step, int& complete, std::string& loaded_dir);
  // One attempt: every rank agrees whether `dir` loaded; returns the error if not.
  std::optional<std::string> try_load(Storage& storage, const std::string& dir,
                                      const std::vector<PieceData>& targets, bool reader,
                                      Manifest& manifest);

  CheckpointConfig cfg_;
  ModelConfig model_;
  std::string source_;
  Comm& world_;
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<BackgroundWorker> worker_;
  // The save in flight; its shard image (kept between saves: same size each time).
  std::shared_ptr<std::vector<char>> image_ = std::make_shared<std::vector<char>>();
  bool pending_ = false;
  Manifest pending_header_;
  std::string pending_record_;   // this rank's file record, filled by the write task
  std::string pending_error_;    // the write task's failure, if any
  double pending_started_ = 0;
  SaveStats last_save_;
  double load_s_ = 0;
  int64_t expected_bytes_ = 0;        // rank 0: from the format
  int64_t measured_bytes_ = 0;        // rank 0: the last save's files and manifest
  int64_t last_complete_step_ = -1;
};

}  // namespace jumbo
