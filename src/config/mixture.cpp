// Data mixtures in Megatron's --data-path form: "0.6 data/web 0.4 data/books".
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <sstream>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

// A whole word that is a finite number ("0.6", "1", "2e-1"); paths are everything else.
bool parse_weight(const std::string& word, double& out) {
  const char* end = word.data() + word.size();
  const auto [ptr, ec] = std::from_chars(word.data(), end, out);
  return ec == std::errc() && ptr == end;
}

std::string weight_text(double w) { return fmt::format("{}", w); }

}  // namespace

std::string DataMixture::name(size_t i) const {
  std::string p = datasets.at(i).prefix;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string DataMixture::describe() const {
  if (datasets.size() == 1 && datasets[0].weight == 1.0) return datasets[0].prefix;
  std::string out;
  for (const DatasetWeight& d : datasets)
    out += fmt::format("{}{} {}", out.empty() ? "" : " ", weight_text(d.weight), d.prefix);
  return out;
}

DataMixture parse_mixture(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  DataMixture m;
  if (words.empty()) return m;
  double w = 0;
  if (!parse_weight(words[0], w)) {  // prefixes only: equal weights
    for (const std::string& p : words) {
      if (parse_weight(p, w)) {
        throw UserError(fmt::format("\"{}\" mixes prefixes and weights: expected \"PREFIX\", "
                                    "\"PREFIX PREFIX ...\" or \"WEIGHT PREFIX WEIGHT PREFIX ...\"",
                                    std::string(text)));
      }
      m.datasets.push_back({p, 1.0});
    }
    return m;
  }
  if (words.size() % 2 != 0) {
    throw UserError(fmt::format("\"{}\" has {} words: expected pairs \"WEIGHT PREFIX ...\" "
                                "(Megatron's --data-path form)", std::string(text), words.size()));
  }
  for (size_t i = 0; i < words.size(); i += 2) {
    double weight = 0;
    if (!parse_weight(words[i], weight)) {
      throw UserError(fmt::format("\"{}\": word {} \"{}\" is not a weight: expected pairs "
                                  "\"WEIGHT PREFIX ...\"", std::string(text), i + 1, words[i]));
    }
    if (parse_weight(words[i + 1], w)) {
      throw UserError(fmt::format("\"{}\": word {} \"{}\" is a number where a prefix was "
                                  "expected: expected pairs \"WEIGHT PREFIX ...\"",
                                  std::string(text), i + 2, words[i + 1]));
    }
    m.datasets.push_back({words[i + 1], weight});
  }
  return m;
}

}  // namespace jumbo
