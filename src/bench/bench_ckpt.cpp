// `jumbo bench ckpt`: how fast this rank's checkpoint state goes to disk and back, as a ratio
// to a plain fsync'd write of the same bytes measured in the same run.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/bench/bench.h"
#include "jumbo/train/checkpoint_io.h"
#include "jumbo/parallel/stage_plan.h"

namespace jumbo {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Drops a directory's files from the page cache (they were fsync'd), so loads read the disk.
void evict(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

CkptBenchResult bench_checkpoint(const ModelConfig& model, const CkptBenchOptions& o,
                                 Comm& world) {
  const int64_t n = world.size();
  Layout layout = o.layout;
  if (layout.tp < 1 || layout.pp < 1 || n % (layout.tp * layout.pp) != 0 || o.repeats < 1) {
    throw UserError(fmt::format("bench ckpt: --tp {} x --pp {} does not divide the {} ranks, or "
                                "--repeats {} < 1", layout.tp, layout.pp, n, o.repeats));
  }
  layout.dp = n / (layout.tp * layout.pp);
  validate_layout(layout, model, "bench ckpt", LayoutKeys::flags);
  const GridCoords at = grid_coords(world.rank(), static_cast<int>(layout.tp),
                                    static_cast<int>(layout.dp));
  const bool writer = layout.zero1_active() || at.dp_rank == 0;
  // This rank's state, laid out as the trainer lays it out, filled with random numbers.
  const StagePlan plan = plan_stage(model, layout, StepShape{}, at);
  std::vector<float> master(static_cast<size_t>(plan.params.total_numel())),
      m(static_cast<size_t>(plan.optimizer_state_elems)),
      v(static_cast<size_t>(plan.optimizer_state_elems));
  std::mt19937 rng(static_cast<uint32_t>(world.rank()));
  std::normal_distribution<float> normal(0.f, 0.02f);
  for (float& x : master) x = normal(rng);
  for (size_t i = 0; i < m.size(); ++i) {
    m[i] = normal(rng);
    v[i] = std::abs(normal(rng));
  }
  const std::vector<PieceData> pieces = optimizer_state_pieces(
      plan.params, plan.optimizer_ranges, {master.data(), MasterIndex::flat}, m.data(), v.data(),
      StateUse::save);

  RunConfig cfg;
  cfg.model = model;
  cfg.checkpoint.dir = o.dir;
  cfg.checkpoint.every = 1;
  cfg.checkpoint.async = o.async;
  cfg.checkpoint.keep_last = 1;
  Checkpointer ckpt(cfg, world);
  const std::string file = shard_file_name(at);
  std::vector<double> save, blocked, load, raw;
  CkptBenchResult res;
  for (int64_t rep = 1; rep <= o.repeats; ++rep) {
    Manifest header;
    header.progress.step = rep;
    header.model = model;
    header.layout = layout;
    header.layout.stage_layers = plan.layers.per_stage;
    world.barrier();
    double t0 = now_s();
    ckpt.save(header, writer ? pieces : std::vector<PieceData>{}, writer, file);
    blocked.push_back(world.all_reduce_scalar(now_s() - t0, ReduceOp::max));
    ckpt.wait();
    world.barrier();
    save.push_back(now_s() - t0);
    const std::string dir = checkpoint_dir_name(rep);
    std::vector<char> text;
    if (world.rank() == 0) text = *ckpt.storage().read(dir + "/manifest.json");
    world.broadcast_bytes(text, 0);
    const Manifest written = parse_manifest(std::string(text.begin(), text.end()), dir);
    if (!is_s3_url(o.dir)) evict(ckpt.storage().url(dir));
    world.barrier();
    t0 = now_s();
    if (writer) load_checkpoint_pieces(ckpt.storage(), dir, written, pieces);
    world.barrier();
    load.push_back(now_s() - t0);
    // The baseline: the same number of bytes, fsync'd, without HDF5 or checksums.
    res.bytes_per_rank = ckpt.last_save().bytes;
    std::vector<char> bytes(static_cast<size_t>(res.bytes_per_rank), 'x');
    world.barrier();
    t0 = now_s();
    if (writer) ckpt.storage().write(fmt::format("raw/{}-{}", rep, file), bytes.data(), bytes.size());
    world.barrier();
    raw.push_back(now_s() - t0);
    if (world.rank() == 0) ckpt.storage().remove_all("raw");
    res.bytes_total = 0;
    for (const ShardFileInfo& f : written.files) res.bytes_total += f.bytes;
  }
  res.save_s = median(save);
  res.blocked_s = median(blocked);
  res.load_s = median(load);
  res.raw_write_s = median(raw);
  return res;
}

std::string describe(const CkptBenchResult& r, const CkptBenchOptions& o, int world_size) {
  const double mib = 1 << 20, total = static_cast<double>(r.bytes_total) / mib;
  return fmt::format(
      "checkpoint of {:.1f} MiB ({:.1f} MiB on rank 0) by {} ranks to {}, median of {}:\n"
      "  save  {:.3f} s  {:7.1f} MiB/s  ({:.2f} x the plain fsync'd write of the same bytes){}\n"
      "  load  {:.3f} s  {:7.1f} MiB/s  (page cache dropped first)\n"
      "  plain write {:.3f} s  {:7.1f} MiB/s",
      total, static_cast<double>(r.bytes_per_rank) / mib, world_size, o.dir, o.repeats, r.save_s,
      total / r.save_s, r.raw_write_s / r.save_s,
      o.async ? fmt::format("; training blocked {:.3f} s", r.blocked_s) : "", r.load_s,
      total / r.load_s, r.raw_write_s, total / r.raw_write_s);
}

}  // namespace jumbo
