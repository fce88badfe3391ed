#include "jumbo/ckpt/checkpointer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <map>
#include <set>

#include <sys/statvfs.h>

#include "jumbo/comm/agreed_error.h"
#include "jumbo/obs/metrics.h"

namespace jumbo {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Fault injection for the crash test (tests/ckpt/kill_during_save.sh):
// JUMBO_TEST_CKPT_STALL="STEP:SECONDS" stalls the save of STEP after this rank's shard is
// written and before it reports success, so a SIGKILL lands while the checkpoint is incomplete.
double test_stall_s(int64_t step) {
  const char* v = std::getenv("JUMBO_TEST_CKPT_STALL");
  if (!v) return 0.0;
  long long at = -1;
  double seconds = 0;
  if (std::sscanf(v, "%lld:%lf", &at, &seconds) != 2 || at != step) return 0.0;
  return seconds;
}


}  // namespace

// Collective: every rank learns whether any rank's `error` is set, and the lowest such rank's
// message ("rank R: ...").
std::optional<std::string> first_error(Comm& world, const std::string& error) {
  const int n = world.size();
  const double flag = error.empty() ? 0.0 : static_cast<double>(n - world.rank());
  const double worst = world.all_reduce_scalar(flag, ReduceOp::max);
  if (worst == 0) return std::nullopt;
  const int rank = n - static_cast<int>(worst);
  std::vector<char> why(error.begin(), error.end());
  world.broadcast_bytes(why, rank);
  return fmt::format("rank {}: {}", rank, std::string(why.begin(), why.end()));
}

S3Options s3_options(const CheckpointConfig& c) {
  S3Options o;
  o.region = c.s3_region;
  o.endpoint = c.s3_endpoint;
  return o;
}

// ---- background worker ----------------------------------------------------------------

BackgroundWorker::BackgroundWorker() : thread_([this] { loop(); }) {}

BackgroundWorker::~BackgroundWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundWorker::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void BackgroundWorker::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return tasks_.empty() && !busy_; });
}

bool BackgroundWorker::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.empty() && !busy_;
}

void BackgroundWorker::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_ and nothing left
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    lock.unlock();
    task();  // tasks catch their own errors
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

// ---- loading ----------------------------------------------------------------------------

void load_checkpoint_pieces(Storage& storage, const std::string& dir, const Manifest& manifest,
                            const std::vector<PieceData>& targets) {
  // Which stored pieces each target needs, grouped by file.
  struct Need {
    size_t target;
    const StoredPiece* stored;
  };
  std::map<int, std::vector<Need>> by_file;
  std::vector<int64_t> expected(targets.size()), covered(targets.size(), 0);
  for (size_t t = 0; t < targets.size(); ++t) {
    const TensorPiece& tp = targets[t].piece;
    const auto it = manifest.tensors.find(tp.name);
    if (it == manifest.tensors.end()) {
      throw UserError(fmt::format("{}: tensor {} is not in the checkpoint",
                                  storage.url(join_dir(dir, "manifest.json")), tp.name));
    }
    const std::vector<int64_t>& saved = it->second.front().piece.global_shape;
    bool shape_ok = saved.size() == tp.global_shape.size();
    for (size_t d = 0; shape_ok && d < saved.size(); ++d) {
      // The padded vocabulary may differ (it depends on tp); the real rows may not.
      const bool padded_dim = d == 0 && tp.valid_rows >= 0;
      shape_ok = padded_dim ? saved[0] >= tp.valid_rows : saved[d] == tp.global_shape[d];
    }
    if (!shape_ok) {
      throw UserError(fmt::format("{}: tensor {} has global shape [{}] in the checkpoint, [{}] "
                                  "in this run", storage.url(join_dir(dir, "manifest.json")),
                                  tp.name, fmt::join(saved, ", "),
                                  fmt::join(tp.global_shape, ", ")));
    }
    // Every element must be found, except padding rows the checkpoint does not have.
    expected[t] = tp.count();
    if (tp.valid_rows >= 0 && saved[0] < tp.global_shape[0]) {
      TensorPiece kept = tp;
      kept.offset = {0, 0};
      kept.shape = {saved[0], tp.global_shape[1]};
      kept.flat_begin = 0;
      kept.flat_end = kept.rect_numel();
      expected[t] = 0;
      for (const OverlapRun& r : piece_overlap(tp, kept)) expected[t] += r.length;
    }
    for (const StoredPiece& sp : it->second) {
      if (!piece_overlap(sp.piece, tp).empty()) by_file[sp.file].push_back({t, &sp});
    }
  }
  for (const auto& [file, needs] : by_file) {
    const ShardFileInfo& f = manifest.files[static_cast<size_t>(file)];
    const std::string url = storage.url(join_dir(dir, f.name));
    std::optional<std::vector<char>> bytes = storage.read(join_dir(dir, f.name));
    if (!bytes) throw UserError(fmt::format("{}: shard file is missing", url));
    if (static_cast<int64_t>(bytes->size()) != f.bytes) {
      throw UserError(fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)",
                                  url, bytes->size(), f.bytes));
    }
    const uint32_t crc = file_crc32(*bytes);
    if (crc != f.crc32) {
      throw UserError(fmt::format("{}: CRC-32 {:08x}, the manifest says {:08x} (the file is "
                                  "corrupt)", url, crc, f.crc32));
    }
    ShardReader reader(*bytes, url);
    for (const Need& n : needs) {
      const PieceData& target = targets[n.target];
      for (size_t s = 0; s < kCheckpointStates.size(); ++s) {
        if (!target.state[s]) continue;  // not wanted (inference loads the weights only)
        const int64_t c = reader.copy_overlap(n.stored->piece, static_cast<int>(s), target.piece,
                                              target.state[s]);
        if (s == 0) covered[n.target] += c;
      }
    }
  }
  for (size_t t = 0; t < targets.size(); ++t) {
    if (covered[t] < expected[t]) {
      throw UserError(fmt::format("{}: tensor {}: the shards hold {} of the {} elements this "
                                  "rank needs (the manifest is incomplete)",
                                  storage.url(join_dir(dir, "manifest.json")), targets[t].piece.name,
                                  covered[t], expected[t]));
    }
  }
}

Manifest write_manifest(Storage& storage, const std::string& dir, Manifest header,
                        const std::vector<std::vector<char>>& gathered) {
  for (const std::vector<char>& lines : gathered) {
    size_t begin = 0;
    for (size_t i = 0; i <= lines.size(); ++i) {
      if (i < lines.size() && lines[i] != '\n') continue;
      if (i > begin) add_shard_record(header, std::string(lines.begin() + begin, lines.begin() + i));
      begin = i + 1;
    }
  }
  const std::string text = manifest_to_json(header);
  storage.write(join_dir(dir, "manifest.json"), text.data(), text.size());
  const std::string latest = dir + "\n";
  storage.write("latest", latest.data(), latest.size());
  return header;
}

int64_t checkpoint_room_needed(int64_t checkpoint_bytes) {
  return checkpoint_bytes + checkpoint_bytes / 20 + (int64_t{1} << 20);
}

// ---- Checkpointer ---------------------------------------------------------------------

Checkpointer::Checkpointer(const RunConfig& cfg, Comm& world)
    : cfg_(cfg.checkpoint), model_(cfg.model), source_(cfg.source), world_(world) {
  if (!cfg_.dir.empty()) storage_ = open_storage(cfg_.dir, s3_options(cfg_));
  // A synchronous save finishes inside save(): only async saves need the thread.
  if (cfg_.async) worker_ = std::make_unique<BackgroundWorker>();
}

Checkpointer::~Checkpointer() {
  // Files in flight are finished (the destructor of the worker drains it); a save whose
  // manifest was never written stays incomplete and is ignored by resume.
  worker_.reset();
}

void Checkpointer::print(const std::string& line) const {
  if (world_.rank() == 0) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }
}

bool Checkpointer::due(int64_t step, int64_t last_step) const {
  return cfg_.every > 0 && (step % cfg_.every == 0 || step == last_step);
}

void Checkpointer::save(const Manifest& header, const std::vector<PieceData>& pieces, bool writer,
                        const std::string& file_name) {
  wait();  // one save at a time
  const double t0 = now_s();
  const std::string dir = checkpoint_dir_name(header.progress.step);
  pending_header_ = header;
  pending_record_.clear();
  pending_error_.clear();
  pending_started_ = t0;
  last_save_ = {};
  std::vector<TensorPiece> described;
  if (writer) {
    for (const PieceData& p : pieces) described.push_back(p.piece);
    // The snapshot: after this, training may change the state. A failure here is this rank's
    // part of the save failing: finish_save makes every rank agree on it.
    try {
      build_shard_image(pieces,
                        {{"step", header.progress.step},
                         {"format_version", kCheckpointFormatVersion}},
                        *image_);
    } catch (const std::exception& e) {
      pending_error_ = fmt::format("{}: {}", file_name, e.what());
    }
  }
  if (writer && pending_error_.empty()) {
    const std::shared_ptr<std::vector<char>> image = image_;
    last_save_.bytes = static_cast<int64_t>(image->size());
    const std::string key = join_dir(dir, file_name);
    Storage* storage = storage_.get();
    const int64_t step = header.progress.step;
    auto task = [this, storage, image, key, file_name, step, described = std::move(described)] {
      try {
        ShardFileInfo info{file_name, static_cast<int64_t>(image->size()), file_crc32(*image)};
        storage->write(key, image->data(), image->size());
        if (const double stall = test_stall_s(step); stall > 0) {
          std::this_thread::sleep_for(std::chrono::duration<double>(stall));
        }
        pending_record_ = shard_record_to_json(info, described);
      } catch (const std::exception& e) {
        pending_error_ = e.what();
      }
    };
    run_io(std::move(task));
  }
  last_save_.snapshot_s = now_s() - t0;
  pending_ = true;
  if (!cfg_.async) finish_save();
}

void Checkpointer::run_io(std::function<void()> task) {
  if (cfg_.async) {
    worker_->submit(std::move(task));
  } else {
    task();
  }
}

void Checkpointer::poll() {
  if (!pending_) return;
  const double busy = worker_->idle() ? 0.0 : 1.0;
  if (world_.all_reduce_scalar(busy, ReduceOp::max) > 0) return;
  finish_save();
}

void Checkpointer::wait() {
  if (!pending_) return;
  worker_->drain();
  finish_save();
}

void Checkpointer::finish_save() {
  pending_ = false;
  const int64_t step = pending_header_.progress.step;
  const std::string dir = checkpoint_dir_name(step);
  if (const auto error = first_error(world_, pending_error_)) {
    // Every rank's write has ended (first_error is collective): rank 0 removes what this save
    // left (shards of the ranks that succeeded, temporaries of those that did not), so a full
    // file system keeps only complete checkpoints and the next save finds its space. The
    // others wait for it: the error ends the job, and an abort must not cut the removal short.
    std::string removed = "removed";
    if (world_.rank() == 0) {
      try {
        storage_->remove_all(dir);
      } catch (const std::exception& e) {
        removed = fmt::format("not removed: {}", e.what());
      }
    }
    world_.all_reduce_scalar(0.0, ReduceOp::max);
    const bool no_space = error->find(std::strerror(ENOSPC)) != std::string::npos;
    // Every rank throws it here: rank 0 says it (it removed the directory), the others
    // unwind quietly; no rank aborts the job while a peer's weight gather is still running.
    throw AgreedError(fmt::format("checkpoint {} not saved, the partial directory {}{}: {}; the "
                                  "previous checkpoint is intact{}",
                                  storage_->url(dir), removed,
                                  world_.rank() == 0 ? "" : " by rank 0", *error,
                                  no_space ? fmt::format(" (checkpoint.dir = {} is full: free "
                                                         "space, then resume)", cfg_.dir)
                                           : ""),
                      world_.rank() != 0);
  }
  last_complete_step_ = step;
  const std::vector<char> mine(pending_record_.begin(), pending_record_.end());
  const std::vector<std::vector<char>> records = world_.gather_bytes(mine, 0);
  if (world_.rank() != 0) {
    last_save_.total_s = now_s() - pending_started_;
  } else {
    const Manifest m = write_manifest(*storage_, dir, pending_header_, records);
    last_save_.total_s = now_s() - pending_started_;
    int64_t total = 0;
    for (const ShardFileInfo& f : m.files) total += f.bytes;
    measured_bytes_ = total + static_cast<int64_t>(manifest_to_json(m).size());
    write_last_save(step);
    print(fmt::format("checkpoint: saved step {} to {} ({} files, {:.1f} MiB, {:.2f} s{})", step,
                      storage_->url(dir), m.files.size(), static_cast<double>(total) / (1 << 20),
                      last_save_.total_s,
                      cfg_.async ? fmt::format(", training blocked {:.2f} s", last_save_.snapshot_s)
                                 : ""));
    if (cfg_.keep_last > 0) run_io([this, step] { apply_retention(step); });
  }
}

void Checkpointer::write_last_save(int64_t step) {
  // For the batch scripts (slurm/common.sh times a deadline stop by it): what the last save
  // wrote and how long it took, on the same storage as the checkpoints.
  const std::string text = fmt::format("{{\"step\":{},\"bytes\":{},\"seconds\":{:.3f}}}\n",
                                       step, measured_bytes_, last_save_.total_s);
  try {
    storage_->write("last_save.json", text.data(), text.size());
  } catch (const std::exception& e) {
    // The checkpoint is complete; a stale timing only makes a deadline stop less exact.
    std::fprintf(stderr, "jumbo: checkpoint: %s not written: %s\n",
                 storage_->url("last_save.json").c_str(), e.what());
  }
}

Checkpointer::Room Checkpointer::check_room() {
  wait();
  if (worker_) worker_->drain();  // the retention queued after the last save frees its space
  // Fault injection for tests/ckpt/no_room.sh: JUMBO_TEST_CKPT_SKIP_ROOM_CHECK=1 lets a save
  // start without room, so that it runs out of space half-way.
  const bool skip = std::getenv("JUMBO_TEST_CKPT_SKIP_ROOM_CHECK") != nullptr;
  std::string verdict = "1";  // rank 0's: "1" or "0", then the line
  if (world_.rank() == 0 && !is_s3_url(cfg_.dir) && !skip) {
    const bool measured = measured_bytes_ > 0;
    const int64_t bytes = measured ? measured_bytes_ : expected_bytes_;
    const int64_t needed = checkpoint_room_needed(bytes);
    struct statvfs fs {};
    if (::statvfs(cfg_.dir.c_str(), &fs) != 0) {
      verdict = fmt::format("0checkpoint.dir = {}: cannot read its free space ({})", cfg_.dir,
                            std::strerror(errno));
    } else {
      const int64_t free_bytes =
          static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
      verdict = fmt::format(
          "{}checkpoint.dir = {}: {} free ({} bytes), the next checkpoint needs {} ({} bytes: {} "
          "bytes {} + 5% + 1 MiB)",
          free_bytes >= needed ? 1 : 0, cfg_.dir, human_bytes(static_cast<double>(free_bytes), 2),
          free_bytes, human_bytes(static_cast<double>(needed), 2), needed, bytes,
          measured ? "measured on the last save" : "from the checkpoint format (docs/plan.md)");
    }
  }
  std::vector<char> bytes(verdict.begin(), verdict.end());
  world_.broadcast_bytes(bytes, 0);
  return {bytes.front() == '1', std::string(bytes.begin() + 1, bytes.end())};
}

std::vector<int64_t> Checkpointer::steps_before(int64_t step) {
  std::vector<int64_t> steps;
  for (const std::string& name : storage_->list_dirs("")) {
    const int64_t s = checkpoint_step_of(name);
    if (s >= 0 && s < step) steps.push_back(s);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

void Checkpointer::apply_retention(int64_t saved_step) {
  try {
    const std::vector<int64_t> older = steps_before(saved_step);
    int64_t kept = 1;  // the one just saved
    for (int64_t s : older) {
      const std::string dir = checkpoint_dir_name(s);
      const bool for_good = cfg_.keep_every > 0 && s % cfg_.keep_every == 0;
      if (kept < cfg_.keep_last && storage_->read(join_dir(dir, "manifest.json")).has_value()) {
        ++kept;  // one of the newest keep_last complete checkpoints
        continue;
      }
      // Older than keep_last complete checkpoints, or an incomplete leftover of a crash.
      if (!for_good) storage_->remove_all(dir);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "jumbo: checkpoint retention: %s (nothing else removed)\n", e.what());
  }
}

std::optional<std::string> Checkpointer::try_load(Storage& storage, const std::string& dir,
                                                  const std::vector<PieceData>& targets,
                                                  bool reader, Manifest& manifest) {
  // Rank 0 reads and checks the manifest; the others get its bytes.
  std::string error;
  std::vector<char> text;
  if (world_.rank() == 0) {
    try {
      const std::string url = storage.url(join_dir(dir, "manifest.json"));
      std::optional<std::vector<char>> bytes = storage.read(join_dir(dir, "manifest.json"));
      if (!bytes) throw UserError(fmt::format("{}: no manifest (the save did not complete)", url));
      text = std::move(*bytes);
      manifest = parse_manifest(std::string(text.begin(), text.end()), url);
      check_manifest_model(manifest, model_, url, source_);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  std::vector<char> status(error.begin(), error.end());
  world_.broadcast_bytes(status, 0);
  if (!status.empty()) return std::string(status.begin(), status.end());
  world_.broadcast_bytes(text, 0);
  if (world_.rank() != 0) {
    manifest = parse_manifest(std::string(text.begin(), text.end()), storage.url(dir));
  }
  if (reader) {
    try {
      load_checkpoint_pieces(storage, dir, manifest, targets);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  return first_error(world_, error);
}

std::optional<Manifest> Checkpointer::load_newest(const std::vector<PieceData>& targets,
                                                  bool reader, int64_t before_step,
                                                  int& complete, std::string& loaded_dir) {
  // Rank 0's listing, "1" and one directory a line, or "0" and why it could not list.
  std::vector<char> listing{'1'};
  if (world_.rank() == 0) {
    try {
      const std::vector<int64_t> steps = steps_before(before_step);
      for (int64_t s : steps) {
        const std::string line = checkpoint_dir_name(s) + "\n";
        listing.insert(listing.end(), line.begin(), line.end());
      }
    } catch (const UserError& e) {
      const std::string why = e.what();
      listing.assign(1, '0');
      listing.insert(listing.end(), why.begin(), why.end());
    }
  }
  world_.broadcast_bytes(listing, 0);
  if (listing.front() != '1') {  // every rank fails here alike; rank 0 says why
    throw AgreedError(std::string(listing.begin() + 1, listing.end()), world_.rank() != 0);
  }
  listing.erase(listing.begin());
  std::vector<std::string> dirs;
  std::string cur;
  for (char c : listing) {
    if (c == '\n') {
      dirs.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  Manifest manifest;
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (auto error = try_load(*storage_, dirs[i], targets, reader, manifest)) {
      if (error->find("no manifest (the save did not complete)") == std::string::npos) ++complete;
      print(fmt::format("checkpoint: skipping {}: {}; {}", storage_->url(dirs[i]), *error,
                        i + 1 < dirs.size() ? "trying the previous one" : "no older checkpoint"));
      continue;
    }
    loaded_dir = dirs[i];
    return manifest;
  }
  return std::nullopt;
}

std::optional<Manifest> Checkpointer::rewind(const std::vector<PieceData>& targets, bool reader,
                                             int64_t before_step) {
  wait();  // a save in flight may be the newest
  const double t0 = now_s();
  int complete = 0;
  std::string dir;
  std::optional<Manifest> m = load_newest(targets, reader, before_step, complete, dir);
  if (m) load_s_ = now_s() - t0;
  return m;
}

std::optional<Manifest> Checkpointer::resume(const std::vector<PieceData>& targets, bool reader) {
  const std::string& how = cfg_.resume;
  if (how == "none") return std::nullopt;
  const double t0 = now_s();
  const bool step_number = how.find_first_not_of("0123456789") == std::string::npos;
  Manifest manifest;
  if (how != "auto") {
    // One named checkpoint: any failure stops the run.
    std::unique_ptr<Storage> other;
    Storage* storage = storage_.get();
    std::string dir;
    if (step_number) {
      dir = checkpoint_dir_name(std::stoll(how));
    } else {
      const StoragePath where = split_storage_path(how);
      if (where.missing) {
        // Opening file storage would create the directory; a mistyped path must not.
        throw UserError(fmt::format("checkpoint.resume = \"{}\": no such checkpoint "
                                    "directory", how));
      }
      if (where.parent.empty() || where.name.empty()) {
        throw UserError(fmt::format("checkpoint.resume = \"{}\": expected the path of one "
                                    "checkpoint directory (step_NNNNNNNN)", how));
      }
      dir = where.name;
      other = open_storage(where.parent, s3_options(cfg_));
      storage = other.get();
    }
    if (auto error = try_load(*storage, dir, targets, reader, manifest)) {
      // The same on every rank (try_load's verdict is collective): said once, by rank 0.
      throw AgreedError(fmt::format("checkpoint.resume = \"{}\": {}", how, *error),
                        world_.rank() != 0);
    }
    load_s_ = now_s() - t0;
    if (storage == storage_.get()) last_complete_step_ = manifest.progress.step;
    print(fmt::format("checkpoint: resumed from {} (step {}) in {:.2f} s", storage->url(dir),
                      manifest.progress.step, load_s_));
    return manifest;
  }
  // auto: the newest complete checkpoint; an unusable one is reported and skipped.
  int complete = 0;  // checkpoints with a manifest: a fresh start must not overwrite them
  std::string dir;
  if (std::optional<Manifest> m = load_newest(targets, reader, INT64_MAX, complete, dir)) {
    load_s_ = now_s() - t0;
    last_complete_step_ = m->progress.step;
    print(fmt::format("checkpoint: resumed from {} (step {}, saved with tp {} x pp {} x dp {}{}) "
                      "in {:.2f} s", storage_->url(dir),
                      m->progress.step, m->layout.tp, m->layout.pp, m->layout.dp,
                      m->layout.zero1 ? ", ZeRO-1" : "", load_s_));
    return m;
  }
  if (complete > 0) {  // counted from collective verdicts: the same on every rank
    throw AgreedError(fmt::format("checkpoint.resume = \"auto\": none of the {} complete "
                                "checkpoints under {} could be loaded (reasons above); not "
                                "starting from step 0 over them (set checkpoint.resume = \"none\" "
                                "or another checkpoint.dir to start afresh)",
                                complete, storage_->url("")),
                      world_.rank() != 0);
  }
  print(fmt::format("checkpoint: no complete checkpoint under {}; starting from step 0",
                    storage_->url("")));
  return std::nullopt;
}

}  // namespace jumbo
