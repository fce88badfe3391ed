#pragma once
// Multiple-choice scoring in the manner of lm-evaluation-harness's loglikelihood requests:
// each item is a context and candidate continuations; a continuation's score is the sum of
// the log-probabilities of its tokens after the context. The predicted answer is the best
// score (acc) or the best score per byte of the continuation (acc_norm).
#include <cstdint>
#include <string>
#include <vector>

#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/evaluate.h"

namespace jumbo {

// One line of a task file: {"context": str, "continuations": [str, ...], "answer": int}.
struct ClozeItem {
  std::string context;
  std::vector<std::string> continuations;
  int64_t answer = 0;
};
// Throws UserError naming FILE:LINE and the field.
std::vector<ClozeItem> read_cloze_task(const std::string& path);

struct ContinuationScore {
  std::vector<int32_t> context_tokens;  // what it was scored after
  std::vector<int32_t> tokens;
  double loglikelihood = 0;
  int64_t bytes = 0;
};
struct ItemScore {
  // EOS, then the context: the first tokens of encode_prompt(context + continuation), as
  // many as the context alone encodes to (the first continuation's split).
  std::vector<int32_t> context_tokens;
  std::vector<ContinuationScore> continuations;
  int64_t answer = 0, predicted = 0, predicted_norm = 0;
};
struct ClozeResult {
  std::vector<ItemScore> items;  // on world rank 0
  double accuracy = 0, accuracy_norm = 0;
  int64_t truncated = 0;  // pairs longer than the window, their context cut from the left
};

// Collective. `tokenizer` is used on world rank 0 only (may be null elsewhere).
ClozeResult evaluate_cloze(Evaluator& ev, const Tokenizer* tokenizer,
                           const std::vector<ClozeItem>& items);

}  // namespace jumbo
