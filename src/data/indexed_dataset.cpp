// One dataset as one token stream over its segments: a jumbo pair (open_jumbo_segment), the
// parts a preparation over many ranks wrote (listed by PREFIX.parts), or a Megatron-LM pair
// (open_megatron_segment). Formats: docs/data-format.md.
#include "jumbo/data/indexed_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "jumbo/config/config.h"
#include "token_segment.h"

namespace jumbo {
namespace {

// Datasets up to this many tokens have every token checked against the vocabulary at open;
// larger ones an evenly spaced sample of this many, shared among the segments by size (a full
// scan of 300B tokens would take minutes on every start).
constexpr uint64_t kFullTokenCheck = uint64_t{1} << 24;
constexpr const char* kPartsFormat = "jumbo-parts";
constexpr int kPartsVersion = 1;

// The first bytes of a file ("" if it cannot be read), to tell the formats apart.
std::string file_magic(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes(n, '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(n))) return "";
  return bytes;
}

uint64_t token_check_budget(uint64_t segment_tokens, uint64_t total_tokens) {
  if (total_tokens <= kFullTokenCheck) return segment_tokens;
  const long double share = static_cast<long double>(segment_tokens) / total_tokens;
  return std::max<uint64_t>(1, static_cast<uint64_t>(share * kFullTokenCheck));
}

}  // namespace

std::string fingerprint_text(uint64_t f) { return fmt::format("{:#018x}", f); }

const char* to_string(DocumentKind k) {
  return k == DocumentKind::text ? "documents" : "prompt-completion examples";
}

const char* to_string(DatasetFormat f) {
  switch (f) {
    case DatasetFormat::jumbo: return "jumbo";
    case DatasetFormat::jumbo_parts: return "jumbo parts";
    case DatasetFormat::megatron: return "megatron";
  }
  return "?";
}

std::string part_prefix(const std::string& prefix, uint64_t index) {
  return fmt::format("{}.part-{:06d}", prefix, index);
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string parts_path = prefix + ".parts", idx_path = prefix + ".idx";
  if (std::filesystem::exists(parts_path)) {
    if (std::filesystem::exists(idx_path)) {
      throw UserError(fmt::format("{}: both {} and {} exist; a dataset is one or the other "
                                  "(remove the stale one)", prefix, parts_path, idx_path));
    }
    open_parts(parts_path);
  } else if (file_magic(idx_path, 7) == std::string("MMIDIDX", 7)) {
    format_ = DatasetFormat::megatron;
    segments_.push_back(open_megatron_segment(prefix));
  } else {
    // The job file is written before any part, PREFIX.parts after the last.
    if (!std::filesystem::exists(idx_path) && std::filesystem::exists(parts_path + ".job")) {
      throw UserError(fmt::format("{}: parts but no {}: the preparation did not finish; rerun "
                                  "it to complete the dataset", prefix, parts_path));
    }
    segments_.push_back(open_jumbo_segment(prefix));
  }

  token_starts_.assign(1, 0);
  doc_starts_.assign(1, 0);
  for (const auto& s : segments_) {
    token_starts_.push_back(token_starts_.back() + s->num_tokens());
    doc_starts_.push_back(doc_starts_.back() + s->num_docs());
  }
  header_.num_tokens = token_starts_.back();
  header_.num_docs = doc_starts_.back();
  if (format_ != DatasetFormat::jumbo_parts) {
    header_.vocab_size = segments_[0]->vocab_size();
    header_.tokenizer_fingerprint = segments_[0]->tokenizer_fingerprint();
  }
  if (format_ != DatasetFormat::megatron) header_.dtype = jumbo_segment_dtype(*segments_[0]);
  header_.kind = segments_[0]->kind();
  for (const auto& s : segments_) {
    if (s->kind() != header_.kind) {  // a sample reads across parts: one kind throughout
      throw UserError(fmt::format("{}: holds {}, but {} holds {}; a dataset is documents or "
                                  "prompt-completion examples throughout", s->bin_path(),
                                  to_string(s->kind()), segments_[0]->bin_path(),
                                  to_string(header_.kind)));
    }
  }
  // jumbo's formats record their vocabulary: check the tokens against it now.
  if (format_ != DatasetFormat::megatron) {
    for (const auto& s : segments_)
      s->check_tokens_below(s->vocab_size(), token_check_budget(s->num_tokens(), num_tokens()));
  }
}

IndexedDataset::~IndexedDataset() = default;

void IndexedDataset::open_parts(const std::string& parts_path) {
  format_ = DatasetFormat::jumbo_parts;
  std::ifstream in(parts_path);
  if (!in) throw UserError(fmt::format("{}: cannot open ({})", parts_path, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError(fmt::format("{}: not valid JSON at byte {} (expected a parts index)", parts_path,
                                e.byte));
  }
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) {
      throw UserError(fmt::format("{}: no field \"{}\" (expected a jumbo parts index)", parts_path, key));
    }
    return j[key];
  };
  auto count = [&](const nlohmann::json& v, const std::string& what) -> uint64_t {
    if (!v.is_number_unsigned()) {
      throw UserError(fmt::format("{}: {} = {}, expected a non-negative integer", parts_path, what,
                                  v.dump()));
    }
    return v.get<uint64_t>();
  };
  if (field("format") != kPartsFormat || field("version") != kPartsVersion) {
    throw UserError(fmt::format("{}: format {} version {}, expected \"{}\" version {}", parts_path,
                                field("format").dump(), field("version").dump(), kPartsFormat,
                                kPartsVersion));
  }
  header_.vocab_size = count(field("vocab_size"), "vocab_size");
  const nlohmann::json& fp = field("tokenizer_fingerprint");
  try {
    header_.tokenizer_fingerprint = std::stoull(fp.get<std::string>(), nullptr, 16);
  } catch (const std::exception&) {
    throw UserError(fmt::format("{}: tokenizer_fingerprint = {}, expected a hex string \"0x...\"",
                                parts_path, fp.dump()));
  }
  const nlohmann::json& parts = field("parts");
  if (!parts.is_array() || parts.empty()) {
    throw UserError(fmt::format("{}: parts = {}, expected a non-empty array", parts_path,
                                parts.is_array() ? "[]" : parts.dump()));
  }
  const std::filesystem::path dir = std::filesystem::path(prefix_).parent_path();
  for (size_t i = 0; i < parts.size(); ++i) {
    const nlohmann::json& p = parts[i];
    const std::string where = fmt::format("parts[{}]", i);
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string()) {
      throw UserError(fmt::format("{}: {} has no string \"name\"", parts_path, where));
    }
    const std::string part = (dir / p["name"].get<std::string>()).string();
    auto segment = open_jumbo_segment(part);
    const uint64_t docs = count(p.value("num_docs", nlohmann::json()), where + ".num_docs");
    const uint64_t tokens = count(p.value("num_tokens", nlohmann::json()), where + ".num_tokens");
    if (segment->num_docs() != docs || segment->num_tokens() != tokens) {
      throw UserError(fmt::format("{}: {}.idx holds {} documents, {} tokens; {} lists {} documents, "
                                  "{} tokens", parts_path, part, segment->num_docs(),
                                  segment->num_tokens(), where, docs, tokens));
    }
    if (segment->vocab_size() != header_.vocab_size ||
        segment->tokenizer_fingerprint() != header_.tokenizer_fingerprint) {
      throw UserError(fmt::format("{}.idx: made with a tokenizer of vocab {} (fingerprint {}), but "
                                  "{} records vocab {} (fingerprint {})", part,
                                  segment->vocab_size(),
                                  fingerprint_text(segment->tokenizer_fingerprint()), parts_path,
                                  header_.vocab_size, fingerprint_text(header_.tokenizer_fingerprint)));
    }
    segments_.push_back(std::move(segment));
  }
}

size_t IndexedDataset::segment_of_token(uint64_t token) const {
  // The last segment whose start is <= token (empty segments are skipped over).
  const auto it = std::upper_bound(token_starts_.begin(), token_starts_.end() - 1, token);
  return static_cast<size_t>(it - token_starts_.begin()) - 1;
}

uint64_t IndexedDataset::doc_offset(uint64_t doc) const {
  if (doc > header_.num_docs) {
    throw std::out_of_range(fmt::format("{}: document {} of {}", prefix_, doc, header_.num_docs));
  }
  if (doc == header_.num_docs) return header_.num_tokens;
  const auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end() - 1, doc);
  const size_t s = static_cast<size_t>(it - doc_starts_.begin()) - 1;
  return token_starts_[s] + segments_[s]->doc_offset(doc - doc_starts_[s]);
}

uint64_t IndexedDataset::doc_loss_start(uint64_t doc) const {
  if (doc >= header_.num_docs) {
    throw std::out_of_range(fmt::format("{}: document {} of {}", prefix_, doc, header_.num_docs));
  }
  const auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end() - 1, doc);
  const size_t s = static_cast<size_t>(it - doc_starts_.begin()) - 1;
  return segments_[s]->loss_start(doc - doc_starts_[s]);
}

void IndexedDataset::read(uint64_t start, uint64_t count, int32_t* out) const {
  if (start > header_.num_tokens || count > header_.num_tokens - start) {
    throw std::out_of_range(fmt::format("{}: tokens [{}, {}) past the end ({} tokens)", prefix_,
                                        start, start + count, header_.num_tokens));
  }
  for (size_t s = count > 0 ? segment_of_token(start) : 0; count > 0; ++s) {
    const uint64_t local = start - token_starts_[s];
    const uint64_t n = std::min(count, segments_[s]->num_tokens() - local);
    segments_[s]->read(local, n, out);
    start += n;
    count -= n;
    out += n;
  }
}

void IndexedDataset::check_tokenizer(uint64_t vocab_size, uint64_t fingerprint,
                                     const std::string& tokenizer_path) const {
  if (format_ == DatasetFormat::megatron) {
    for (const auto& s : segments_)
      s->check_tokens_below(vocab_size, token_check_budget(s->num_tokens(), num_tokens()));
    return;
  }
  if (vocab_size == header_.vocab_size && fingerprint == header_.tokenizer_fingerprint) return;
  throw UserError(fmt::format("{}{}: made with a tokenizer of vocab {} (fingerprint {}), but "
                              "data.tokenizer = {} has vocab {} (fingerprint {})", prefix_,
                              format_ == DatasetFormat::jumbo_parts ? ".parts" : ".idx",
                              header_.vocab_size, fingerprint_text(header_.tokenizer_fingerprint),
                              tokenizer_path, vocab_size, fingerprint_text(fingerprint)));
}

void write_parts_index(const std::string& prefix, const std::vector<DatasetPart>& parts,
                       uint64_t vocab_size, uint64_t tokenizer_fingerprint) {
  nlohmann::json list = nlohmann::json::array();
  uint64_t docs = 0, tokens = 0;
  for (const DatasetPart& p : parts) {
    list.push_back({{"name", p.name}, {"num_docs", p.num_docs}, {"num_tokens", p.num_tokens}});
    docs += p.num_docs;
    tokens += p.num_tokens;
  }
  const nlohmann::json j = {{"format", kPartsFormat},
                            {"version", kPartsVersion},
                            {"vocab_size", vocab_size},
                            {"tokenizer_fingerprint", fingerprint_text(tokenizer_fingerprint)},
                            {"num_docs", docs},
                            {"num_tokens", tokens},
                            {"parts", list}};
  const std::string path = prefix + ".parts", tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    out.close();
    if (!out) throw UserError(fmt::format("{}: write failed ({})", tmp, std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw UserError(fmt::format("{}: cannot rename to {} ({})", tmp, path, std::strerror(errno)));
  }
}

}  // namespace jumbo
