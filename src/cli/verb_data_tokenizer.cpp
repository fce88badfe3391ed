// `jumbo data tokenizer` (train a SentencePiece tokenizer on a bounded sample of the inputs),
// `jumbo data inspect-tokenizer` (what a trained vocabulary holds) and `jumbo data tokenize`
// (each document's token ids, to check a tokenizer against another implementation).
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/cloze.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

std::string mib(int64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

double peak_rss_gib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / (1 << 20);  // ru_maxrss is in KiB on Linux
}

// Control characters (a tab in a piece) shown as escapes, so each piece stays on its line.
std::string printable(const std::string& piece) {
  std::string out;
  for (unsigned char c : piece) {
    if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

void add_train(CLI::App& data, VerbRunner& run) {
  auto topts = std::make_shared<TokenizerTrainOptions>();
  CLI::App* tok = data.add_subcommand(
      "tokenizer",
      "train a SentencePiece tokenizer on a uniform sample of the inputs' sentences (non-empty "
      "lines of documents): every input is read once and the sentences with the smallest keys "
      "hash(seed, input index, line, paragraph) that fit --sample-bytes are kept");
  tok->add_option("-i,--input", topts->inputs, ".jsonl (key \"text\") or text files")->required();
  tok->add_option("-o,--output", topts->model_prefix, "writes PREFIX.model and PREFIX.vocab")
      ->required();
  tok->add_option("--vocab-size", topts->vocab_size, "number of pieces (J1: 256000)")
      ->capture_default_str();
  tok->add_option("--model-type", topts->model_type, "unigram, bpe, char or word")
      ->capture_default_str();
  tok->add_option("--sample-bytes", topts->sample_bytes,
                  "bytes of text sampled for training, e.g. 256M or 1G (binary units); the "
                  "trainer needs ~25-30 bytes of memory per sampled byte")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  tok->add_option("--input-sentence-size", topts->input_sentence_size,
                  "at most this many sentences in the sample; 0 = no limit")
      ->capture_default_str();
  tok->add_option("--max-piece-length", topts->max_piece_length,
                  "longest piece in characters, 1 .. 64 (J1's pieces span several words)")
      ->capture_default_str();
  tok->add_option("--seed-pieces", topts->seed_pieces,
                  "unigram candidate pieces before pruning (at least --vocab-size)")
      ->capture_default_str();
  tok->add_flag("--split-by-whitespace", topts->split_by_whitespace,
                "no multi-word pieces (default: pieces may span words, as J1's vocabulary)");
  tok->add_option("--threads", topts->threads, "trainer threads, 0 = all cores")
      ->capture_default_str();
  tok->add_option("--seed", topts->seed, "the sample and the trainer's generator")
      ->capture_default_str();
  tok->add_flag("--verbose", topts->verbose, "SentencePiece's progress log on stderr");
  tok->callback([&run, topts] {
    run = [topts] {
      const auto t0 = std::chrono::steady_clock::now();
      check_tokenizer_options(*topts);  // before reading inputs
      SentenceSample sample = sample_training_sentences(*topts);
      const SampleStats s = sample.stats;
      std::string skipped;
      if (s.lines_not_parsed > 0) {
        skipped = fmt::format(", {} of {} JSON lines not parsed (no paragraph could enter)",
                              s.lines_not_parsed, s.lines_read);
      }
      std::string too_long;
      if (s.too_long > 0) {
        too_long =
            fmt::format(", {} sentences over {} bytes left out", s.too_long, kMaxSentenceBytes);
      }
      fmt::print("sampled {} sentences ({}) of {} read from {} file{} in {:.1f} s{}{}\n",
                 s.sampled_sentences, mib(s.sampled_bytes), mib(s.bytes_read), s.files,
                 s.files == 1 ? "" : "s", s.seconds, skipped, too_long);
      std::fflush(stdout);
      const double train_s = train_tokenizer_on(std::move(sample), *topts);
      const double total_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const Tokenizer t(topts->model_prefix + ".model");
      fmt::print(
          "wrote {}.model: {} pieces in {:.1f} s (sampling {:.1f} s, training {:.1f} s), "
          "peak RSS {:.2f} GiB\n",
          topts->model_prefix, t.vocab_size(), total_s, s.seconds, train_s, peak_rss_gib());
      return 0;
    };
  });
}

void add_inspect(CLI::App& data, VerbRunner& run) {
  struct Args {
    std::string model, sample, task;
    int top = 10;
  };
  auto a = std::make_shared<Args>();
  CLI::App* ins = data.add_subcommand(
      "inspect-tokenizer",
      "vocabulary size, multi-word pieces (a piece with \"▁\" after its first character spans "
      "a word boundary: \"▁of▁the\", \"s▁of\"), the longest pieces, and with --sample the "
      "tokens per word (whitespace-separated) and bytes per token of a text, and with --task "
      "how often a multiple-choice task's pairs encoded whole put a piece across the "
      "context/continuation seam");
  ins->add_option("model", a->model, "SentencePiece .model or tokenizer.json")->required();
  ins->add_option("--sample", a->sample, ".jsonl (key \"text\") or text file to encode");
  ins->add_option("--task", a->task,
                  "multiple-choice JSONL (jumbo eval --task): count the pairs whose whole "
                  "encoding merges the continuation into the context's last piece or changes "
                  "the context's tokens");
  ins->add_option("--top", a->top, "how many of the longest pieces to show")->capture_default_str();
  ins->callback([&run, a] {
    run = [a] {
      const TokenizerInspection r = inspect_tokenizer(a->model, a->sample, a->top);
      fmt::print("model: {}\n", a->model);
      fmt::print("vocabulary: {} pieces ({} learned, {} byte, {} control/unknown)\n", r.vocab_size,
                 r.learned, r.byte_pieces, r.vocab_size - r.learned - r.byte_pieces);
      fmt::print("multi-word pieces: {} of {} learned ({:.2f}%; \"▁\" after the first character)\n",
                 r.multi_word, r.learned,
                 r.learned > 0
                     ? 100.0 * static_cast<double>(r.multi_word) / static_cast<double>(r.learned)
                     : 0.0);
      fmt::print("longest pieces (characters, piece):\n");
      for (const auto& p : r.longest) fmt::print("  {:3d}  {}\n", p.chars, printable(p.piece));
      if (!r.sample.empty()) {
        const auto per = [](int64_t a, int64_t b) {
          return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
        };
        fmt::print("sample {}: {} documents, {} words, {} tokens, {} bytes\n", r.sample,
                   r.sample_documents, r.sample_words, r.sample_tokens, r.sample_bytes);
        fmt::print("tokens/word: {:.3f}\nbytes/token: {:.3f}\n",
                   per(r.sample_tokens, r.sample_words), per(r.sample_bytes, r.sample_tokens));
      }
      if (!a->task.empty()) {
        const Tokenizer tokenizer(a->model);
        fmt::print("task {}: {}\n", a->task,
                   describe_seams(count_seams(tokenizer, read_cloze_task(a->task))));
      }
      return 0;
    };
  });
}

void add_tokenize(CLI::App& data, VerbRunner& run) {
  struct Args {
    std::string tokenizer, input, key = "text";
    bool decode = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = data.add_subcommand(
      "tokenize",
      "print each document's token ids as a JSON line {\"ids\": [...]}, as `data prepare` "
      "encodes it but without the EOS after it (no BOS or other special token is added)");
  cmd->add_option("-t,--tokenizer", a->tokenizer, "SentencePiece .model or tokenizer.json")
      ->required();
  cmd->add_option("-i,--input", a->input, ".jsonl (one document a line) or a text file (one "
                                          "document)")
      ->required();
  cmd->add_option("--json-key", a->key, "document key in .jsonl")->capture_default_str();
  cmd->add_flag("--decode", a->decode,
                "also print \"text\": the ids decoded (equal to the document for valid UTF-8)");
  cmd->callback([&run, a] {
    run = [a] {
      const Tokenizer tok(a->tokenizer);
      std::string line;
      for_each_input_document(a->input, a->key, [&](const std::string& doc, int64_t) {
        const std::vector<int32_t> ids = tok.encode(doc);
        nlohmann::json out{{"ids", ids}};
        if (a->decode) out["text"] = tok.decode(ids);
        line = out.dump();
        line += '\n';
        std::fwrite(line.data(), 1, line.size(), stdout);
      });
      std::fflush(stdout);
      return 0;
    };
  });
}

}  // namespace

void add_tokenizer_verbs(CLI::App& data, VerbRunner& run) {
  add_train(data, run);
  add_inspect(data, run);
  add_tokenize(data, run);
}

}  // namespace jumbo::cli
