#pragma once
// `jumbo data prepare`: encode documents into an indexed dataset, EOS after each document.
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/data/indexed_dataset.h"

namespace jumbo {

struct PrepareOptions {
  std::vector<std::string> inputs;  // .jsonl: one document per line under json_key; else a
                                    // text file is one document
  std::string json_key = "text";
  std::string tokenizer;            // SentencePiece .model
  std::string output_prefix;        // writes PREFIX.bin and PREFIX.idx
};

DatasetHeader prepare_dataset(const PrepareOptions& opts);

// Reads the documents of one input file (shared by tokenizer training and prepare).
// Throws UserError naming the file and line on unreadable input or bad JSON.
std::vector<std::string> read_documents(const std::string& path, const std::string& json_key);

}  // namespace jumbo
