#pragma once
// Where a run stands: the last step done, the position in the data order and the tokens
// trained on. One value, which a checkpoint saves and a resume or a rewind restores (with the
// anomaly guard's own state, saved beside it).
#include <cstdint>

#include "jumbo/ckpt/manifest.h"

namespace jumbo {

struct RunProgress {
  int64_t step = 0;              // the last step done (0: none)
  int64_t consumed_samples = 0;  // the position in the data order, skipped samples included
  int64_t consumed_tokens = 0;   // tokens trained on: what the schedules follow

  static RunProgress saved_in(const CheckpointProgress& p) {
    return {.step = p.step, .consumed_samples = p.consumed_samples,
            .consumed_tokens = p.consumed_tokens};
  }
  void save_into(CheckpointProgress& p) const {
    p.step = step;
    p.consumed_samples = consumed_samples;
    p.consumed_tokens = consumed_tokens;
  }
};

}  // namespace jumbo
