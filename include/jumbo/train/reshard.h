#pragma once
// Offline re-sharding: a checkpoint saved with one layout written out for another, as if the
// target job had saved it (same step, progress and manifest format). Conversion is optional -
// a run loads any layout directly - but it lets a job start without reading shards meant for
// another layout, and moves checkpoints between stores (file system <-> S3).
#include <cstdint>
#include <string>

#include "jumbo/ckpt/storage.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/layout.h"

namespace jumbo {

struct ReshardStats {
  int64_t files = 0;  // written by this process
  int64_t bytes = 0;
};

// Collective over `world` (one process or an mpirun job): the target ranks' shard files are
// dealt round-robin to the processes, each reading only the source files it overlaps. The
// manifest is written last by process 0, then `latest`. `src` is a checkpoint directory or
// root; `dst_root` a directory or s3:// prefix that receives step_N/. `layout` is the target
// (tp, pp, dp, ZeRO-1, virtual stages, bucket size), checked against the checkpoint's model
// with the run config's rules (its mistakes named as the --tp ... flags).
ReshardStats reshard_checkpoint(const std::string& src, const std::string& dst_root,
                                const Layout& layout, Comm& world, const S3Options& s3);

}  // namespace jumbo
