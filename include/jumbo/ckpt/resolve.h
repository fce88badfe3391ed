#pragma once
// Finding a checkpoint: a step directory (it holds manifest.json) or a root whose `latest`
// names the newest one, on a file system or S3. For the offline tools (`jumbo ckpt ...`),
// resharding, eval, generate and serve. See docs/checkpoint-format.md.
#include <memory>
#include <string>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/ckpt/storage.h"

namespace jumbo {

struct ResolvedCheckpoint {
  std::unique_ptr<Storage> storage;  // rooted at the parent of the step directory
  std::string dir;                   // the step directory's name: "step_00001200"
  Manifest manifest;
};

// `path` is one checkpoint directory (it holds manifest.json) or a checkpoint root (its
// `latest` file names the newest step directory); a local path or "s3://bucket/prefix/...".
// Throws UserError (one line) when it is neither.
ResolvedCheckpoint resolve_checkpoint(const std::string& path, const S3Options& s3);

}  // namespace jumbo
