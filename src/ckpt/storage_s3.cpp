// Checkpoint storage under an S3 prefix. A PUT, or a completed multipart upload, makes an
// object appear whole, which gives Storage's atomic write for free.
#include <fmt/format.h>

#include <algorithm>

#include "jumbo/ckpt/s3_client.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

class S3Storage final : public Storage {
 public:
  S3Storage(std::string bucket, std::string prefix, const S3Options& opts)
      : client_(std::move(bucket), opts), prefix_(std::move(prefix)) {}

  std::string url(const std::string& key) const override { return client_.s3_url(join(key)); }

  void write(const std::string& key, const void* data, size_t size) override {
    client_.put_object(join(key), data, size);
  }

  std::optional<std::vector<char>> read(const std::string& key) override {
    return client_.get_object(join(key));
  }

  std::vector<std::string> list_dirs(const std::string& prefix) override {
    const std::string dir = dir_prefix(prefix);
    std::vector<std::string> out;
    for (const auto& p : client_.list_prefixes(dir)) {
      // "dir/child/" -> "child"
      if (p.size() > dir.size() + 1 && p.compare(0, dir.size(), dir) == 0) {
        out.push_back(p.substr(dir.size(), p.size() - dir.size() - 1));
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void remove_all(const std::string& prefix) override {
    client_.delete_prefix(dir_prefix(prefix));
  }

 private:
  std::string join(const std::string& key) const {
    if (prefix_.empty()) return key;
    return key.empty() ? prefix_ : prefix_ + "/" + key;
  }
  // The listing prefix of a "directory": "" for the bucket's root, else "a/b/".
  std::string dir_prefix(const std::string& key) const {
    std::string p = join(key);
    while (!p.empty() && p.back() == '/') p.pop_back();
    return p.empty() ? p : p + "/";
  }

  S3Client client_;
  std::string prefix_;  // no leading or trailing '/'
};

}  // namespace

std::unique_ptr<Storage> open_s3_storage(const std::string& url, const S3Options& s3) {
  if (!is_s3_url(url)) {
    throw UserError(fmt::format("{}: expected an S3 URL s3://BUCKET[/PREFIX]", url));
  }
  const std::string rest = url.substr(5);
  const size_t slash = rest.find('/');
  const std::string bucket = rest.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  while (!prefix.empty() && prefix.front() == '/') prefix.erase(0, 1);
  if (bucket.empty()) {
    throw UserError(fmt::format("{}: no bucket name; expected s3://BUCKET[/PREFIX]", url));
  }
  // Anything else would change the URL's meaning (or its host, with virtual-hosted names).
  const bool valid = std::all_of(bucket.begin(), bucket.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '-' || c == '_';
  });
  if (!valid) {
    throw UserError(fmt::format("{}: bucket name '{}' may hold only letters, digits, '.', '-' "
                                "and '_'; expected s3://BUCKET[/PREFIX]", url, bucket));
  }
  return std::make_unique<S3Storage>(bucket, std::move(prefix), s3);
}

}  // namespace jumbo
