// `jumbo ckpt inspect [--verify]` (ckpt/inspect.h).
#include "jumbo/ckpt/inspect.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "jumbo/ckpt/shard.h"
#include "jumbo/obs/metrics.h"

namespace jumbo {

std::string inspect_checkpoint(const ResolvedCheckpoint& ckpt, bool verify,
                               const TensorListing& listing) {
  const Manifest& m = ckpt.manifest;
  Storage& storage = *ckpt.storage;
  const std::string where = storage.url(join_dir(ckpt.dir, "manifest.json"));
  std::string r;
  auto line = [&r](const std::string& s) { r += s + "\n"; };
  const CheckpointProgress& p = m.progress;
  line(fmt::format("checkpoint {} (format version {})", storage.url(ckpt.dir), m.format_version));
  line(fmt::format("step {}: {} samples, {} tokens consumed; {} optimizer steps; seed {}; last "
                   "lr {:.6g}, global batch {}", p.step, p.consumed_samples, p.consumed_tokens,
                   p.optimizer_steps, p.seed, p.lr, p.global_batch));
  const ModelConfig& mc = m.model;
  line(fmt::format("model {}: {} layers, d_model {}, {} heads, ffn {}, vocab {} (multiple {}), "
                   "context {}", mc.name, mc.layers, mc.d_model, mc.heads, mc.ffn_dim(), mc.vocab,
                   mc.vocab_multiple, mc.context));
  const Layout& l = m.layout;
  line(fmt::format("saved with tp {} x pp {} x dp {}, ZeRO-1 {}, virtual stages {}, stage layers "
                   "[{}], precision {}", l.tp, l.pp, l.dp, l.zero1 ? "on" : "off",
                   l.virtual_stages, fmt::join(l.stage_layers, ", "), to_string(m.precision)));
  if (!m.data_train.empty() || !m.tokenizer.empty()) {
    line(fmt::format("data {}, tokenizer {}", m.data_train.describe(), m.tokenizer));
  }
  int64_t total = 0, lo = 0, hi = 0;
  for (const ShardFileInfo& f : m.files) {
    lo = &f == &m.files.front() ? f.bytes : std::min(lo, f.bytes);
    hi = std::max(hi, f.bytes);
    total += f.bytes;
  }
  const double mean = m.files.empty() ? 0.0 : static_cast<double>(total) / m.files.size();
  line(fmt::format("files: {}, {} ({} bytes); per file min {}, max {}, mean {}", m.files.size(),
                   human_bytes(total, 2), total, human_bytes(lo, 2), human_bytes(hi, 2),
                   human_bytes(mean, 2)));

  // The tensor table.
  const std::vector<std::string> names = listing.names_of(m);
  size_t width = 6;
  for (const std::string& n : names) width = std::max(width, n.size());
  line("");
  line(fmt::format("{:<{}}  {:<16} {:>6} {:>14}", "tensor", width, "global shape", "shards",
                   "parameters"));
  int64_t params = 0;
  for (const std::string& name : names) {
    const std::vector<StoredPiece>& pieces = m.tensors.at(name);
    const std::vector<int64_t>& global = pieces.front().piece.global_shape;
    const std::vector<int64_t> shape = listing.real_shape(mc, name, global, where);
    const int64_t n = shape_numel(shape);
    params += n;
    const std::string note =
        n != shape_numel(global)
            ? fmt::format("  ({} of {} rows; the rest is padding)", shape[0], global[0])
            : "";
    line(fmt::format("{:<{}}  {:<16} {:>6} {:>14}{}", name, width,
                     fmt::format("[{}]", fmt::join(global, ", ")), pieces.size(), n, note));
  }
  line(fmt::format("total parameters: {} ({:.2f}M) in {} tensors, each tensor once, padded "
                   "ones by their real rows", params, static_cast<double>(params) / 1e6,
                   names.size()));
  if (!verify) return r;

  // Verification: every file whole, its size and CRC-32, and the pieces it holds.
  line("");
  std::vector<std::string> bad;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const ShardFileInfo& f = m.files[i];
    std::string why;
    std::optional<std::vector<char>> bytes = read_verified_shard_file(storage, ckpt.dir, f, why);
    if (bytes) {
      try {
        using Key = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>,
                               std::vector<int64_t>, int64_t, int64_t>;
        auto key = [](const TensorPiece& t) {
          return Key{t.name, t.global_shape, t.offset, t.shape, t.flat_begin, t.flat_end};
        };
        std::set<Key> listed, held;
        for (const auto& [name, pieces] : m.tensors) {
          for (const StoredPiece& sp : pieces) {
            if (sp.file == static_cast<int>(i)) listed.insert(key(sp.piece));
          }
        }
        ShardReader reader(*bytes, storage.url(join_dir(ckpt.dir, f.name)));
        for (const TensorPiece& t : reader.pieces()) held.insert(key(t));
        if (listed != held) {
          why = fmt::format("{}: holds {} pieces, the manifest lists {} for it, and they differ",
                            storage.url(join_dir(ckpt.dir, f.name)), held.size(), listed.size());
        }
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      bad.push_back(f.name);
      line("BAD " + why);
    }
  }
  line(fmt::format("verify: {} of {} files ok (size, CRC-32 and pieces as the manifest says)",
                   m.files.size() - bad.size(), m.files.size()));
  if (!bad.empty()) {
    throw CheckpointVerifyError(
        fmt::format("{}: {} of {} shard files failed verification: {}", storage.url(ckpt.dir),
                    bad.size(), m.files.size(), fmt::join(bad, ", ")),
        r);
  }
  return r;
}

}  // namespace jumbo
