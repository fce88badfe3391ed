#pragma once
// The input side of `jumbo data prepare`: input files cut into units (a unit becomes one part)
// at line boundaries, and the documents of a unit read in batches. Private to src/data.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "jumbo/data/bad_documents.h"
#include "jumbo/data/chat_template.h"
#include "jumbo/data/indexed_dataset.h"

namespace jumbo {

// Bytes [begin, end) of a file, nominally: a .jsonl unit holds the lines whose first byte lies
// in that range, so units of the same file never share or lose a line.
struct InputUnit {
  std::string path;
  uint64_t begin = 0, end = 0;
  bool jsonl = true;  // false: the whole file is one document
};

// Whether an input is JSON lines (one document per line) rather than one text document.
bool is_jsonl(const std::string& path);

// The document of one .jsonl line (the string under json_key) into doc, or why the line is
// not one ("" on success): invalid UTF-8, not JSON, not an object, no string key. The one rule
// for JSON lines, shared by preparation and the tokenizer's sampler.
std::string document_of_json_line(std::string_view line, const std::string& json_key,
                                  std::string& doc);

// The example of one .jsonl line of prompt-completion data: {"prompt": str, "completion": str}
// (both strings, the completion not empty), or why the line is not one.
// With a chat template, a line may instead be {"messages": [{"role", "content"}, ...]}, made
// an example by ChatTemplate::training_example.
std::string example_of_json_line(std::string_view line, std::string& prompt,
                                 std::string& completion, const ChatTemplate* chat_template);

// What a unit's lines are read as: documents under a key, or prompt-completion examples.
struct DocumentFields {
  DocumentKind kind = DocumentKind::text;
  std::string json_key = "text";
  const ChatTemplate* chat_template = nullptr;  // prompt-completion: reads `messages` lines
};

// One input document: its text (a prompt-completion example's prompt) and the completion.
struct InputDocument {
  std::string text, completion;
};

// Every file cut into units of part_bytes (.jsonl) or one unit (other files; none for an empty
// .jsonl), in input order then byte order.
std::vector<InputUnit> plan_units(const std::vector<std::string>& files, uint64_t part_bytes);

struct UnitStats {
  uint64_t documents = 0, bytes = 0, skipped = 0;
  std::string first_skipped;  // "FILE:LINE: reason" of the first skipped document
};

// Calls `batch` with consecutive groups of the unit's documents of about batch_bytes of text.
// A bad document throws UserError naming the file and line, or with BadDocuments::skip is
// counted in stats and left out.
void for_each_unit_batch(const InputUnit& unit, const DocumentFields& fields, BadDocuments bad,
                         size_t batch_bytes,
                         const std::function<void(std::vector<InputDocument>&)>& batch,
                         UnitStats& stats);

}  // namespace jumbo
