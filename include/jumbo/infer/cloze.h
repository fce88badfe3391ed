#pragma once
// Multiple-choice scoring in the manner of lm-evaluation-harness's loglikelihood requests:
// each item is a context and candidate continuations; a continuation's score is the sum of
// the log-probabilities of its tokens after the context. The predicted answer is the best
// score (acc) or the best score per byte of the continuation (acc_norm).
#include <cstdint>
#include <optional>
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

// Where a pair's tokens are cut into context and scored continuation (`jumbo eval --scoring`).
//   whole     lm-evaluation-harness's: EOS + context + continuation encoded whole, cut after
//             as many tokens as EOS + context alone encodes to. A multi-word piece may span
//             the seam, so the scored tokens may hold characters of the context, or miss the
//             continuation's first ones, and the context's tokens may not be its own.
//   boundary  the context's own tokens (EOS + context encoded alone), then the continuation's
//             own (encoded alone, after a piece boundary: no word-start mark of its own), so
//             the scored tokens are exactly the continuation's characters. The seam may be one
//             the model rarely saw: a whole encoding might have put a piece across it.
enum class ClozeScoring { whole, boundary };
std::optional<ClozeScoring> parse_cloze_scoring(const std::string& name);
const char* to_string(ClozeScoring s);
inline constexpr const char* kClozeScoringNames = "whole or boundary";

// One pair's tokens under a rule: the context's (EOS first, never empty) and the scored
// continuation's (at least one when the continuation is not empty).
struct PairTokens {
  std::vector<int32_t> context, continuation;
};
PairTokens split_pair(const Tokenizer& tokenizer, const std::string& context,
                      const std::string& continuation, ClozeScoring scoring);


// What the whole rule's cut does at the seam between context and continuation, over every
// pair (the first tokens of the whole encoding, as many as the context alone encodes to):
//   merged      they decode to the context and more: the context's last piece holds the
//               continuation's first characters, which go unscored.
//   changed     not merged, but they are not the context's own tokens: a piece spans the
//               seam and the context's end is cut into other pieces.
//   cut_inside  of `changed`, those that end inside the context: its last characters are
//               scored with the continuation. (changed - cut_inside: the same characters as
//               other pieces, the continuation's tokens exactly its own characters.)
struct SeamCounts {
  int64_t pairs = 0, merged = 0, changed = 0, cut_inside = 0;
};
SeamCounts count_seams(const Tokenizer& tokenizer, const std::vector<ClozeItem>& items);
// "1600 pairs, 14 merge the continuation into the context's last piece, 22 more change the
// context's tokens (22 of them cut inside the context); whole rule"
std::string describe_seams(const SeamCounts& c);

struct ContinuationScore {
  std::vector<int32_t> context_tokens;  // what it was scored after
  std::vector<int32_t> tokens;
  // The characters the scored tokens stand for after context_tokens: the continuation under
  // the boundary rule; under the whole rule it may differ where a piece spans the seam.
  std::string text;
  double loglikelihood = 0;
  int64_t bytes = 0;
};
struct ItemScore {
  // EOS, then the context: under the whole rule the first tokens of
  // encode_prompt(context + continuation), as many as the context alone encodes to (the
  // first continuation's split); under the boundary rule encode_prompt(context).
  std::vector<int32_t> context_tokens;
  std::vector<ContinuationScore> continuations;
  int64_t answer = 0, predicted = 0, predicted_norm = 0;
};
struct ClozeResult {
  std::vector<ItemScore> items;  // on world rank 0
  double accuracy = 0, accuracy_norm = 0;
  int64_t truncated = 0;  // pairs longer than the window, their context cut from the left
  ClozeScoring scoring = ClozeScoring::whole;
  SeamCounts seams;  // of the whole rule, whichever rule scored
};

// Collective. `tokenizer` is used on world rank 0 only (may be null elsewhere).
ClozeResult evaluate_cloze(Evaluator& ev, const Tokenizer* tokenizer,
                           const std::vector<ClozeItem>& items,
                           ClozeScoring scoring = ClozeScoring::whole);

}  // namespace jumbo
