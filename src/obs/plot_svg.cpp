// `jumbo plot`: reads a metrics JSON-lines file and draws loss, validation loss and learning
// rate against tokens as a self-contained SVG (no fonts, scripts or libraries needed to view).
#include "jumbo/obs/plot.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr const char* kLossColor = "#1f77b4";
constexpr const char* kValColor = "#d62728";
constexpr const char* kLrColor = "#2ca02c";

// A member that is a number gives it, null gives NaN (MetricsLog writes non-finite as null).
double number_or_nan(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}

std::string excerpt(const std::string& line) {
  return line.size() <= 40 ? line : line.substr(0, 40) + "...";
}

}  // namespace

MetricsHistory read_metrics_history(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw UserError(fmt::format("{}: no such file", path));
  std::ifstream in(path);
  if (!in) throw UserError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  MetricsHistory history;
  std::map<int64_t, MetricsRow> by_step;  // a resumed run may repeat steps: the last one wins
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = fmt::format("{}:{}", path, line_number);
    if (j.is_discarded() || !j.is_object()) {
      throw UserError(fmt::format("{}: not a JSON object: {} (expected one metrics object per "
                                  "line, as log.metrics_file writes)", where, excerpt(line)));
    }
    const auto tokens = j.find("tokens");
    if (tokens == j.end() || !tokens->is_number_integer()) {
      throw UserError(fmt::format("{}: no integer \"tokens\" field (expected a line written by "
                                  "log.metrics_file)", where));
    }
    const auto loss = j.find("loss");
    if (loss == j.end() || !(loss->is_number() || loss->is_null())) {
      throw UserError(fmt::format("{}: no \"loss\" field with a number or null (expected a line "
                                  "written by log.metrics_file)", where));
    }
    MetricsRow row;
    row.tokens = tokens->get<int64_t>();
    const auto step = j.find("step");
    row.step = step != j.end() && step->is_number_integer() ? step->get<int64_t>() : row.tokens;
    row.loss = number_or_nan(j, "loss");
    row.lr = number_or_nan(j, "lr");
    if (j.contains("val_loss")) row.val_loss = number_or_nan(j, "val_loss");
    ++history.lines;
    const auto [it, inserted] = by_step.insert_or_assign(row.step, row);
    if (!inserted) ++history.replaced;
  }
  if (history.lines == 0) {
    throw UserError(fmt::format("{}: empty: no metrics lines (expected JSON lines written by "
                                "log.metrics_file)", path));
  }
  for (const auto& [step, row] : by_step) {
    history.rows.push_back(row);
    if (!std::isfinite(row.loss)) ++history.nonfinite_loss;
  }
  if (history.nonfinite_loss == static_cast<int64_t>(history.rows.size())) {
    throw UserError(fmt::format("{}: no line has a finite loss ({} steps read)", path,
                                history.rows.size()));
  }
  return history;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {  // one value (or none): a small range around it
    const double pad = lo != 0 ? std::abs(lo) * 0.1 : 0.5;
    lo = lo == 0 ? 0 : lo - pad;  // zero (a learning rate of 0) stays the bottom
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const int exponent = static_cast<int>(std::floor(std::log10(raw)));
  const double magnitude = std::pow(10.0, exponent);
  const double r = raw / magnitude;
  const int mantissa = r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10;
  // k * mantissa * 10^e, computed so that 0.3 prints as 0.3 and not 0.30000000000000004.
  const auto value = [&](int64_t k) {
    const double units = static_cast<double>(k * mantissa);
    return exponent < 0 ? units / std::pow(10.0, -exponent) : units * magnitude;
  };
  const double step = mantissa * magnitude;
  const auto first = static_cast<int64_t>(std::floor(lo / step + 1e-9));
  const auto last = static_cast<int64_t>(std::ceil(hi / step - 1e-9));
  std::vector<double> ticks;
  for (int64_t k = first; k <= last; ++k) ticks.push_back(value(k));
  return ticks;
}

namespace {

// The shortest label that tells the ticks apart: "2.5", "10", "3e-4", "1.5e-4".
std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-6) return "0";
  if (std::abs(step) < 1e-3 || std::abs(v) >= 1e5) {
    for (int digits = 0; digits < 6; ++digits) {
      std::string s = fmt::format("{:.{}e}", v, digits);
      if (std::abs(std::stod(s) - v) > step * 1e-3) continue;
      // "3e-04" -> "3e-4", "2e+05" -> "2e5"
      const size_t e = s.find('e');
      std::string mant = s.substr(0, e), exp = s.substr(e + 1);
      const bool negative = exp[0] == '-';
      exp = exp.substr(1);
      exp.erase(0, std::min(exp.find_first_not_of('0'), exp.size() - 1));
      return mant + "e" + (negative ? "-" : "") + exp;
    }
  }
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

struct Point {
  double x, y;
};

// A plot area in pixels and the data range it shows.
struct Panel {
  double left, top, width, height;
  double x0, x1, y0, y1;
  double px(double x) const { return left + (x - x0) / (x1 - x0) * width; }
  double py(double y) const { return top + height - (y - y0) / (y1 - y0) * height; }
};

// Keeps first, lowest, highest and last point of each pixel column once there are too many.
std::vector<Point> thin_out(const std::vector<Point>& pts, int64_t max_points) {
  if (static_cast<int64_t>(pts.size()) <= max_points) return pts;
  std::vector<Point> out;
  for (size_t i = 0; i < pts.size();) {
    size_t end = i;
    size_t lo = i, hi = i;
    while (end < pts.size() && std::floor(pts[end].x) == std::floor(pts[i].x)) {
      if (pts[end].y > pts[lo].y) lo = end;  // pixel y grows downwards: largest y = lowest value
      if (pts[end].y < pts[hi].y) hi = end;
      ++end;
    }
    size_t keep[] = {i, std::min(lo, hi), std::max(lo, hi), end - 1};
    for (size_t k = 0; k < 4; ++k) {
      if (k == 0 || keep[k] != keep[k - 1]) out.push_back(pts[keep[k]]);
    }
    i = end;
  }
  return out;
}

std::string polyline(const char* id, const char* color, const std::vector<Point>& pts) {
  std::string points;
  for (const Point& p : pts) points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", p.x, p.y);
  std::string s = fmt::format("<polyline id=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" "
                              "stroke-linejoin=\"round\" points=\"{}\"/>\n", id, color, points);
  // A line through one point draws nothing: mark it.
  if (pts.size() == 1) {
    s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", pts[0].x, pts[0].y, color);
  }
  return s;
}

// Grid lines and tick labels on the left; x tick labels only when `x_labels`.
std::string axes(const Panel& p, const std::vector<double>& xt, const std::vector<double>& yt,
                 bool x_labels) {
  std::string s;
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double y : yt) {
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n",
                     p.left, p.py(y), p.left + p.width, p.py(y));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", p.left - 6,
                     p.py(y) + 4, tick_label(y, ystep));
  }
  for (double x : xt) {
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e5e5e5\"/>\n",
                     p.px(x), p.top, p.px(x), p.top + p.height);
    if (x_labels) {
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", p.px(x),
                       p.top + p.height + 16, format_token_count(x));
    }
  }
  s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
                   "stroke=\"#888\"/>\n", p.left, p.top, p.width, p.height);
  return s;
}

std::string y_label(double x, double center_y, const std::string& text) {
  return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 {:.1f} {:.1f})\">{}</text>\n",
                     x, center_y, x, center_y, xml_escape(text));
}

std::pair<double, double> finite_range(const std::vector<double>& v) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double x : v) {
    if (std::isfinite(x)) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  }
  return {lo, hi};
}

}  // namespace

std::string format_token_count(double tokens) {
  const double a = std::abs(tokens);
  const auto scaled = [&](double scale, const char* suffix) {
    std::string s = fmt::format("{:.3f}", tokens / scale);
    s.erase(s.find_last_not_of('0') + 1);  // "1.500" -> "1.5", "2.000" -> "2."
    if (s.back() == '.') s.pop_back();
    return s + suffix;
  };
  if (a >= 1e9) return scaled(1e9, "B");
  if (a >= 1e6) return scaled(1e6, "M");
  if (a >= 1e3) return scaled(1e3, "K");
  return scaled(1, "");
}

std::string render_training_svg(const MetricsHistory& history, const PlotOptions& options) {
  const double W = options.width, H = options.height;
  std::vector<double> tokens, losses, lrs, vals;
  for (const MetricsRow& r : history.rows) {
    tokens.push_back(static_cast<double>(r.tokens));
    losses.push_back(r.loss);
    lrs.push_back(r.lr);
    if (r.val_loss) vals.push_back(*r.val_loss);
  }
  const auto [tmin, tmax] = finite_range(tokens);
  const auto [lmin, lmax] = finite_range(losses);
  const auto [vmin, vmax] = finite_range(vals);
  const auto [rmin, rmax] = finite_range(lrs);
  const bool have_val = std::isfinite(vmin), have_lr = std::isfinite(rmin);

  // The token axis ends with the data (a run stopped at 10.5M does not need an axis to 12M).
  std::vector<double> xt = nice_ticks(tmin, tmax, 8);
  const double x_end = tmax > tmin ? tmax : xt.back();
  while (xt.back() > x_end) xt.pop_back();  // xt.front() <= tmin <= x_end stays
  const std::vector<double> lt =
      nice_ticks(have_val ? std::min(lmin, vmin) : lmin, have_val ? std::max(lmax, vmax) : lmax, 6);
  // Learning rates read best from zero: warm-up starts there and decay heads towards it.
  const std::vector<double> rt = have_lr ? nice_ticks(std::min(0.0, rmin), rmax, 3)
                                         : std::vector<double>{0, 1};
  // Two panels sharing the token axis: loss above (most of the height), learning rate below.
  const double left = 78, right = 24, top = 62, gap = 26, bottom = 58;
  const double plot_h = H - top - gap - bottom;
  const Panel lp{left, top, W - left - right, plot_h * 0.72, xt.front(), x_end, lt.front(), lt.back()};
  const Panel rp{left, top + lp.height + gap, lp.width, plot_h - lp.height,
                 xt.front(), x_end, rt.front(), rt.back()};

  std::vector<Point> loss_pts, val_pts, lr_pts;
  for (const MetricsRow& r : history.rows) {
    const double t = static_cast<double>(r.tokens);
    if (std::isfinite(r.loss)) loss_pts.push_back({lp.px(t), lp.py(r.loss)});
    if (r.val_loss && std::isfinite(*r.val_loss)) val_pts.push_back({lp.px(t), lp.py(*r.val_loss)});
    if (std::isfinite(r.lr)) lr_pts.push_back({rp.px(t), rp.py(r.lr)});
  }

  std::string s = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\" fill=\"#333\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      options.width, options.height);
  s += fmt::format("<text id=\"title\" x=\"{:.1f}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" "
                   "font-weight=\"bold\">{}</text>\n", W / 2, xml_escape(options.title));
  const MetricsRow& last = history.rows.back();
  const double shown_tokens = std::stod(fmt::format("{:.3g}", static_cast<double>(last.tokens)));
  const int64_t first_step = history.rows.front().step;
  std::string summary =
      (first_step == last.step ? fmt::format("step {}", last.step)
                               : fmt::format("steps {}-{}", first_step, last.step)) +
      fmt::format(", {} tokens", format_token_count(shown_tokens));
  for (auto it = history.rows.rbegin(); it != history.rows.rend(); ++it) {
    if (std::isfinite(it->loss)) {
      summary += fmt::format(", last loss {:.4f} (step {})", it->loss, it->step);
      break;
    }
  }
  if (have_val) summary += fmt::format(", best val loss {:.4f}", vmin);
  s += fmt::format("<text x=\"{:.1f}\" y=\"44\" text-anchor=\"middle\" fill=\"#666\">{}</text>\n", W / 2,
                   xml_escape(summary));

  s += axes(lp, xt, lt, false);
  s += axes(rp, xt, rt, true);
  s += y_label(20, lp.top + lp.height / 2, "loss (nats/token)");
  s += y_label(20, rp.top + rp.height / 2, "learning rate");
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">tokens</text>\n",
                   lp.left + lp.width / 2, H - 14);

  s += polyline("loss", kLossColor, thin_out(loss_pts, options.max_points));
  if (!val_pts.empty()) {
    s += polyline("val_loss", kValColor, thin_out(val_pts, options.max_points));
    if (val_pts.size() <= 400) {  // eval points are sparse: mark each one
      s += "<g id=\"val_loss_markers\" fill=\"" + std::string(kValColor) + "\">";
      for (const Point& p : val_pts) s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\"/>", p.x, p.y);
      s += "</g>\n";
    }
  }
  if (!lr_pts.empty()) s += polyline("lr", kLrColor, thin_out(lr_pts, options.max_points));

  // Legend, top right of the loss panel.
  std::vector<std::pair<const char*, const char*>> entries = {{"train loss", kLossColor}};
  if (!val_pts.empty()) entries.push_back({"val loss", kValColor});
  if (!lr_pts.empty()) entries.push_back({"learning rate", kLrColor});
  const double lw = 128, lx = lp.left + lp.width - lw - 10, ly = lp.top + 10;
  s += fmt::format("<g id=\"legend\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                   "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n",
                   lx, ly, lw, 10.0 + 18.0 * static_cast<double>(entries.size()));
  for (size_t i = 0; i < entries.size(); ++i) {
    const double y = ly + 18 + 18 * static_cast<double>(i);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
                     "stroke-width=\"2\"/><text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
                     lx + 10, y - 4, lx + 34, y - 4, entries[i].second, lx + 42, y, entries[i].first);
  }
  s += "</g>\n</svg>\n";
  return s;
}

}  // namespace jumbo
