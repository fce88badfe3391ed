#pragma once
// Finding a checkpoint: a step directory (it holds manifest.json) or a root whose `latest`
// names the newest one, on a file system or S3. For the offline tools (`jumbo ckpt ...`),
// resharding, eval, generate and serve. See docs/checkpoint-format.md.
#include <memory>
#include <string>

#include "jumbo/ckpt/manifest.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/comm/comm.h"

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

// Collective: world rank 0 resolves `path` and reads its manifest; the other ranks receive
// both in one broadcast, so no other rank reads the manifest. Throws UserError (on every
// rank) when it is not a checkpoint. For fine-tuning's initial weights and inference.
ResolvedCheckpoint open_checkpoint(const std::string& path, const S3Options& s3, Comm& world);

}  // namespace jumbo
