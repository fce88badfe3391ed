// Finding a checkpoint directory from a path or URL (ckpt/resolve.h).
#include "jumbo/ckpt/resolve.h"

#include <fmt/format.h>

#include <optional>
#include <vector>

#include "jumbo/comm/agreed_error.h"
#include "jumbo/config/config.h"

namespace jumbo {

ResolvedCheckpoint resolve_checkpoint(const std::string& path, const S3Options& s3) {
  const StoragePath where = split_storage_path(path);
  // Opening file storage creates its directory: look before, so a typo creates nothing.
  if (where.missing) throw UserError(fmt::format("{}: no such checkpoint directory", path));
  const std::string& p = where.path;
  const std::string& parent = where.parent;  // empty: PATH can only be a root (a bucket, "/")
  const std::string& base = where.name;
  ResolvedCheckpoint out;
  std::optional<std::vector<char>> text;
  if (!parent.empty() && !base.empty()) {
    out.storage = open_storage(parent, s3);
    out.dir = base;
    text = out.storage->read(join_dir(base, "manifest.json"));
  }
  if (!text) {
    // Not a checkpoint directory: a root whose `latest` names the newest one?
    std::unique_ptr<Storage> root = open_storage(p, s3);
    const std::optional<std::vector<char>> latest = root->read("latest");
    if (!latest) {
      throw UserError(fmt::format("{}: neither a checkpoint directory (no manifest.json) nor a "
                                  "checkpoint root (no `latest` file)", path));
    }
    std::string name(latest->begin(), latest->end());
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (name.empty() || name.find('/') != std::string::npos) {
      throw UserError(fmt::format("{}: does not name a step directory", root->url("latest")));
    }
    text = root->read(join_dir(name, "manifest.json"));
    if (!text) {
      throw UserError(fmt::format("{} names {}, but {} does not exist", root->url("latest"), name,
                                  root->url(join_dir(name, "manifest.json"))));
    }
    out.storage = std::move(root);
    out.dir = name;
  }
  out.manifest = parse_manifest(std::string(text->begin(), text->end()),
                                out.storage->url(join_dir(out.dir, "manifest.json")));
  return out;
}

ResolvedCheckpoint open_checkpoint(const std::string& path, const S3Options& s3, Comm& world) {
  // Rank 0's answer: "ok\n<step directory url>\n<manifest>" or "error\n<message>".
  std::string message;
  ResolvedCheckpoint out;
  if (world.rank() == 0) {
    try {
      out = resolve_checkpoint(path, s3);
      message = "ok\n" + out.storage->url(out.dir) + "\n" + manifest_to_json(out.manifest);
    } catch (const UserError& e) {
      message = std::string("error\n") + e.what();
    }
  }
  std::vector<char> bytes(message.begin(), message.end());
  world.broadcast_bytes(bytes, 0);
  const std::string text(bytes.begin(), bytes.end());
  const size_t first = text.find('\n');
  if (text.compare(0, first, "ok") != 0) {  // rank 0's verdict: every rank fails here, it says why
    throw AgreedError(text.substr(first + 1), world.rank() != 0);
  }
  if (world.rank() == 0) return out;
  const size_t second = text.find('\n', first + 1);
  const std::string dir_url = text.substr(first + 1, second - first - 1);
  const StoragePath where = split_storage_path(dir_url);
  out.storage = open_storage(where.parent, s3);
  out.dir = where.name;
  out.manifest = parse_manifest(text.substr(second + 1), dir_url + "/manifest.json");
  return out;
}

}  // namespace jumbo
