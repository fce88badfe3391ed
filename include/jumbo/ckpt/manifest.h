#pragma once
// manifest.json: what a checkpoint holds, written last (after every shard is in place), so its
// presence marks a complete checkpoint. See docs/checkpoint-format.md.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/ckpt/shard.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/config/config.h"

namespace jumbo {

inline constexpr int kCheckpointFormatVersion = 1;

// Where training stood when the checkpoint was taken. The data order, the learning-rate and
// batch schedules and parameter initialisation are functions of (seed, consumed samples,
// consumed tokens): together with these numbers they are the whole training state.
// The anomaly guard's state: the running mean of accepted losses and the anomalies so far.
struct AnomalyProgress {
  double loss_mean = 0;
  int64_t losses_seen = 0;  // accepted steps that fed loss_mean
  std::vector<SkippedSamples> skipped;
};

struct CheckpointProgress {
  int64_t step = 0;
  int64_t consumed_samples = 0;
  int64_t consumed_tokens = 0;
  int64_t optimizer_steps = 0;  // AdamW's bias-correction counter
  uint64_t seed = 0;            // train.seed: sampler permutation and initialisation keys
  double lr = 0;                // the last step's learning rate and global batch (information)
  int64_t global_batch = 0;
  AnomalyProgress anomalies;    // consumed_samples counts skipped samples; consumed_tokens not
};

struct ShardFileInfo {
  std::string name;
  int64_t bytes = 0;
  uint32_t crc32 = 0;  // zlib CRC-32 of the whole file
};

struct StoredPiece {
  int file = 0;  // index into Manifest::files
  TensorPiece piece;
};

// Where a fine-tune's weights came from (train.init_from): the checkpoint as named, its step
// and the fingerprint of its shard files (weights_fingerprint). A resume keeps the record.
struct InitialWeights {
  std::string from;  // "" = initialised, not loaded
  int64_t step = 0;
  std::string fingerprint;
  bool operator==(const InitialWeights&) const = default;
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  CheckpointProgress progress;
  ModelConfig model;
  // The layout it was saved with; stage_layers holds the split as used (balanced or given).
  Layout layout;
  Precision precision = Precision::fp32;
  // What the run trained on: the blend of data.train (a resume with another one continues the
  // sample index and says so) and the tokenizer.
  DataMixture data_train;
  std::string tokenizer;
  std::string chat_template;  // data.chat_template's stored text (TOML or Jinja's JSON), or ""
  InitialWeights init_from;
  // A LoRA run's checkpoint holds its adapters alone (rank > 0); the base is init_from's.
  LoraShape lora{};
  std::vector<ShardFileInfo> files;
  std::map<std::string, std::vector<StoredPiece>> tensors;  // by tensor name
};

std::string manifest_to_json(const Manifest& m);
// A checkpoint's fingerprint: FNV-1a 64 over its shard files' names and CRC-32s in manifest
// order, as "0x..." (the bytes of every file, the weights among them, are behind the CRCs).
std::string weights_fingerprint(const Manifest& m);
// Throws UserError naming `where` (the manifest's URL) on anything malformed.
Manifest parse_manifest(const std::string& text, const std::string& where);
// The model of the checkpoint must be the run's model: one line naming the first differing key.
void check_manifest_model(const Manifest& m, const ModelConfig& run, const std::string& where,
                          const std::string& run_source);
// A LoRA checkpoint's adapters run on `base` only if it is the base they were trained on (its
// init_from fingerprint) and the same model: one line naming the adapter's `where` otherwise.
void check_adapter_base(const Manifest& adapter, const std::string& adapter_where,
                        const Manifest& base, const std::string& base_where);

// One rank's contribution to the manifest: its file and the pieces it holds (JSON text).
std::string shard_record_to_json(const ShardFileInfo& file, const std::vector<TensorPiece>& pieces);
void add_shard_record(Manifest& m, const std::string& record_json);

// "step_00001200" for step 1200, and back (-1 when the name is not one).
std::string checkpoint_dir_name(int64_t step);
int64_t checkpoint_step_of(const std::string& dir_name);

// Reads one shard file whole and checks it against the manifest's size and CRC-32; nullopt and
// `why` (one line naming the file) when it is missing or differs. Inspection and export.
std::optional<std::vector<char>> read_verified_shard_file(Storage& storage, const std::string& dir,
                                                          const ShardFileInfo& f,
                                                          std::string& why);

}  // namespace jumbo
