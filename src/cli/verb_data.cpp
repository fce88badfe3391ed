#include <fmt/format.h>

#include <chrono>
#include <string>
#include <vector>

#include "jumbo/data/prepare.h"
#include "jumbo/data/tokenizer.h"
#include "verbs.h"

namespace jumbo::cli {

void add_data_verb(CLI::App& app, VerbRunner& run) {
  CLI::App* data = app.add_subcommand("data", "tokenizer training and dataset preparation");
  data->require_subcommand(1);

  auto topts = std::make_shared<TokenizerTrainOptions>();
  CLI::App* tok = data->add_subcommand("tokenizer", "train a SentencePiece tokenizer");
  tok->add_option("-i,--input", topts->inputs, ".jsonl (key \"text\") or text files")
      ->required();
  tok->add_option("-o,--output", topts->model_prefix, "writes PREFIX.model and PREFIX.vocab")
      ->required();
  tok->add_option("--vocab-size", topts->vocab_size, "number of pieces")->capture_default_str();
  tok->add_option("--model-type", topts->model_type, "unigram or bpe")->capture_default_str();
  tok->add_option("--input-sentence-size", topts->input_sentence_size,
                  "sentences sampled for training")
      ->capture_default_str();
  tok->add_flag("--split-by-whitespace", topts->split_by_whitespace,
                "no multi-word pieces (default: pieces may span words, as J1's vocabulary)");
  tok->add_option("--threads", topts->threads, "0 = all cores")->capture_default_str();
  tok->add_option("--seed", topts->seed)->capture_default_str();
  tok->callback([&run, topts] {
    run = [topts] {
      const auto t0 = std::chrono::steady_clock::now();
      train_tokenizer(*topts);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const Tokenizer t(topts->model_prefix + ".model");
      fmt::print("wrote {}.model: {} pieces in {:.1f} s\n", topts->model_prefix, t.vocab_size(),
                 s);
      return 0;
    };
  });

  auto popts = std::make_shared<PrepareOptions>();
  CLI::App* prep = data->add_subcommand("prepare", "encode documents into PREFIX.bin/.idx");
  prep->add_option("-i,--input", popts->inputs, ".jsonl or text files")->required();
  prep->add_option("-t,--tokenizer", popts->tokenizer, "SentencePiece .model")->required();
  prep->add_option("-o,--output", popts->output_prefix, "writes PREFIX.bin and PREFIX.idx")
      ->required();
  prep->add_option("--json-key", popts->json_key, "document key in .jsonl")->capture_default_str();
  prep->callback([&run, popts] {
    run = [popts] {
      const auto t0 = std::chrono::steady_clock::now();
      const DatasetHeader h = prepare_dataset(*popts);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print("wrote {}.bin/.idx: {} documents, {} tokens ({}) in {:.1f} s\n",
                 popts->output_prefix, h.num_docs, h.num_tokens,
                 h.dtype == TokenDType::u16 ? "uint16" : "uint32", s);
      return 0;
    };
  });
}

}  // namespace jumbo::cli
