// Storage of a run: one checkpoint's bytes from the checkpoint format, the checkpoints that
// coexist under retention, the data, the throughput of a save (docs/plan.md "Storage").
#include "jumbo/plan/storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/obs/metrics.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {

std::vector<StatePiece> state_pieces(const ParamStore& params,
                                     const std::vector<OptimRange>& ranges, StateUse use) {
  std::vector<StatePiece> out;
  for (const OptimRange& r : ranges) {
    const ParamInfo& info = params.info(r.param);
    if (use == StateUse::save && info.pipeline_copy) continue;
    const int64_t begin = r.flat - info.flat_offset;
    if (!out.empty()) {
      StatePiece& last = out.back();
      if (last.piece.name == info.name && last.piece.flat_end == begin &&
          last.local + last.piece.count() == r.local) {
        last.piece.flat_end += r.count;
        continue;
      }
    }
    StatePiece sp;
    sp.piece = {info.name,  info.slice.global_shape, info.slice.offset, info.slice.shape,
                begin,      begin + r.count,         info.valid_rows};
    sp.flat = r.flat;
    sp.local = r.local;
    out.push_back(std::move(sp));
  }
  return out;
}

std::string shard_file_name(const GridCoords& at) {
  return fmt::format("tp{}-pp{}-dp{}.h5", at.tp_rank, at.pp_rank, at.dp_rank);
}

CheckpointSize checkpoint_size(const ModelConfig& model, const Layout& layout,
                               const LoraShape& lora) {
  CheckpointSize size;
  Manifest header;  // serialized with every writer's record, as rank 0 writes it
  header.model = model;
  header.layout = layout;
  header.layout.stage_layers = stage_layer_range(model, layout, 0).per_stage;
  const int64_t writers_per_position = layout.zero1_active() ? layout.dp : 1;
  for (int64_t pp = 0; pp < layout.pp; ++pp) {
    for (int64_t tp = 0; tp < layout.tp; ++tp) {
      for (int64_t dp = 0; dp < writers_per_position; ++dp) {
        const GridCoords at{static_cast<int>(tp), static_cast<int>(dp), static_cast<int>(pp)};
        const StagePlan plan = plan_stage(model, layout, StepShape{.lora = lora}, at);
        std::vector<TensorPiece> pieces;
        for (StatePiece& sp : state_pieces(plan.params, plan.optimizer_ranges, StateUse::save)) {
          pieces.push_back(std::move(sp.piece));
        }
        const int64_t bytes = shard_file_bytes(pieces);
        ++size.files;
        size.shard_bytes += bytes;
        size.largest_file = std::max(size.largest_file, bytes);
        // The widest CRC-32, so the manifest's length is an upper bound.
        add_shard_record(header, shard_record_to_json({shard_file_name(at), bytes, 4294967295u},
                                                      pieces));
      }
    }
  }
  // Progress, data paths and the anomaly list vary by run: 4 KiB for them.
  size.manifest_bytes = static_cast<int64_t>(manifest_to_json(header).size()) + 4096;
  return size;
}

RetentionPeak checkpoints_at_peak(const CheckpointConfig& c, int64_t steps) {
  RetentionPeak r;
  r.steps = std::max<int64_t>(steps, 0);
  const auto kept_for_good = [&c](int64_t step) {
    return c.keep_every > 0 && step % c.keep_every == 0;
  };
  if (c.every <= 0 || steps <= 0) {
    // Unknown saves: the least a saving run needs, the newest kept ones and the one written.
    r.at_peak = std::max<int64_t>(c.keep_last, 1) + 1;
    return r;
  }
  // The saves: every `every` steps, and the last step (Checkpointer::due).
  r.saves = steps / c.every + (steps % c.every != 0 ? 1 : 0);
  for (int64_t s = c.every; s <= steps; s += c.every) r.keep_every_kept += kept_for_good(s);
  if (steps % c.every != 0) r.keep_every_kept += kept_for_good(steps);
  if (c.keep_last <= 0) {
    r.at_peak = r.saves;  // every one kept
    return r;
  }
  // Before the last save: the newest keep_last earlier saves, and every keep_every multiple
  // older than them. The last one is written on top.
  const int64_t earlier = r.saves - 1;
  const int64_t newest = std::min(c.keep_last, earlier);
  int64_t older_for_good = 0;
  for (int64_t i = 1; i <= earlier - newest; ++i) older_for_good += kept_for_good(i * c.every);
  r.at_peak = newest + older_for_good + 1;
  return r;
}

std::optional<int64_t> data_files_bytes(const DataMixture& mixture) {
  namespace fs = std::filesystem;
  if (mixture.empty()) return std::nullopt;
  int64_t total = 0;
  for (const DatasetWeight& d : mixture.datasets) {
    const fs::path prefix(d.prefix);
    const std::string stem = prefix.filename().string() + ".";
    std::error_code ec;
    fs::directory_iterator it(prefix.has_parent_path() ? prefix.parent_path() : fs::path("."), ec);
    if (ec) return std::nullopt;
    bool found = false;
    for (const fs::directory_entry& e : it) {
      if (e.path().filename().string().rfind(stem, 0) != 0) continue;
      found = true;
      if (e.is_directory(ec)) {  // PREFIX.parts/: every file under it
        for (const auto& f : fs::recursive_directory_iterator(e.path(), ec)) {
          if (f.is_regular_file(ec)) total += static_cast<int64_t>(f.file_size(ec));
        }
      } else {
        total += static_cast<int64_t>(e.file_size(ec));
      }
      if (ec) return std::nullopt;
    }
    if (!found) return std::nullopt;
  }
  return total;
}

namespace {

std::string bytes_text(double b) { return human_bytes(b, 2); }

}  // namespace

std::string format_storage(const StoragePlan& s, const Layout& l, const std::string& source_note) {
  const CheckpointSize& c = s.checkpoint;
  const RetentionPeak& r = s.retention;
  std::string out;
  out += fmt::format(
      "storage: one checkpoint of tp {} x pp {} x dp {}{}: {} ({} bytes) = {} shard files of up "
      "to {} (12 bytes per parameter held: fp32 master, Adam m and v; replicas over tp saved by "
      "each) + manifest {} (docs/checkpoint-format.md)\n",
      l.tp, l.pp, l.dp, l.zero1_active() ? " (ZeRO-1: every rank writes)" : "",
      bytes_text(static_cast<double>(c.total())), c.total(), c.files,
      bytes_text(static_cast<double>(c.largest_file)),
      bytes_text(static_cast<double>(c.manifest_bytes)));
  if (r.saves > 0) {
    out += fmt::format(
        "storage: {} saves over {} steps; at the peak, during the last save, {} checkpoints "
        "coexist (the one being written, the newest keep_last, the older keep_every multiples: "
        "retention deletes only after a save completes; {} keep_every checkpoints by the end), "
        "{}; {}\n",
        r.saves, r.steps, r.at_peak, r.keep_every_kept,
        bytes_text(static_cast<double>(r.at_peak * c.total())), source_note);
  } else {
    out += fmt::format(
        "storage: {} checkpoints coexist at the peak of a save (the newest kept and the one being "
        "written; keep_every not counted: no save schedule known), {}; {}\n",
        r.at_peak, bytes_text(static_cast<double>(r.at_peak * c.total())), source_note);
  }
  if (s.data_bytes) {
    out += fmt::format("storage: data {}\n", bytes_text(static_cast<double>(*s.data_bytes)));
  } else {
    out += fmt::format("storage: data unknown ({}; pass --data-bytes), counted as 0\n",
                       s.data_unknown_why);
  }
  out += fmt::format("storage: peak {} ({} bytes) = {} checkpoints + data\n",
                     bytes_text(static_cast<double>(s.peak_bytes())), s.peak_bytes(), r.at_peak);
  out += fmt::format(
      "storage: a save within {:.0f} s (--save-target-seconds: the lead of "
      "slurm/train_jumbo.sh's --signal=B:USR1@600, so the save a stop signal starts ends before "
      "the time limit) needs {}/s of file-system write throughput\n",
      s.save_target_s, bytes_text(static_cast<double>(s.save_bytes_per_s())));
  if (s.fs_capacity) {
    const double cap = static_cast<double>(*s.fs_capacity);
    const double peak = static_cast<double>(s.peak_bytes());
    if (peak <= cap) {
      out += fmt::format("storage: --fs-capacity {}: fits, {} free at the peak ({:.1f}% margin)\n",
                         bytes_text(cap), bytes_text(cap - peak), 100.0 * (cap - peak) / cap);
    } else {
      out += fmt::format("storage: --fs-capacity {}: does NOT fit, the peak needs {} more "
                         "({:.0f}% of the capacity)\n",
                         bytes_text(cap), bytes_text(peak - cap), 100.0 * peak / cap);
    }
  }
  return out;
}

std::string format_storage_keys(const StoragePlan& s) {
  return fmt::format(
      "checkpoint_bytes={}\ncheckpoints_at_peak={}\ndata_bytes={}\npeak_bytes={}\n"
      "save_bytes_per_s={}\n",
      s.checkpoint.total(), s.retention.at_peak, s.data_bytes.value_or(0), s.peak_bytes(),
      s.save_bytes_per_s());
}

}  // namespace jumbo
