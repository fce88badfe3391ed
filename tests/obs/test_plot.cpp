// `jumbo plot`: reading a metrics file (resumed runs, eval steps, a diverged step, bad lines)
// and the SVG it draws (well-formed XML, one point per step, axes, legend).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "obs_test_support.h"

#include "jumbo/config/config.h"
#include "jumbo/obs/metrics.h"
#include "jumbo/obs/plot.h"

namespace fs = std::filesystem;

namespace {

jumbo::StepMetrics step_metrics(int64_t step, double loss) {
  jumbo::StepMetrics m;
  m.step = step;
  m.total_steps = 12;
  m.loss = loss;
  m.lr = 6e-4 * std::min<double>(1.0, static_cast<double>(step) / 4.0);  // warm-up, then flat
  m.global_batch = 16;
  m.tokens = step * 4096;
  m.tokens_per_s = 1000;
  m.step_time_s = 4;
  return m;
}

// Checks that `xml` is well formed as far as an SVG writer can get it wrong: tags balance and
// nest, attributes are quoted, text has no bare '<' or '&'. Returns "" or the first problem.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  int roots = 0;
  for (size_t i = 0; i < xml.size();) {
    if (xml[i] == '&') {
      const size_t semi = xml.find(';', i);
      const std::string entity = semi == std::string::npos ? "" : xml.substr(i, semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;") {
        return "bare & at " + std::to_string(i);
      }
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    if (xml.compare(i, 2, "<?") == 0) {
      i = xml.find("?>", i) + 2;
      continue;
    }
    if (xml.compare(i, 4, "<!--") == 0) {
      i = xml.find("-->", i) + 3;
      continue;
    }
    // Find the end of the tag, skipping quoted attribute values.
    size_t end = i + 1;
    char quote = 0;
    for (; end < xml.size(); ++end) {
      const char c = xml[end];
      if (quote) {
        if (c == quote) quote = 0;
        if (c == '<') return "'<' inside an attribute at " + std::to_string(end);
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '>') {
        break;
      }
    }
    if (end >= xml.size()) return "unterminated tag at " + std::to_string(i);
    const std::string tag = xml.substr(i + 1, end - i - 1);
    if (tag.empty()) return "empty tag";
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return "unbalanced </" + tag.substr(1) + ">";
      open.pop_back();
    } else {
      const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
      if (open.empty()) ++roots;
      if (tag.back() != '/') open.push_back(name);
    }
    i = end + 1;
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

// The value of attribute `attr` of the element with id="id"; "" when absent.
std::string attribute_of(const std::string& svg, const std::string& id, const std::string& attr) {
  const size_t at = svg.find("id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t start = svg.rfind('<', at), end = svg.find('>', at);
  const std::string tag = svg.substr(start, end - start);
  const size_t a = tag.find(" " + attr + "=\"");
  if (a == std::string::npos) return "";
  const size_t v = a + attr.size() + 3;
  return tag.substr(v, tag.find('"', v) - v);
}

std::vector<std::pair<double, double>> points_of(const std::string& svg, const std::string& id) {
  std::vector<std::pair<double, double>> pts;
  std::istringstream in(attribute_of(svg, id, "points"));
  for (std::string xy; in >> xy;) {
    const size_t comma = xy.find(',');
    pts.push_back({std::stod(xy.substr(0, comma)), std::stod(xy.substr(comma + 1))});
  }
  return pts;
}

class PlotFiles : public jumbo::testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    fs::create_directories(dir_);
  }

  // Run 1: steps 1-8, step 3 diverged (null loss), eval at 4 and 8. Run 2 resumed from the
  // step-6 checkpoint: steps 7-12 again, eval at 8 and 12. 12 steps, 11 finite, 3 evals.
  std::string resumed_run_file() {
    const std::string path = (dir_ / "metrics.jsonl").string();
    std::ofstream out(path);
    for (int64_t s = 1; s <= 8; ++s) {
      jumbo::StepMetrics m = step_metrics(s, s == 3 ? std::nan("") : 10.0 - 0.5 * s);
      if (s % 4 == 0) m.val_loss = 10.2 - 0.5 * s;
      out << jumbo::to_json_line(m) << '\n';
    }
    for (int64_t s = 7; s <= 12; ++s) {
      jumbo::StepMetrics m = step_metrics(s, 9.0 - 0.5 * s);
      if (s % 4 == 0) m.val_loss = 9.1 - 0.5 * s;
      out << jumbo::to_json_line(m) << '\n';
    }
    return path;
  }
  std::string write_file(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  // The UserError message of reading `path`, or "" when it did not throw.
  static std::string read_error(const std::string& path) {
    try {
      jumbo::read_metrics_history(path);
    } catch (const jumbo::UserError& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

TEST_F(PlotFiles, ResumedRunKeepsTheLastLineOfEachStep) {
  const jumbo::MetricsHistory h = jumbo::read_metrics_history(resumed_run_file());
  EXPECT_EQ(h.lines, 14);
  EXPECT_EQ(h.replaced, 2);
  EXPECT_EQ(h.nonfinite_loss, 1);
  ASSERT_EQ(h.rows.size(), 12u);
  for (size_t i = 0; i < h.rows.size(); ++i) EXPECT_EQ(h.rows[i].step, static_cast<int64_t>(i) + 1);
  EXPECT_TRUE(std::isnan(h.rows[2].loss));
  EXPECT_DOUBLE_EQ(h.rows[7].loss, 9.0 - 0.5 * 8);       // run 2's step 8, not run 1's
  EXPECT_DOUBLE_EQ(*h.rows[7].val_loss, 9.1 - 0.5 * 8);
  EXPECT_FALSE(h.rows[8].val_loss.has_value());
  EXPECT_EQ(h.rows[11].tokens, 12 * 4096);
  EXPECT_DOUBLE_EQ(h.rows[0].lr, 1.5e-4);
}

TEST_F(PlotFiles, SvgIsWellFormedWithOnePointPerStep) {
  const jumbo::MetricsHistory h = jumbo::read_metrics_history(resumed_run_file());
  jumbo::PlotOptions options;
  options.title = "run <a> & \"b\"";
  const std::string svg = jumbo::render_training_svg(h, options);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("run &lt;a&gt; &amp; &quot;b&quot;"), std::string::npos) << "title escaped";

  const auto loss = points_of(svg, "loss");
  const auto val = points_of(svg, "val_loss");
  const auto lr = points_of(svg, "lr");
  EXPECT_EQ(loss.size(), 11u) << "12 steps, one of them NaN";
  EXPECT_EQ(val.size(), 3u);
  EXPECT_EQ(lr.size(), 12u);
  for (size_t i = 1; i < loss.size(); ++i) EXPECT_GT(loss[i].first, loss[i - 1].first) << i;
  // Loss falls: pixel y grows downwards, so later points sit lower on the page (larger y).
  EXPECT_GT(loss.back().second, loss.front().second);
  // Warm-up: the learning rate rises, then stays flat.
  EXPECT_LT(lr[3].second, lr[0].second);
  EXPECT_DOUBLE_EQ(lr[11].second, lr[3].second);
  // lr is drawn in its own panel, below the loss panel.
  for (const auto& p : lr) EXPECT_GT(p.second, std::max_element(loss.begin(), loss.end(),
      [](auto& a, auto& b) { return a.second < b.second; })->second);

  for (const char* label : {">tokens<", ">loss (nats/token)<", ">learning rate<", ">train loss<",
                            ">val loss<", ">0<", ">10K<", ">40K<", ">4<", ">10<", "id=\"legend\""}) {
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  }
  // The token axis ends with the data (49152 tokens): no empty stretch to a 50K tick.
  EXPECT_EQ(svg.find(">50K<"), std::string::npos);
  EXPECT_EQ(loss.back().first, lr.back().first);
}

TEST_F(PlotFiles, NoValLossNoValCurve) {
  std::ofstream out(dir_ / "m.jsonl");
  for (int64_t s = 1; s <= 3; ++s) out << jumbo::to_json_line(step_metrics(s, 5.0 - s)) << '\n';
  out.close();
  const std::string svg = jumbo::render_training_svg(
      jumbo::read_metrics_history((dir_ / "m.jsonl").string()), {});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(points_of(svg, "loss").size(), 3u);
  EXPECT_EQ(svg.find("id=\"val_loss\""), std::string::npos);
  EXPECT_EQ(svg.find(">val loss<"), std::string::npos);
}

TEST_F(PlotFiles, LongRunsAreThinnedButKeepTheirSpikes) {
  std::ofstream out(dir_ / "long.jsonl");
  for (int64_t s = 1; s <= 20000; ++s) {
    out << jumbo::to_json_line(step_metrics(s, s == 12345 ? 9.0 : 3.0 + 1.0 / static_cast<double>(s)))
        << '\n';
  }
  out.close();
  const auto h = jumbo::read_metrics_history((dir_ / "long.jsonl").string());
  jumbo::PlotOptions all;
  all.max_points = 1 << 30;
  const auto full = points_of(jumbo::render_training_svg(h, all), "loss");
  const auto thin = points_of(jumbo::render_training_svg(h, {}), "loss");
  ASSERT_EQ(full.size(), 20000u);
  EXPECT_LT(thin.size(), 4000u);
  const auto by_y = [](auto& a, auto& b) { return a.second < b.second; };
  EXPECT_EQ(std::min_element(thin.begin(), thin.end(), by_y)->second,
            std::min_element(full.begin(), full.end(), by_y)->second) << "the spike survives";
  EXPECT_EQ(std::max_element(thin.begin(), thin.end(), by_y)->second,
            std::max_element(full.begin(), full.end(), by_y)->second);
  EXPECT_EQ(thin.back(), full.back());
}

TEST_F(PlotFiles, UserErrorsNameFileAndLine) {
  const std::string missing = (dir_ / "nope.jsonl").string();
  EXPECT_NE(read_error(missing).find(missing + ": no such file"), std::string::npos);

  const std::string empty = write_file("empty.jsonl", "\n  \n");
  EXPECT_NE(read_error(empty).find(empty + ": empty"), std::string::npos) << read_error(empty);

  const std::string good = jumbo::to_json_line(step_metrics(1, 5.0));
  const std::string bad_json = write_file("bad.jsonl", good + "\n" + good + "\n{\"step\": 3, \"loss\n");
  const std::string e1 = read_error(bad_json);
  EXPECT_NE(e1.find(bad_json + ":3: not a JSON object"), std::string::npos) << e1;

  const std::string no_loss = write_file("noloss.jsonl", good + "\n{\"step\":2,\"tokens\":5}\n");
  const std::string e2 = read_error(no_loss);
  EXPECT_NE(e2.find(no_loss + ":2: no \"loss\""), std::string::npos) << e2;

  const std::string no_tokens = write_file("notokens.jsonl", "{\"step\":1,\"loss\":2.5}\n");
  const std::string e3 = read_error(no_tokens);
  EXPECT_NE(e3.find(no_tokens + ":1: no integer \"tokens\""), std::string::npos) << e3;

  const std::string all_nan = write_file("nan.jsonl", "{\"step\":1,\"tokens\":8,\"loss\":null}\n");
  EXPECT_NE(read_error(all_nan).find("no line has a finite loss"), std::string::npos);

  for (const std::string& e : {e1, e2, e3}) EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(PlotAxes, NiceTicks) {
  EXPECT_EQ(jumbo::nice_ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(jumbo::nice_ticks(2.1, 10.8, 6), (std::vector<double>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(jumbo::nice_ticks(0, 6e-4, 3), (std::vector<double>{0, 2e-4, 4e-4, 6e-4}));
  EXPECT_EQ(jumbo::nice_ticks(4096, 49152, 8),
            (std::vector<double>{0, 10000, 20000, 30000, 40000, 50000}));
  const auto one = jumbo::nice_ticks(3, 3, 5);  // a single value still gets an axis
  EXPECT_LT(one.front(), 3);
  EXPECT_GT(one.back(), 3);
}

TEST(PlotAxes, TokenCounts) {
  EXPECT_EQ(jumbo::format_token_count(0), "0");
  EXPECT_EQ(jumbo::format_token_count(512), "512");
  EXPECT_EQ(jumbo::format_token_count(500000), "500K");
  EXPECT_EQ(jumbo::format_token_count(1.5e6), "1.5M");
  EXPECT_EQ(jumbo::format_token_count(2e9), "2B");
  EXPECT_EQ(jumbo::format_token_count(3.0e11), "300B");
}
