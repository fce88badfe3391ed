// Where a checkpoint path points: a local directory or an S3 prefix. The one place that tells
// them apart, so neither storage knows the other (storage_file.cpp, storage_s3.cpp).
#include <filesystem>

#include "jumbo/ckpt/storage.h"

namespace jumbo {

namespace fs = std::filesystem;

bool is_s3_url(const std::string& root) { return root.rfind("s3://", 0) == 0; }

StoragePath split_storage_path(const std::string& path) {
  StoragePath out;
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (is_s3_url(p)) {
    const size_t slash = p.rfind('/');
    if (slash > 5) {  // past "s3://bucket"
      out.parent = p.substr(0, slash);
      out.name = p.substr(slash + 1);
    }
    out.path = p;
    return out;
  }
  std::error_code ec;
  out.missing = !fs::is_directory(p, ec);
  fs::path abs = fs::absolute(p).lexically_normal();
  if (abs.filename().empty() && abs != abs.root_path()) abs = abs.parent_path();  // "x/."
  if (abs.has_parent_path() && abs != abs.root_path()) {
    out.parent = abs.parent_path().string();
    out.name = abs.filename().string();
  }
  out.path = abs.string();
  return out;
}

std::unique_ptr<Storage> open_storage(const std::string& root, const S3Options& s3) {
  if (is_s3_url(root)) return open_s3_storage(root, s3);
  return open_file_storage(root);
}

}  // namespace jumbo
