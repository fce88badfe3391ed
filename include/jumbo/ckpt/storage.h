#pragma once
// Where checkpoints live: a directory on a (shared) file system, or an S3 prefix. Keys are
// '/'-separated paths relative to the root (e.g. "step_00000010/manifest.json").
// Every write is atomic: a reader sees no object or all of it, never a part (files: a
// temporary name, fsync, rename; S3: a PUT or a completed multipart upload).
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace jumbo {

// S3 settings from the run config; empty fields fall back to the standard AWS variables
// (AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL).
struct S3Options {
  std::string region;             // checkpoint.s3_region
  std::string endpoint;           // checkpoint.s3_endpoint: "http://127.0.0.1:4568"; path-style
  int64_t multipart_threshold = 64 << 20;  // bytes; larger objects go up in parts
  int64_t part_size = 64 << 20;            // bytes per part (S3: >= 5 MiB but the last)
  int max_attempts = 5;                    // per request, on 5xx, timeouts, connection errors
};

class Storage {
 public:
  virtual ~Storage() = default;
  // The full location of a key, for messages ("/fsx/ckpt/step_00000010/manifest.json",
  // "s3://bucket/prefix/step_00000010/manifest.json"). Never contains credentials.
  virtual std::string url(const std::string& key) const = 0;
  // Writes the whole object atomically, replacing any object of that key.
  virtual void write(const std::string& key, const void* data, size_t size) = 0;
  // The whole object, or nullopt when it does not exist. Other failures throw UserError.
  virtual std::optional<std::vector<char>> read(const std::string& key) = 0;
  // Names of the immediate children "directories" of prefix ("" = the root), sorted.
  virtual std::vector<std::string> list_dirs(const std::string& prefix) = 0;
  // Removes every object under prefix + "/" (and the directory itself on a file system).
  virtual void remove_all(const std::string& prefix) = 0;
  // The file of `key` when the storage is a local file system (tools that stream a large
  // file read it in place); nullopt for S3.
  virtual std::optional<std::string> local_path(const std::string& key) const {
    (void)key;
    return std::nullopt;
  }
};

bool is_s3_url(const std::string& root);
// The key of `name` inside the directory `dir` ("step_00000010" + "manifest.json").
inline std::string join_dir(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

// A path or URL naming one directory under a storage root: the root that holds it (`parent`,
// empty when the path is itself a root: a bucket, "/") and its `name`. Local paths are made
// absolute (`path`); `missing` is set when a local path is not a directory (opening file
// storage there would create it, so callers refuse it first).
struct StoragePath {
  std::string parent, name, path;
  bool missing = false;
};
StoragePath split_storage_path(const std::string& path);
// A directory (created if missing) or "s3://bucket/prefix".
std::unique_ptr<Storage> open_storage(const std::string& root, const S3Options& s3);
std::unique_ptr<Storage> open_file_storage(const std::string& dir);
std::unique_ptr<Storage> open_s3_storage(const std::string& url, const S3Options& s3);

}  // namespace jumbo
