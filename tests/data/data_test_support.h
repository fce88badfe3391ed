#pragma once
// Shared helpers for the data tests: temp directories, the shipped Brown corpus, and a small
// tokenizer trained on it (cached in the build directory, so the test processes that ctest
// starts one per test train it once).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace jumbo::test {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

std::string source_path(const std::string& relative);  // under the repo root
std::string brown_valid();                              // inputs/data/brown-valid.jsonl

// Writes the first `count` documents of brown-valid.jsonl to `path` as .jsonl.
void write_brown_subset(const std::string& path, int count);

// Path of a unigram tokenizer (vocab 500, split_by_whitespace=false) trained on the first five
// validation documents; trained on first use, then reused from the build directory.
std::string small_tokenizer();

// Expects fn to throw jumbo::UserError and returns its message ("" and a test failure if not).
std::string user_error_of(const std::function<void()>& fn);

// Expects two prepared datasets (PREFIX of IndexedDataset) to hold `docs` documents each with
// the same tokens and the same loss start: a conversation rendered by a chat template and the
// prompt-completion line it should equal.
void expect_same_examples(const std::string& a_prefix, const std::string& b_prefix, uint64_t docs);

void write_bytes(const std::string& path, const std::string& bytes);
std::string read_bytes(const std::string& path);

}  // namespace jumbo::test
