#pragma once
// `jumbo data prepare`: encode documents into a dataset of parts, EOS after each document,
// over any number of ranks. The input is cut into parts of about part_bytes at line boundaries
// (a file that is not .jsonl is one document and one part); part k is written by rank
// k mod ranks, so 1 and N ranks write the same files. PREFIX.parts, written last, lists them.
// Format: docs/data-format.md.
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/data/bad_documents.h"
#include "jumbo/data/indexed_dataset.h"

namespace jumbo {

class Comm;

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or glob patterns ('corpus/*.jsonl'); .jsonl: one
                                    // document per line under json_key; else one per file
  std::string json_key = "text";
  // --format: text documents under json_key, or prompt-completion examples
  // ({"prompt": ..., "completion": ...} per line; the loss counts the completion and EOS).
  DocumentKind kind = DocumentKind::text;
  // prompt-completion: a chat template TOML, which makes {"messages": [...]} lines examples
  // (ChatTemplate::training_example); "" = such lines are refused.
  std::string chat_template;
  std::string tokenizer;            // SentencePiece .model
  std::string output_prefix;        // writes PREFIX.parts and PREFIX.part-NNNNNN.bin/.idx
  int64_t part_bytes = int64_t{256} << 20;  // input bytes per part
  int threads = 0;                  // encoding threads per rank; 0 = cores / ranks on the node
  BadDocuments bad_documents = BadDocuments::fail;
  double progress_every_s = 10;     // rank 0's progress lines; 0 = none
};

struct PrepareResult {
  DatasetHeader header;
  uint64_t parts = 0;
  uint64_t reused_parts = 0;        // complete from an interrupted run of the same job
  uint64_t input_bytes = 0;         // of the parts encoded now
  uint64_t skipped_documents = 0;   // bad documents skipped (BadDocuments::skip)
  double seconds = 0;
};

// Every rank of `ranks` calls it; each returns when the dataset is complete. Throws UserError
// naming the file and line on bad input, the option on a bad option.
PrepareResult prepare_dataset(const PrepareOptions& opts, Comm& ranks);
// The same on this process alone.
PrepareResult prepare_dataset(const PrepareOptions& opts);

// Input patterns as files, each pattern's matches sorted; throws UserError naming a pattern
// that matches nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

// Reads all documents of one input file. Throws UserError naming the file and line on
// unreadable input or bad JSON.
std::vector<std::string> read_documents(const std::string& path, const std::string& json_key);

}  // namespace jumbo
