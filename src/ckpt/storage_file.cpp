// Checkpoint storage on a (shared) file system: temporary name, fsync, rename, fsync of the
// directory, so a crash at any moment leaves either the old object or the whole new one.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "jumbo/ckpt/storage.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;

void fsync_path(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

class FileStorage final : public Storage {
 public:
  explicit FileStorage(std::string dir) : root_(std::move(dir)) {
    std::error_code ec;
    fs::create_directories(root_, ec);
    if (ec || !fs::is_directory(root_)) {
      throw UserError(fmt::format("checkpoint.dir = {}: cannot create the directory ({})",
                                  root_.string(), ec ? ec.message() : "not a directory"));
    }
  }

  std::optional<std::string> local_path(const std::string& key) const override {
    return (root_ / key).string();
  }
  std::string url(const std::string& key) const override {
    return key.empty() ? root_.string() : (root_ / key).string();
  }

  void write(const std::string& key, const void* data, size_t size) override {
    const fs::path target = root_ / key;
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    const fs::path tmp = target.string() + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("create", tmp);
    const char* p = static_cast<const char*>(data);
    size_t left = size;
    while (left > 0) {
      const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        errno = err;
        fail("write", tmp);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0) {
      ::close(fd);
      fail("fsync", tmp);
    }
    ::close(fd);
    if (::rename(tmp.c_str(), target.c_str()) != 0) fail("rename", target);
    fsync_path(target.parent_path(), O_RDONLY | O_DIRECTORY);
  }

  std::optional<std::vector<char>> read(const std::string& key) override {
    const fs::path path = root_ / key;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return std::nullopt;
      fail("open", path);
    }
    std::vector<char> out;
    char buf[1 << 16];
    const off_t end = ::lseek(fd, 0, SEEK_END);
    ::lseek(fd, 0, SEEK_SET);
    if (end > 0) out.reserve(static_cast<size_t>(end));
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        errno = err;
        fail("read", path);
      }
      if (n == 0) break;
      out.insert(out.end(), buf, buf + n);
    }
    ::close(fd);
    return out;
  }

  std::vector<std::string> list_dirs(const std::string& prefix) override {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_ / prefix, ec)) {
      if (e.is_directory()) out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void remove_all(const std::string& prefix) override {
    std::error_code ec;
    fs::remove_all(root_ / prefix, ec);
    if (ec) {
      throw UserError(fmt::format("{}: cannot remove ({})", url(prefix), ec.message()));
    }
  }

 private:
  [[noreturn]] void fail(const char* what, const fs::path& p) const {
    throw UserError(fmt::format("{}: cannot {} ({})", p.string(), what, std::strerror(errno)));
  }
  fs::path root_;
};

}  // namespace

std::unique_ptr<Storage> open_file_storage(const std::string& dir) {
  return std::make_unique<FileStorage>(dir);
}

}  // namespace jumbo
