#pragma once
// `jumbo plot`: the training curves of a metrics file (log.metrics_file) as a standalone SVG.
// Format and reading rules: docs/metrics.md, "Plot".
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace jumbo {

struct MetricsRow {
  int64_t step = 0;
  int64_t tokens = 0;
  double loss = 0;                  // NaN when the line had a non-finite loss (null)
  double lr = 0;                    // NaN when absent or null
  std::optional<double> val_loss;   // eval steps only; NaN when null
};

struct MetricsHistory {
  std::vector<MetricsRow> rows;     // one per step, ascending; the last line of a step wins
  int64_t lines = 0;                // metrics lines read (blank lines not counted)
  int64_t replaced = 0;             // lines superseded by a later line of the same step
  int64_t nonfinite_loss = 0;       // kept steps whose loss is not finite (left off the curve)
};

// Reads a JSON-lines metrics file. Throws UserError (one line naming the file, and the line
// number where there is one) for a missing or empty file, a line that is not a JSON object,
// or a line without a numeric `tokens` or a `loss`.
MetricsHistory read_metrics_history(const std::string& path);

struct PlotOptions {
  std::string title;
  int width = 900;
  int height = 600;
  // Above this many points a curve keeps, per pixel column, its first, lowest, highest and
  // last point: the file stays small and spikes stay visible.
  int64_t max_points = 4000;
};

// Loss and validation loss (upper panel) and learning rate (lower panel) against tokens.
// Polylines carry id="loss", id="val_loss" (when any) and id="lr" (when any).
std::string render_training_svg(const MetricsHistory& history, const PlotOptions& options);

// "0", "500K", "1.5M", "2B": a token count as the axis shows it.
std::string format_token_count(double tokens);
// Tick values at 1, 2 or 5 x 10^k covering [lo, hi] with about `target` intervals.
std::vector<double> nice_ticks(double lo, double hi, int target);

}  // namespace jumbo
