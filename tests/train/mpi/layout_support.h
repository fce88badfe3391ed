#pragma once
// Shared by the layout and checkpoint tests under mpirun: a tiny model on a small real
// dataset, its one-rank reference run, and a weight comparison across layouts.
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/train/trainer.h"

namespace jumbo::test {

// The block the layout tests train: GPT's, or Llama's (RMSNorm, RoPE, SwiGLU, 8 query heads
// sharing 4 key/value heads, untied head, no biases) at the same small shape.
enum class Family { gpt, llama };

// Rank 0 makes the tokenizer and datasets in the build tree; the others wait (collective).
const std::string& data_dir();
RunConfig layout_config(int tp, int pp, bool zero1, const std::string& precision,
                        const std::string& recompute = "none", bool sequence_parallel = false,
                        Family family = Family::gpt);

struct RefRun {
  std::vector<double> losses;
  std::vector<float> reference_weights;  // the one-rank run's flat master
};
// The run of `cfg` (a one-rank layout) on rank 0 alone; its results broadcast to every rank.
RefRun solo_run(const RunConfig& cfg);
RefRun reference(const std::string& precision, Family family = Family::gpt);
// A fresh, empty checkpoint directory under the build tree (collective).
std::string fresh_checkpoint_dir(const std::string& name);
// Compares every element this rank holds with the same global element of the reference.
void expect_same_weights(Trainer& t, const std::vector<float>& ref_flat, double tol,
                         Family family = Family::gpt);

}  // namespace jumbo::test
