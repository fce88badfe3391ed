// `jumbo data prepare` over ranks: plan the units, take every ranks-th, encode each into a
// part (threads, output order fixed by document order), then rank 0 lists the parts in
// PREFIX.parts. A rerun of the same job keeps the parts already complete.
#include "jumbo/data/prepare.h"

#include <glob.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/data/tokenizer.h"
#include "prepare_input.h"
#include "token_segment.h"

namespace fs = std::filesystem;

namespace jumbo {
namespace {

// Text handed to the encoding threads at once: large enough to keep them busy, small enough
// that memory stays flat.
constexpr size_t kBatchBytes = size_t{32} << 20;

// A document encoded: its tokens and EOS, and where its loss starts (an example's
// completion; 0 for text).
struct EncodedDocument {
  std::vector<int32_t> tokens;
  uint64_t loss_start = 0;
};

// An example's prompt and completion are encoded apart, so the loss starts at a token
// boundary whatever pieces span the seam (multi-word pieces would merge across it); the
// completion as it continues the prompt (no word-start mark of its own: " press" is
// "▁press", as in the prompt + completion text), which is what eval scores after a context.
EncodedDocument encode_document(const Tokenizer& tok, const InputDocument& doc, DocumentKind kind) {
  // The document start (Llama 3's <|begin_of_text|>) once, even when the text wrote it (a chat
  // template's bos_token), as transformers' tokenizer(text) or apply_chat_template gives.
  EncodedDocument e{with_prefix_once(tok.encode(doc.text), tok.document_start()), 0};
  if (kind == DocumentKind::prompt_completion) {
    e.loss_start = e.tokens.size();
    const std::vector<int32_t> completion = encode_after_boundary(tok, doc.completion);
    e.tokens.insert(e.tokens.end(), completion.begin(), completion.end());
  }
  e.tokens.push_back(tok.eos_id());
  return e;
}

// Encodes docs[i] into out[i], documents dealt round-robin to threads; the result does not
// depend on the thread count.
void encode_all(const Tokenizer& tok, const std::vector<InputDocument>& docs, DocumentKind kind,
                int threads_wanted, std::vector<EncodedDocument>& out) {
  out.assign(docs.size(), {});
  const size_t threads = std::min<size_t>(docs.size(), static_cast<size_t>(threads_wanted));
  std::vector<std::exception_ptr> errors(threads);
  auto work = [&](size_t t) {
    try {
      for (size_t i = t; i < docs.size(); i += threads) out[i] = encode_document(tok, docs[i], kind);
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

// Ranks sharing this node, from the launcher's environment (Open MPI, MPICH/Hydra, Slurm).
int ranks_on_node() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

int encoding_threads(const PrepareOptions& o) {
  if (o.threads > 0) return o.threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / ranks_on_node());
}

// What the parts depend on: a rerun may keep parts only if this is unchanged.
std::string job_text(const PrepareOptions& o, const std::vector<std::string>& files,
                     uint64_t tokenizer_fingerprint, const std::string& chat_template_text) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const std::string& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    inputs.push_back({{"path", fs::absolute(f).string()}, {"bytes", size}, {"mtime", mtime}});
  }
  const nlohmann::json j = {{"inputs", inputs},
                            {"json_key", o.json_key},
                            {"format", to_string(o.kind)},
                            {"chat_template", chat_template_text},
                            {"part_bytes", o.part_bytes},
                            {"bad_documents", o.bad_documents == BadDocuments::skip ? "skip" : "fail"},
                            {"tokenizer_fingerprint", fingerprint_text(tokenizer_fingerprint)}};
  return j.dump(1) + "\n";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return in ? s.str() : "";
}

// Rank 0, before any part is written: the dataset stops looking complete (PREFIX.parts and an
// old single-pair PREFIX.idx/.bin go), and the parts of a different earlier job go too.
void start_job(const std::string& prefix, const std::string& job) {
  const fs::path out(prefix);
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  for (const char* ext : {".parts", ".idx", ".bin"}) fs::remove(prefix + ext);
  const std::string job_path = prefix + ".parts.job";
  if (read_text(job_path) == job) return;
  const std::string stem = out.filename().string() + ".part-";
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind(stem, 0) == 0) fs::remove(entry.path());
  }
  std::ofstream(job_path, std::ios::trunc) << job;
}

// A part a previous run of this job finished (both files renamed into place, sizes agree).
bool part_complete(const std::string& part, uint64_t vocab, uint64_t fingerprint,
                   DocumentKind kind) {
  if (!fs::exists(part + ".idx") || !fs::exists(part + ".bin")) return false;
  try {
    const DatasetHeader h = read_jumbo_header(part);
    return h.vocab_size == vocab && h.tokenizer_fingerprint == fingerprint && h.kind == kind;
  } catch (const UserError&) {
    return false;
  }
}

std::string si(double v) {
  const char* units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (v >= 1000 && u < 5) v /= 1000, ++u;
  return fmt::format("{:.3g}{}", v, units[u]);
}

// Rank 0's progress, scaled to every rank (all take the same share of parts).
class Progress {
 public:
  Progress(double every_s, uint64_t my_bytes, int ranks)
      : every_s_(every_s), my_bytes_(my_bytes), ranks_(ranks) {}
  void update(const UnitStats& done, uint64_t tokens) {
    if (every_s_ <= 0 || my_bytes_ == 0) return;
    const double now = seconds(), elapsed = now - start_;
    if (now - last_ < every_s_) return;
    last_ = now;
    const double share = std::min(1.0, static_cast<double>(done.bytes) / my_bytes_);
    const double left = share > 0 ? elapsed * (1 - share) / share : 0;
    const double scale = static_cast<double>(ranks_) / std::max(elapsed, 1e-9);
    fmt::print("prepare: {:.1f}% | {} docs/s | {}B/s of text | {} tokens/s | left ~{:.0f} s "
               "(rank 0's progress x {} ranks)\n",
               100 * share, si(done.documents * scale), si(done.bytes * scale), si(tokens * scale),
               left, ranks_);
    std::fflush(stdout);
  }

 private:
  static double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double every_s_;
  uint64_t my_bytes_;
  int ranks_;
  double start_ = seconds(), last_ = start_;
};

void check_options(const PrepareOptions& o) {
  if (o.inputs.empty()) throw UserError("data prepare: no input files given (--input)");
  if (o.output_prefix.empty()) throw UserError("data prepare: no output prefix given (--output)");
  if (o.part_bytes < (int64_t{1} << 10)) {
    throw UserError(fmt::format("data prepare: --part-bytes {} is too small, expected >= 1024",
                                o.part_bytes));
  }
  if (o.threads < 0) {
    throw UserError(fmt::format("data prepare: --threads {}, expected >= 0 (0 = cores / ranks on "
                                "the node)", o.threads));
  }
  if (!o.chat_template.empty() && o.kind != DocumentKind::prompt_completion) {
    throw UserError("data prepare: --chat-template formats {\"messages\"} lines of --format "
                    "prompt-completion");
  }
}

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const std::string& p : patterns) {
    if (p.find_first_of("*?[") == std::string::npos) {
      if (fs::is_directory(p)) {
        throw UserError(fmt::format("{}: is a directory, expected a .jsonl or text file", p));
      }
      if (!fs::is_regular_file(p)) throw UserError(fmt::format("{}: no such input file", p));
      files.push_back(p);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);  // matches come sorted
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (rc != 0) throw UserError(fmt::format("{}: the pattern matches no file", p));
  }
  return files;
}

std::vector<std::string> read_documents(const std::string& path, const std::string& json_key) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw UserError(fmt::format("{}: cannot open ({})", path, ec.message()));
  std::vector<std::string> all;
  UnitStats stats;
  for_each_unit_batch({path, 0, size, is_jsonl(path)}, {DocumentKind::text, json_key},
                      BadDocuments::fail, SIZE_MAX, [&](std::vector<InputDocument>& docs) {
                        for (auto& d : docs) all.push_back(std::move(d.text));
                      },
                      stats);
  return all;
}

PrepareResult prepare_dataset(const PrepareOptions& opts) {
  auto solo = make_solo_comm("prepare");
  return prepare_dataset(opts, *solo);
}

PrepareResult prepare_dataset(const PrepareOptions& opts, Comm& ranks) {
  const auto t0 = std::chrono::steady_clock::now();
  check_options(opts);
  const Tokenizer tok(opts.tokenizer);
  std::optional<ChatTemplate> chat_template;  // every rank reads the small file itself
  if (!opts.chat_template.empty()) chat_template = load_chat_template(opts.chat_template);
  const auto vocab = static_cast<uint64_t>(tok.vocab_size());
  const std::vector<std::string> files = expand_inputs(opts.inputs);
  const std::vector<InputUnit> units = plan_units(files, static_cast<uint64_t>(opts.part_bytes));
  if (units.empty()) {
    throw UserError(fmt::format("data prepare: {} hold no text", fmt::join(opts.inputs, ", ")));
  }
  const std::string& prefix = opts.output_prefix;
  if (ranks.rank() == 0) start_job(prefix, job_text(opts, files, tok.fingerprint(),
                                                   chat_template ? chat_template->text : ""));
  ranks.barrier();

  const int threads = encoding_threads(opts);
  const auto me = static_cast<size_t>(ranks.rank()), n = static_cast<size_t>(ranks.size());
  uint64_t my_bytes = 0;
  for (size_t u = me; u < units.size(); u += n) my_bytes += units[u].end - units[u].begin;
  Progress progress(ranks.rank() == 0 ? opts.progress_every_s : 0, my_bytes, ranks.size());
  UnitStats done;
  uint64_t tokens = 0, reused = 0, reused_bytes = 0;  // reused_bytes: in done.bytes, for progress
  std::vector<EncodedDocument> encoded;
  for (size_t u = me; u < units.size(); u += n) {
    const std::string part = part_prefix(prefix, u);
    if (part_complete(part, vocab, tok.fingerprint(), opts.kind)) {
      ++reused;
      reused_bytes += units[u].end - units[u].begin;
      done.bytes += units[u].end - units[u].begin;
      continue;
    }
    IndexedDatasetWriter writer(part, vocab, tok.fingerprint(), opts.kind);
    for_each_unit_batch(units[u], {opts.kind, opts.json_key, chat_template ? &*chat_template : nullptr},
                        opts.bad_documents, kBatchBytes,
                        [&](std::vector<InputDocument>& docs) {
                          encode_all(tok, docs, opts.kind, threads, encoded);
                          for (const EncodedDocument& doc : encoded) {
                            tokens += doc.tokens.size();
                            if (opts.kind == DocumentKind::text) writer.add_document(doc.tokens);
                            else writer.add_example(doc.tokens, doc.loss_start);
                          }
                          progress.update(done, tokens);
                        },
                        done);
    writer.finish();
  }

  if (done.skipped > 0) {  // each rank names the first it skipped: rank 0 may have none
    fmt::print("prepare: rank {} skipped {} bad documents; the first: {}\n", ranks.rank(),
               done.skipped, done.first_skipped);
  }
  PrepareResult r;
  const auto sum = [&](double v) { return static_cast<uint64_t>(ranks.all_reduce_scalar(v, ReduceOp::sum)); };
  r.reused_parts = sum(static_cast<double>(reused));
  r.skipped_documents = sum(static_cast<double>(done.skipped));
  r.input_bytes = sum(static_cast<double>(done.bytes - reused_bytes));  // encoded now only
  if (ranks.rank() == 0) {
    std::vector<DatasetPart> parts;
    for (size_t u = 0; u < units.size(); ++u) {
      const std::string part = part_prefix(prefix, u);
      const DatasetHeader h = read_jumbo_header(part);
      parts.push_back({fs::path(part).filename().string(), h.num_docs, h.num_tokens});
      r.header.num_docs += h.num_docs;
      r.header.num_tokens += h.num_tokens;
      r.header.dtype = h.dtype;
      r.header.kind = h.kind;
    }
    if (r.header.num_docs == 0) {
      throw UserError(fmt::format("data prepare: {} hold no documents{}", fmt::join(opts.inputs, ", "),
                                  r.skipped_documents ? " that are not bad" : ""));
    }
    write_parts_index(prefix, parts, vocab, tok.fingerprint());
  }
  // Every rank returns with the dataset complete, and its counts.
  r.header.num_docs = sum(static_cast<double>(r.header.num_docs));
  r.header.num_tokens = sum(static_cast<double>(r.header.num_tokens));
  r.header.dtype = vocab <= 65536 ? TokenDType::u16 : TokenDType::u32;
  r.header.vocab_size = vocab;
  r.header.kind = opts.kind;
  r.header.tokenizer_fingerprint = tok.fingerprint();
  r.parts = units.size();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace jumbo
