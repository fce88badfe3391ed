// Per-step metrics: one JSON object per line (machine-readable) and a one-line human summary.
// Field meanings and units are documented in docs/metrics.md.
#include "jumbo/obs/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

// JSON has no NaN or Infinity: a non-finite value is written as null, so every line stays
// parseable by strict readers (Python's json, jq) and a diverged loss is still visible.
nlohmann::ordered_json finite_or_null(double x) {
  if (!std::isfinite(x)) return nullptr;
  return x;
}

// "950", "12.3k", "4.56M": tokens per second at a glance.
std::string format_rate(double per_s) {
  if (!std::isfinite(per_s)) return "?";
  if (per_s < 1e3) return fmt::format("{:.0f}", per_s);
  if (per_s < 1e6) return fmt::format("{:.1f}k", per_s / 1e3);
  if (per_s < 1e9) return fmt::format("{:.2f}M", per_s / 1e6);
  return fmt::format("{:.2f}G", per_s / 1e9);
}

}  // namespace

std::string human_bytes(double b, int decimals) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.{}f} {}", b, decimals, units[u]);
}

namespace {

std::string format_bytes(uint64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  constexpr double kGiB = kMiB * 1024.0;
  if (bytes >= uint64_t(1) << 30) return fmt::format("{:.1f} GiB", double(bytes) / kGiB);
  return fmt::format("{:.0f} MiB", double(bytes) / kMiB);
}

int decimal_digits(int64_t n) {
  int digits = 1;
  for (n = n < 0 ? -n : n; n >= 10; n /= 10) ++digits;
  return digits;
}

}  // namespace

std::string to_json_line(const StepMetrics& m) {
  // ordered_json keeps the documented field order, which makes the file easy to eyeball.
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["total_steps"] = m.total_steps;
  j["loss"] = finite_or_null(m.loss);
  j["lr"] = finite_or_null(m.lr);
  j["grad_norm"] = finite_or_null(m.grad_norm);
  j["global_batch"] = m.global_batch;
  j["tokens"] = m.tokens;
  j["tokens_per_s"] = finite_or_null(m.tokens_per_s);
  j["tflops_per_device"] = finite_or_null(m.tflops_per_device);
  j["mfu"] = finite_or_null(m.mfu);
  j["step_time_s"] = finite_or_null(m.step_time_s);
  j["mem_peak_bytes"] = m.mem_peak_bytes;
  j["eta_s"] = finite_or_null(m.eta_s);
  if (m.val_loss) j["val_loss"] = finite_or_null(*m.val_loss);
  for (const auto& [set, loss] : m.val_losses) j["val_loss." + set] = finite_or_null(loss);
  for (const auto& [group, bytes] : m.comm_bytes) j["comm_bytes"][group] = bytes;
  if (const auto& a = m.anomaly) {
    nlohmann::ordered_json& e = j["anomaly"];
    const SkippedSamples& r = a->record;
    e["kind"] = to_string(r.kind);
    e["action"] = to_string(r.action);
    if (a->requested != r.action) e["requested"] = to_string(a->requested);
    e["loss_mean"] = finite_or_null(a->running_mean);
    e["threshold"] = finite_or_null(a->threshold);
    if (r.action != AnomalyAction::stop) e["skipped_samples"] = {r.first_sample, r.end_sample};
    if (r.action == AnomalyAction::rewind) e["rewound_to_step"] = r.rewound_to_step;
    e["recent"] = a->recent;
    e["limit"] = a->limit;
    e["window"] = a->window;
  }
  if (const auto& t = m.ranks) {
    nlohmann::ordered_json& e = j["ranks"];
    e["compute_s"] = {{"min", t->compute_s.min}, {"median", t->compute_s.median}, {"max", t->compute_s.max}};
    e["wait_s"] = {{"min", t->wait_s.min}, {"median", t->wait_s.median}, {"max", t->wait_s.max}};
    e["slowest_rank"] = t->slowest_rank;
    e["slowest_host"] = t->slowest_host;
    e["slowest_ratio"] = finite_or_null(t->slowest_ratio);
    e["stragglers"] = nlohmann::ordered_json::array();
    for (const RankTimes::Straggler& s : t->stragglers) {
      e["stragglers"].push_back({{"rank", s.rank}, {"host", s.host}, {"ratio", finite_or_null(s.ratio)},
                                 {"intervals", s.intervals}});
    }
  }
  return j.dump();
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  if (seconds < 0) seconds = 0;
  const auto total = static_cast<int64_t>(std::llround(seconds));
  const int64_t days = total / 86400, hours = total / 3600 % 24;
  const int64_t minutes = total / 60 % 60, secs = total % 60;
  if (total < 60) return fmt::format("{}s", secs);
  if (total < 3600) return fmt::format("{}m{:02}s", minutes, secs);
  if (total < 86400) return fmt::format("{}h{:02}m", total / 3600, minutes);
  return fmt::format("{}d{:02}h", days, hours);
}

std::string human_line(const StepMetrics& m) {
  // Right-align the step to the width of the total (at least 4) so columns line up.
  const int width = std::max(4, decimal_digits(m.total_steps));
  std::string line = fmt::format("step {:>{}}/{} | loss {:.4f}", m.step, width, m.total_steps, m.loss);
  if (m.val_loss) line += fmt::format(" | val {:.4f}", *m.val_loss);
  if (m.val_losses.size() > 1) {
    for (const auto& [set, loss] : m.val_losses) line += fmt::format(" {} {:.4f}", set, loss);
  }
  line += fmt::format(" | lr {:.2e} | gnorm {:.3f} | batch {}", m.lr, m.grad_norm, m.global_batch);
  line += fmt::format(" | {} tok/s | {:.3f} TFLOP/s | MFU {:.1f}%", format_rate(m.tokens_per_s),
                      m.tflops_per_device, m.mfu * 100.0);
  line += fmt::format(" | mem {} | left {}", format_bytes(m.mem_peak_bytes), format_duration(m.eta_s));
  return line;
}

std::string anomaly_line(const StepMetrics& m) {
  const StepAnomaly& a = *m.anomaly;
  const SkippedSamples& r = a.record;
  std::string seen =
      r.kind == AnomalyKind::nonfinite
          ? fmt::format("loss {:.4f} and grad norm {:.4f} (not finite)", m.loss, m.grad_norm)
          : fmt::format("loss spike: {:.4f} > {:.4g} x running mean {:.4f}", m.loss,
                        a.running_mean > 0 ? a.threshold / a.running_mean : 0.0, a.running_mean);
  std::string done;
  switch (r.action) {
    case AnomalyAction::stop: done = "stopping before the update"; break;
    case AnomalyAction::skip:
      done = fmt::format("{}skipped the update (samples {}-{} not trained on)",
                         a.requested == AnomalyAction::rewind ? "no checkpoint before it to rewind to: " : "",
                         r.first_sample, r.end_sample - 1);
      break;
    case AnomalyAction::rewind:
      done = fmt::format("rewound to the checkpoint of step {} and skipped samples {}-{}",
                         r.rewound_to_step, r.first_sample, r.end_sample - 1);
      break;
  }
  return fmt::format("step {}: {}; {}; anomaly {} of at most {} in {} steps", m.step, seen, done,
                     a.recent, a.limit, a.window);
}

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  if (path_.empty()) return;
  const std::filesystem::path file(path_);
  if (file.has_parent_path()) {
    // Failure here shows up as the fopen error below, which names the path.
    std::error_code ignored;
    std::filesystem::create_directories(file.parent_path(), ignored);
  }
  // Append: a run resumed from a checkpoint continues the same log; `step` tells lines apart.
  file_ = std::fopen(path_.c_str(), "a");
  if (!file_) {
    throw UserError(fmt::format("log.metrics_file = {}: cannot open for writing: {}", path_,
                                std::strerror(errno)));
  }
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const StepMetrics& m) {
  if (!file_) return;
  const std::string line = to_json_line(m) + '\n';
  // Flushed per line so `tail -f` and a crash both see every finished step.
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw UserError(fmt::format("log.metrics_file = {}: write failed: {}", path_, std::strerror(errno)));
  }
}

}  // namespace jumbo
