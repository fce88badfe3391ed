#pragma once
// The stream part of a backend (ggml's backend, CUDA's stream): the queue a rank's device work
// runs on, in order. Kernels are queued on it; the host waits for it only where a contract
// returns a host value. Communicators that queue work of their own order it against this
// stream: NcclComm takes a Stream and requires the CUDA one (its events wait on it).
#include "jumbo/backend/tensor.h"

namespace jumbo {

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  // Returns when everything queued so far has run (nothing to wait for on the CPU, where every
  // call completes before it returns).
  virtual void synchronize() = 0;
};

}  // namespace jumbo
