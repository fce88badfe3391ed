#include "data_test_support.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>

#include "jumbo/config/config.h"
#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/tokenizer.h"

namespace fs = std::filesystem;

namespace jumbo::test {

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path_ = fs::temp_directory_path() /
          ("jumbo-data-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string source_path(const std::string& relative) {
  return (fs::path(JUMBO_SOURCE_DIR) / relative).string();
}

std::string brown_valid() { return source_path("inputs/data/brown-valid.jsonl"); }

void write_brown_subset(const std::string& path, int count) {
  std::ifstream in(brown_valid());
  std::ofstream out(path);
  std::string line;
  for (int i = 0; i < count && std::getline(in, line); ++i) out << line << "\n";
  ASSERT_TRUE(out.good()) << path;
}

std::string small_tokenizer() {
  TempDir tmp;
  const std::string subset = tmp.file("subset.jsonl");
  write_brown_subset(subset, 5);
  // Keyed by the training text, so a regenerated corpus retrains instead of reusing.
  uint64_t key = 0xcbf29ce484222325ull;
  for (unsigned char c : read_bytes(subset)) key = (key ^ c) * 0x100000001b3ull;
  const fs::path cache = fs::path(JUMBO_BINARY_DIR) / "test-data";
  const fs::path model = cache / fmt::format("brown-valid5-unigram500-{:016x}.model", key);
  if (fs::exists(model)) return model.string();
  fs::create_directories(cache);
  TokenizerTrainOptions opts;
  opts.inputs = {subset};
  opts.model_prefix = tmp.file("tok");
  opts.vocab_size = 500;
  opts.threads = 2;
  train_tokenizer(opts);
  // Copy next to the cache entry, then rename (atomic): test processes racing here each
  // install a complete, identical model.
  const std::string staged = model.string() + "." + std::to_string(::getpid());
  fs::copy_file(tmp.file("tok.model"), staged, fs::copy_options::overwrite_existing);
  fs::rename(staged, model);
  return model.string();
}

std::string user_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected UserError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected UserError, nothing was thrown";
  return "";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void expect_same_examples(const std::string& a_prefix, const std::string& b_prefix, uint64_t docs) {
  const IndexedDataset a(a_prefix), b(b_prefix);
  ASSERT_EQ(a.num_docs(), docs);
  ASSERT_EQ(b.num_docs(), docs);
  for (uint64_t d = 0; d < docs; ++d) {
    std::vector<int32_t> x(a.doc_offset(d + 1) - a.doc_offset(d)), y(b.doc_offset(d + 1) - b.doc_offset(d));
    a.read(a.doc_offset(d), x.size(), x.data());
    b.read(b.doc_offset(d), y.size(), y.data());
    EXPECT_EQ(x, y) << "conversation " << d;
    EXPECT_EQ(a.doc_loss_start(d), b.doc_loss_start(d)) << "conversation " << d;
  }
}

}  // namespace jumbo::test
