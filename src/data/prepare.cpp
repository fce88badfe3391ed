// `jumbo data prepare`: read documents, encode them (several threads, output order fixed by
// document order), append EOS, write an indexed dataset.
#include "jumbo/data/prepare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

#include "jumbo/config/config.h"
#include "jumbo/data/tokenizer.h"

namespace jumbo {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw UserError(fmt::format("{}: read error ({})", path, std::strerror(errno)));
  return bytes;
}

// Calls `batch` with consecutive groups of a file's documents, each group holding about
// `batch_bytes` of text (at least one document), so a file of any size streams through.
using DocumentBatch = std::function<void(std::vector<std::string>&)>;

void for_each_jsonl_batch(const std::string& path, const std::string& json_key,
                          size_t batch_bytes, const DocumentBatch& batch) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  std::vector<std::string> docs;
  size_t bytes = 0;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // e.byte is the column; the library's own message repeats it with internal detail.
      throw UserError(fmt::format("{}:{}: not valid JSON at column {} (expected one JSON object "
                                  "per line)", path, line_no, e.byte));
    }
    if (!obj.is_object()) {
      throw UserError(fmt::format("{}:{}: a JSON {}, expected an object with a string \"{}\"", path,
                                  line_no, obj.type_name(), json_key));
    }
    const auto field = obj.find(json_key);
    if (field == obj.end() || !field->is_string()) {
      throw UserError(fmt::format("{}:{}: {}, expected a string field \"{}\"", path, line_no,
                                  field == obj.end() ? "no such key" : "the value is a " +
                                  std::string(field->type_name()), json_key));
    }
    docs.push_back(field->get<std::string>());
    bytes += docs.back().size();
    if (bytes >= batch_bytes) {
      batch(docs);
      docs.clear();
      bytes = 0;
    }
  }
  if (in.bad()) throw UserError(fmt::format("{}: read error ({})", path, std::strerror(errno)));
  if (!docs.empty()) batch(docs);
}

void for_each_document_batch(const std::string& path, const std::string& json_key,
                             size_t batch_bytes, const DocumentBatch& batch) {
  if (ends_with(path, ".jsonl")) return for_each_jsonl_batch(path, json_key, batch_bytes, batch);
  std::vector<std::string> one{read_file(path)};
  batch(one);
}

// Encodes docs[i] into out[i], documents dealt round-robin to threads; the result does not
// depend on the thread count.
void encode_all(const Tokenizer& tok, const std::vector<std::string>& docs,
                std::vector<std::vector<int32_t>>& out) {
  out.assign(docs.size(), {});
  const size_t threads =
      std::min<size_t>(docs.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::exception_ptr> errors(threads);
  auto work = [&](size_t t) {
    try {
      for (size_t i = t; i < docs.size(); i += threads) out[i] = tok.encode(docs[i]);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  if (threads > 0) work(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

std::vector<std::string> read_documents(const std::string& path, const std::string& json_key) {
  std::vector<std::string> all;
  for_each_document_batch(path, json_key, SIZE_MAX, [&](std::vector<std::string>& docs) {
    for (auto& d : docs) all.push_back(std::move(d));
  });
  return all;
}

DatasetHeader prepare_dataset(const PrepareOptions& opts) {
  if (opts.inputs.empty()) throw UserError("data prepare: no input files given");
  if (opts.output_prefix.empty()) throw UserError("data prepare: no output prefix given");
  const Tokenizer tok(opts.tokenizer);
  IndexedDatasetWriter writer(opts.output_prefix, static_cast<uint64_t>(tok.vocab_size()),
                              tok.fingerprint());
  std::vector<std::vector<int32_t>> encoded;
  for (const auto& path : opts.inputs) {
    // Batches of ~64 MB of text keep memory flat however large the input.
    for_each_document_batch(path, opts.json_key, size_t{64} << 20, [&](std::vector<std::string>& docs) {
      encode_all(tok, docs, encoded);
      for (auto& ids : encoded) {
        ids.push_back(tok.eos_id());
        writer.add_document(ids);
      }
    });
  }
  return writer.finish();
}

}  // namespace jumbo
