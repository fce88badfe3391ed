#include <fmt/format.h>

#include <chrono>
#include <string>
#include <vector>

#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/data/prepare.h"
#include "flags.h"
#include "verbs.h"

namespace jumbo::cli {

void add_data_verb(CLI::App& app, VerbRunner& run) {
  CLI::App* data = app.add_subcommand("data", "tokenizers (train, inspect, tokenize), chat templates "
                                                "(render-chat) and dataset preparation");
  data->require_subcommand(1);

  add_tokenizer_verbs(*data, run);
  add_chat_template_verbs(*data, run);

  auto popts = std::make_shared<PrepareOptions>();
  auto part_mb = std::make_shared<int64_t>(256);
  auto skip_bad = std::make_shared<bool>(false);
  CLI::App* prep = data->add_subcommand(
      "prepare", "encode documents into a dataset of parts (PREFIX.parts); runs on any number "
                 "of ranks (mpirun / srun), which share the work");
  prep->add_option("-i,--input", popts->inputs,
                   ".jsonl or text files, or quoted patterns ('corpus/*.jsonl')")
      ->required();
  prep->add_option("-t,--tokenizer", popts->tokenizer,
                   "SentencePiece .model or Hugging Face tokenizer.json (byte-level BPE)")
      ->required();
  prep->add_option("-o,--output", popts->output_prefix,
                   "writes PREFIX.parts and PREFIX.part-NNNNNN.bin/.idx")
      ->required();
  prep->add_option("--json-key", popts->json_key, "document key in .jsonl")->capture_default_str();
  prep->add_option_function<std::string>(
          "--format",
          [popts](const std::string& text) {
            if (text == "text") popts->kind = DocumentKind::text;
            else if (text == "prompt-completion") popts->kind = DocumentKind::prompt_completion;
            else throw cli::flag_error("--format", text, "text or prompt-completion");
          },
          "text: documents under --json-key; prompt-completion: {\"prompt\", \"completion\"} "
          "lines, the loss on the completion and EOS only (docs/data-format.md)")
      ->default_str("text");
  prep->add_option("--chat-template", popts->chat_template,
                   "with --format prompt-completion: a chat template (jumbo's TOML, a model's "
                   "tokenizer_config.json or a .jinja file) that makes "
                   "{\"messages\": [...]} lines examples (the last assistant reply is the "
                   "completion; docs/data-format.md)");
  prep->add_option("--part-mb", *part_mb, "MiB of input per part (the unit of work)")
      ->capture_default_str();
  prep->add_option("--threads", popts->threads, "encoding threads per rank; 0 = cores / ranks on "
                   "the node")->capture_default_str();
  prep->add_flag("--skip-bad-documents", *skip_bad, "skip (and count) lines that are not JSON, lack the key "
                 "or are not UTF-8, instead of stopping at the first");
  prep->add_option("--progress-every", popts->progress_every_s, "seconds between progress lines "
                   "(0 = none)")->capture_default_str();
  prep->callback([&run, popts, part_mb, skip_bad] {
    popts->bad_documents = *skip_bad ? BadDocuments::skip : BadDocuments::fail;
    if (*part_mb < 1 || *part_mb > (int64_t{1} << 30)) {
      throw UserError(fmt::format("data prepare: --part-mb {}, expected 1 .. 2^30", *part_mb));
    }
    popts->part_bytes = *part_mb << 20;
    run = [popts] {
      auto world = mpi_world();
      const PrepareResult r = prepare_dataset(*popts, *world);
      if (world->rank() == 0) {
        fmt::print("wrote {}.parts: {} parts ({} kept from an earlier run), {} documents, {} tokens "
                   "({}) from {:.1f} MB in {:.1f} s on {} ranks",
                   popts->output_prefix, r.parts, r.reused_parts, r.header.num_docs,
                   r.header.num_tokens, r.header.dtype == TokenDType::u16 ? "uint16" : "uint32",
                   static_cast<double>(r.input_bytes) / 1e6, r.seconds, world->size());
        if (r.skipped_documents > 0) fmt::print(", {} bad documents skipped", r.skipped_documents);
        fmt::print("\n");
      }
      return 0;
    };
  });
}

}  // namespace jumbo::cli
