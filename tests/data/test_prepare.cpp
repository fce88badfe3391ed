// `jumbo data prepare` on one rank: cutting the input into parts changes no token and no
// document offset; a rerun keeps complete parts and finishes an interrupted one; bad input is
// one line naming FILE:LINE, even deep in a later part; empty inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data_test_support.h"
#include "jumbo/config/config.h"
#include "jumbo/data/indexed_dataset.h"
#include "jumbo/data/prepare.h"
#include "jumbo/data/tokenizer.h"

namespace fs = std::filesystem;

namespace jumbo {
namespace {

using test::TempDir;
using test::user_error_of;

void expect_mentions(const std::string& msg, std::initializer_list<std::string> parts) {
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
}

// Every paragraph of the Brown validation documents as its own document, one JSON line each:
// ~1,500 short documents, so a 4 KiB part holds several and many cross a nominal boundary.
std::vector<std::string> brown_paragraphs() {
  std::vector<std::string> out;
  for (const std::string& doc : read_documents(test::brown_valid(), "text")) {
    size_t begin = 0;
    while (begin <= doc.size()) {
      const size_t end = std::min(doc.find('\n', begin), doc.size());
      if (end > begin) out.push_back(doc.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  return out;
}

std::string json_line(const std::string& text) { return nlohmann::json{{"text", text}}.dump(); }

// Writes the documents as .jsonl, one a line.
void write_jsonl(const std::string& path, const std::vector<std::string>& docs) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& d : docs) out << json_line(d) << "\n";
  ASSERT_TRUE(out.good()) << path;
}

// The same, with raw line `bad` as line `line` (1-based) of the file.
void write_jsonl_with(const std::string& path, const std::vector<std::string>& docs, size_t line,
                      const std::string& bad) {
  std::ofstream out(path, std::ios::binary);
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i + 1 == line) out << bad << "\n";
    out << json_line(docs[i]) << "\n";
  }
  ASSERT_TRUE(out.good()) << path;
}

size_t count_lines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

PrepareOptions options(const std::vector<std::string>& inputs, const std::string& prefix,
                       int64_t part_bytes) {
  PrepareOptions o;
  o.inputs = inputs;
  o.tokenizer = test::small_tokenizer();
  o.output_prefix = prefix;
  o.part_bytes = part_bytes;
  o.threads = 2;
  o.progress_every_s = 0;
  return o;
}

struct Stream {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> doc_offsets;  // num_docs + 1
  size_t segments = 0;
};

Stream read_stream(const std::string& prefix) {
  const IndexedDataset data(prefix);
  Stream s;
  s.tokens.resize(data.num_tokens());
  data.read(0, data.num_tokens(), s.tokens.data());
  for (uint64_t d = 0; d <= data.num_docs(); ++d) s.doc_offsets.push_back(data.doc_offset(d));
  s.segments = data.num_segments();
  return s;
}

// Name -> bytes of every file in a directory.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) out[e.path().filename().string()] = test::read_bytes(e.path().string());
  }
  return out;
}

TEST(Prepare, SmallPartsGiveTheSameStreamAsOnePart) {
  TempDir tmp;
  const std::string paragraphs = tmp.file("paragraphs.jsonl");
  write_jsonl(paragraphs, brown_paragraphs());
  const std::vector<std::string> inputs = {test::brown_valid(), paragraphs};
  const size_t lines = count_lines(test::brown_valid()) + count_lines(paragraphs);

  fs::create_directories(tmp.file("big"));
  fs::create_directories(tmp.file("small"));
  const PrepareResult one = prepare_dataset(options(inputs, tmp.file("big/d"), int64_t{1} << 30));
  EXPECT_EQ(one.parts, 2u);  // one a file
  PrepareOptions small = options(inputs, tmp.file("small/d"), 4096);
  small.threads = 3;
  const PrepareResult many = prepare_dataset(small);
  const uint64_t input_bytes = fs::file_size(test::brown_valid()) + fs::file_size(paragraphs);
  EXPECT_EQ(many.parts, (fs::file_size(test::brown_valid()) + 4095) / 4096 +
                            (fs::file_size(paragraphs) + 4095) / 4096);
  EXPECT_EQ(many.reused_parts, 0u);
  EXPECT_EQ(many.input_bytes, input_bytes);
  EXPECT_EQ(many.header.num_docs, lines);
  EXPECT_EQ(many.header.num_tokens, one.header.num_tokens);

  const Stream a = read_stream(tmp.file("big/d")), b = read_stream(tmp.file("small/d"));
  EXPECT_EQ(a.segments, 2u);
  EXPECT_EQ(b.segments, many.parts);
  EXPECT_GT(b.segments, 100u);
  ASSERT_EQ(a.doc_offsets.size(), lines + 1) << "a document lost or duplicated";
  EXPECT_EQ(b.doc_offsets, a.doc_offsets);
  EXPECT_TRUE(b.tokens == a.tokens) << "token streams differ";

  // And the stream is each document's encoding then EOS, in input order.
  const Tokenizer tok(test::small_tokenizer());
  std::vector<std::string> docs = read_documents(test::brown_valid(), "text");
  for (auto& d : read_documents(paragraphs, "text")) docs.push_back(std::move(d));
  ASSERT_EQ(docs.size(), lines);
  for (size_t d = 0; d < docs.size(); d += 97) {
    auto expected = tok.encode(docs[d]);
    expected.push_back(tok.eos_id());
    const std::vector<int32_t> got(b.tokens.begin() + b.doc_offsets[d],
                                   b.tokens.begin() + b.doc_offsets[d + 1]);
    EXPECT_EQ(got, expected) << "document " << d;
  }
}

TEST(Prepare, PartsEndAtLineBoundariesWhateverTheirSize) {
  // Lines whose starts fall at, just before and just after nominal boundaries: part sizes
  // around the line length.
  TempDir tmp;
  std::vector<std::string> docs;
  for (int i = 0; i < 200; ++i) docs.push_back(std::string(10 + i % 37, 'a' + i % 26) + " end");
  write_jsonl(tmp.file("in.jsonl"), docs);
  const Stream whole = read_stream([&] {
    prepare_dataset(options({tmp.file("in.jsonl")}, tmp.file("whole"), int64_t{1} << 30));
    return tmp.file("whole");
  }());
  ASSERT_EQ(whole.doc_offsets.size(), docs.size() + 1);
  for (int64_t part : {1024, 1025, 1031, 1100, 2047, 2048}) {
    const std::string prefix = tmp.file("p" + std::to_string(part));
    prepare_dataset(options({tmp.file("in.jsonl")}, prefix, part));
    const Stream s = read_stream(prefix);
    EXPECT_EQ(s.doc_offsets, whole.doc_offsets) << "part_bytes " << part;
    EXPECT_TRUE(s.tokens == whole.tokens) << "part_bytes " << part;
  }
}

TEST(Prepare, RerunOfTheSameJobKeepsEveryPart) {
  TempDir tmp;
  const auto opts = options({test::brown_valid()}, tmp.file("d"), 16384);
  const PrepareResult first = prepare_dataset(opts);
  ASSERT_GT(first.parts, 3u);
  const auto files = files_of(tmp.path());
  std::map<std::string, fs::file_time_type> mtimes;
  for (const auto& [name, _] : files) mtimes[name] = fs::last_write_time(tmp.file(name));

  const PrepareResult again = prepare_dataset(opts);
  EXPECT_EQ(again.parts, first.parts);
  EXPECT_EQ(again.reused_parts, first.parts);
  EXPECT_EQ(again.input_bytes, 0u) << "nothing encoded again";
  EXPECT_EQ(again.header.num_docs, first.header.num_docs);
  EXPECT_EQ(again.header.num_tokens, first.header.num_tokens);
  EXPECT_EQ(files_of(tmp.path()), files);
  for (const auto& [name, t] : mtimes) {
    if (name.find(".part-") != std::string::npos) {
      EXPECT_EQ(fs::last_write_time(tmp.file(name)), t) << name << " was rewritten";
    }
  }
}

TEST(Prepare, InterruptedRunSaysSoAndARerunFinishesIt) {
  TempDir tmp;
  const auto opts = options({test::brown_valid()}, tmp.file("d"), 16384);
  const PrepareResult first = prepare_dataset(opts);
  ASSERT_GT(first.parts, 3u);
  const Stream clean = read_stream(tmp.file("d"));
  const auto files = files_of(tmp.path());

  // As if killed: no index, and one part not finished (its .bin there, its .idx not).
  fs::remove(tmp.file("d.parts"));
  fs::remove(part_prefix(tmp.file("d"), 2) + ".idx");
  const std::string msg = user_error_of([&] { IndexedDataset data(tmp.file("d")); });
  expect_mentions(msg, {tmp.file("d"), "did not finish", "rerun"});

  const PrepareResult rerun = prepare_dataset(opts);
  EXPECT_EQ(rerun.parts, first.parts);
  EXPECT_EQ(rerun.reused_parts, first.parts - 1);
  EXPECT_GT(rerun.input_bytes, 0u);
  EXPECT_LT(rerun.input_bytes, fs::file_size(test::brown_valid()));
  const Stream after = read_stream(tmp.file("d"));
  EXPECT_EQ(after.doc_offsets, clean.doc_offsets);
  EXPECT_TRUE(after.tokens == clean.tokens);
  EXPECT_EQ(files_of(tmp.path()), files);
}

TEST(Prepare, ChangedJobEncodesEverythingAgain) {
  TempDir tmp;
  const std::vector<std::string> paras = brown_paragraphs();
  const std::string in = tmp.file("in.jsonl");
  write_jsonl(in, std::vector<std::string>(paras.begin(), paras.begin() + 400));
  fs::create_directories(tmp.file("out"));
  auto opts = options({in}, tmp.file("out/d"), 8192);
  const PrepareResult first = prepare_dataset(opts);
  ASSERT_GT(first.parts, 3u);

  // Different content (other paragraphs): nothing kept, and the dataset is the new text's.
  write_jsonl(in, std::vector<std::string>(paras.begin() + 400, paras.begin() + 700));
  const PrepareResult changed = prepare_dataset(opts);
  EXPECT_EQ(changed.reused_parts, 0u);
  EXPECT_EQ(changed.header.num_docs, 300u);
  EXPECT_EQ(read_stream(tmp.file("out/d")).doc_offsets.size(), 301u);

  // Another part size: nothing kept, and no part of the old cut is left behind.
  opts.part_bytes = int64_t{1} << 20;
  const PrepareResult resized = prepare_dataset(opts);
  EXPECT_EQ(resized.parts, 1u);
  EXPECT_EQ(resized.reused_parts, 0u);
  for (const auto& [name, _] : files_of(tmp.file("out"))) {
    EXPECT_EQ(name.find(".part-000001"), std::string::npos) << "stale part " << name;
  }
  EXPECT_EQ(read_stream(tmp.file("out/d")).segments, 1u);
}

// A bad line as line `line` of a file of short documents, cut into 4 KiB parts.
struct BadLine {
  const char* what;
  std::string line;
  std::string reason;  // in the message
};

TEST(Prepare, BadLinesNameFileAndLineEvenInALaterPart) {
  const std::vector<std::string> paras = brown_paragraphs();
  const std::vector<std::string> docs(paras.begin(), paras.begin() + 600);
  const std::vector<BadLine> cases = {
      {"not JSON", R"({"text": "unterminated)", "not valid JSON"},
      {"not an object", R"(["text", "a"])", "a JSON array"},
      {"no such key", R"({"body": "a"})", "no such key"},
      {"not a string", R"({"text": 42})", "the value is a number"},
      {"invalid UTF-8", "{\"text\": \"caf\xc3\x28 au lait\"}", "invalid UTF-8"},
      {"overlong UTF-8", "{\"text\": \"\xc0\xaf\"}", "invalid UTF-8"},
  };
  for (const size_t line : {size_t{1}, size_t{457}}) {
    for (const BadLine& c : cases) {
      TempDir tmp;
      const std::string first = tmp.file("first.jsonl"), in = tmp.file("in.jsonl");
      test::write_brown_subset(first, 2);  // a good file before
      write_jsonl_with(in, docs, line, c.line);
      const std::string msg =
          user_error_of([&] { prepare_dataset(options({first, in}, tmp.file("d"), 4096)); });
      expect_mentions(msg, {in + ":" + std::to_string(line) + ": ", c.reason});
      EXPECT_FALSE(fs::exists(tmp.file("d.parts"))) << c.what;
    }
  }
}

TEST(Prepare, InvalidUtf8InATextFileNamesItsLine) {
  TempDir tmp;
  std::string text;
  for (int i = 1; i < 40; ++i) text += "line " + std::to_string(i) + " is fine\n";
  text += "line 40 is \xff not\n";
  for (int i = 41; i < 50; ++i) text += "line " + std::to_string(i) + "\n";
  test::write_bytes(tmp.file("doc.txt"), text);
  const std::string msg =
      user_error_of([&] { prepare_dataset(options({tmp.file("doc.txt")}, tmp.file("d"), 1024)); });
  expect_mentions(msg, {tmp.file("doc.txt") + ":40: ", "invalid UTF-8"});

  // A good text file is one document whatever the part size.
  test::write_bytes(tmp.file("good.txt"), "one\ntwo\n\nthree\n");
  const PrepareResult r = prepare_dataset(options({tmp.file("good.txt")}, tmp.file("g"), 1024));
  EXPECT_EQ(r.parts, 1u);
  EXPECT_EQ(r.header.num_docs, 1u);
  const Tokenizer tok(test::small_tokenizer());
  auto expected = tok.encode("one\ntwo\n\nthree\n");
  expected.push_back(tok.eos_id());
  EXPECT_EQ(read_stream(tmp.file("g")).tokens, expected);
}

TEST(Prepare, BadInputsAndOptionsAreOneLine) {
  TempDir tmp;
  expect_mentions(user_error_of([&] {
                    prepare_dataset(options({tmp.file("nothing-*.jsonl")}, tmp.file("d"), 4096));
                  }),
                  {tmp.file("nothing-*.jsonl"), "matches no file"});
  expect_mentions(user_error_of([&] {
                    prepare_dataset(options({test::brown_valid(), tmp.file("missing.jsonl")},
                                            tmp.file("d"), 4096));
                  }),
                  {tmp.file("missing.jsonl"), "no such input file"});
  expect_mentions(user_error_of([&] {
                    prepare_dataset(options({test::brown_valid()}, tmp.file("d"), 1000));
                  }),
                  {"part-bytes", "1000", "1024"});
  expect_mentions(user_error_of([&] {
                    auto o = options({test::brown_valid()}, tmp.file("d"), 4096);
                    o.threads = -1;
                    prepare_dataset(o);
                  }),
                  {"--threads", "-1"});
  EXPECT_FALSE(fs::exists(tmp.file("d.parts")));
}

TEST(Prepare, SkippedBadLinesAreCountedAndTheRestKept) {
  TempDir tmp;
  const std::vector<std::string> paras = brown_paragraphs();
  const std::vector<std::string> docs(paras.begin(), paras.begin() + 500);
  write_jsonl(tmp.file("good.jsonl"), docs);
  {
    std::ofstream out(tmp.file("mixed.jsonl"), std::ios::binary);
    for (size_t i = 0; i < docs.size(); ++i) {
      if (i == 3) out << "not json\n";
      if (i == 250) out << R"({"body": "no text"})" << "\n";
      if (i == 499) out << "{\"text\": \"\xfe\"}\n";
      out << json_line(docs[i]) << "\n";
    }
  }
  auto opts = options({tmp.file("mixed.jsonl")}, tmp.file("skip"), 4096);
  opts.bad_documents = BadDocuments::skip;
  const PrepareResult r = prepare_dataset(opts);
  EXPECT_EQ(r.skipped_documents, 3u);
  EXPECT_EQ(r.header.num_docs, docs.size());
  prepare_dataset(options({tmp.file("good.jsonl")}, tmp.file("good"), 4096));
  const Stream skipped = read_stream(tmp.file("skip")), good = read_stream(tmp.file("good"));
  EXPECT_EQ(skipped.doc_offsets, good.doc_offsets);
  EXPECT_TRUE(skipped.tokens == good.tokens);
}

TEST(Prepare, EmptyInputsAmongOthersAreFineAllEmptyIsAnError) {
  TempDir tmp;
  test::write_bytes(tmp.file("empty.jsonl"), "");
  test::write_bytes(tmp.file("blank.jsonl"), "\n  \n\n");
  const PrepareResult r = prepare_dataset(options(
      {tmp.file("empty.jsonl"), test::brown_valid(), tmp.file("blank.jsonl"), tmp.file("empty.jsonl")},
      tmp.file("d"), 4096));
  EXPECT_EQ(r.header.num_docs, count_lines(test::brown_valid()));
  prepare_dataset(options({test::brown_valid()}, tmp.file("alone"), 4096));
  const Stream with_empty = read_stream(tmp.file("d")), alone = read_stream(tmp.file("alone"));
  EXPECT_EQ(with_empty.doc_offsets, alone.doc_offsets);
  EXPECT_TRUE(with_empty.tokens == alone.tokens);

  test::write_bytes(tmp.file("empty2.jsonl"), "");
  expect_mentions(user_error_of([&] {
                    prepare_dataset(options({tmp.file("empty.jsonl"), tmp.file("empty2.jsonl")},
                                            tmp.file("e"), 4096));
                  }),
                  {tmp.file("empty.jsonl"), "no text"});
  expect_mentions(user_error_of([&] {
                    prepare_dataset(options({tmp.file("blank.jsonl")}, tmp.file("b"), 4096));
                  }),
                  {tmp.file("blank.jsonl"), "no documents"});
  EXPECT_FALSE(fs::exists(tmp.file("e.parts")));
  EXPECT_FALSE(fs::exists(tmp.file("b.parts")));
}

TEST(Prepare, GlobPatternsExpandSortedPerPattern) {
  TempDir tmp;
  fs::create_directories(tmp.file("in"));
  const std::vector<std::string> paras = brown_paragraphs();
  write_jsonl(tmp.file("in/b.jsonl"), {paras[0], paras[1]});
  write_jsonl(tmp.file("in/a.jsonl"), {paras[2]});
  write_jsonl(tmp.file("in/c.jsonl"), {paras[3], paras[4], paras[5]});
  EXPECT_EQ(expand_inputs({tmp.file("in/*.jsonl")}),
            (std::vector<std::string>{tmp.file("in/a.jsonl"), tmp.file("in/b.jsonl"),
                                      tmp.file("in/c.jsonl")}));
  const PrepareResult r =
      prepare_dataset(options({tmp.file("in/*.jsonl")}, tmp.file("d"), int64_t{1} << 20));
  EXPECT_EQ(r.parts, 3u);
  EXPECT_EQ(r.header.num_docs, 6u);
  const Tokenizer tok(test::small_tokenizer());
  const Stream s = read_stream(tmp.file("d"));
  auto first = tok.encode(paras[2]);  // a.jsonl first
  first.push_back(tok.eos_id());
  EXPECT_EQ(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + s.doc_offsets[1]), first);
}

}  // namespace
}  // namespace jumbo

namespace jumbo {
namespace {

// An example is tokenized as its prompt + completion text would be where the seam is a piece
// boundary: the completion without a word-start mark of its own (" press" is "▁press", not
// "▁" then "press"), so training sees the tokens eval scores after "Genre:". The loss starts
// at the completion.
TEST(Prepare, PromptCompletionExamplesAreTheirTextsTokensSplitAtTheSeam) {
  test::TempDir tmp;
  const Tokenizer tok(test::small_tokenizer());
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"The jury said\nGenre:", " reportage"}, {"It rained.", " The streets were wet."},
      {"Count: one, two,", " three"}};
  {
    std::ofstream out(tmp.file("examples.jsonl"));
    for (const auto& [prompt, completion] : pairs) {
      out << nlohmann::json{{"prompt", prompt}, {"completion", completion}}.dump() << "\n";
    }
  }
  PrepareOptions o;
  o.inputs = {tmp.file("examples.jsonl")};
  o.tokenizer = test::small_tokenizer();
  o.output_prefix = tmp.file("examples");
  o.kind = DocumentKind::prompt_completion;
  o.progress_every_s = 0;
  prepare_dataset(o);
  const IndexedDataset data(tmp.file("examples"));
  ASSERT_EQ(data.num_docs(), pairs.size());
  for (uint64_t d = 0; d < data.num_docs(); ++d) {
    const auto& [prompt, completion] = pairs[d];
    std::vector<int32_t> stored(data.doc_offset(d + 1) - data.doc_offset(d));
    data.read(data.doc_offset(d), stored.size(), stored.data());
    const std::vector<int32_t> own = tok.encode(prompt);
    EXPECT_EQ(data.doc_loss_start(d), own.size());
    EXPECT_EQ(stored.back(), tok.eos_id());
    stored.pop_back();
    EXPECT_EQ(tok.decode(stored), prompt + completion) << "example " << d;
    const std::vector<int32_t> tail(stored.begin() + static_cast<std::ptrdiff_t>(own.size()), stored.end());
    EXPECT_NE(tok.piece(tail.front()), "\xE2\x96\x81") << "example " << d << ": a lone word-start mark";
  }
  // The first example's seam is a piece boundary of the whole text: the same tokens.
  std::vector<int32_t> first(data.doc_offset(1) - 1);
  data.read(0, first.size(), first.data());
  EXPECT_EQ(first, tok.encode(pairs[0].first + pairs[0].second));
}

// The messages form: a conversation through a chat template is the prompt-completion example
// of its texts (the prompt every message but the last renders with the generation prompt; the
// completion the last assistant reply as the template writes it after that), token for token.
TEST(Prepare, MessagesLinesAreThePromptCompletionExamplesTheTemplateRenders) {
  test::TempDir tmp;
  const std::string tmpl = JUMBO_SOURCE_DIR "/inputs/chat/jumbo-chat.toml";
  const nlohmann::json conversations = nlohmann::json::array(
      {nlohmann::json::array({{{"role", "user"}, {"content", "Name the genre."}},
                              {{"role", "assistant"}, {"content", "reportage"}}}),
       nlohmann::json::array({{{"role", "system"}, {"content", "Be brief."}},
                              {{"role", "user"}, {"content", "Hi"}},
                              {{"role", "assistant"}, {"content", "Hello."}},
                              {{"role", "user"}, {"content", "More?"}},
                              {{"role", "developer"}, {"content", "Still brief."}},
                              {{"role", "assistant"}, {"content", "No."}}})});
  {
    std::ofstream chat(tmp.file("chat.jsonl")), pc(tmp.file("pc.jsonl"));
    const std::vector<std::pair<std::string, std::string>> texts = {
        {"<|user|>\nName the genre.\n<|assistant|>\n", "reportage<|end|>\n"},
        {"<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello.<|end|>\n<|user|>\nMore?\n"
         "<|system|>\nStill brief.\n<|assistant|>\n",
         "No.<|end|>\n"}};
    for (size_t k = 0; k < texts.size(); ++k) {
      chat << nlohmann::json{{"messages", conversations[k]}}.dump() << "\n";
      pc << nlohmann::json{{"prompt", texts[k].first}, {"completion", texts[k].second}}.dump() << "\n";
    }
  }
  auto prepare = [&](const std::string& in, const std::string& out, const std::string& chat_template) {
    PrepareOptions o;
    o.inputs = {tmp.file(in)};
    o.tokenizer = test::small_tokenizer();
    o.output_prefix = tmp.file(out);
    o.kind = DocumentKind::prompt_completion;
    o.chat_template = chat_template;
    o.progress_every_s = 0;
    prepare_dataset(o);
  };
  prepare("chat.jsonl", "chat", tmpl);
  prepare("pc.jsonl", "pc", "");
  test::expect_same_examples(tmp.file("chat"), tmp.file("pc"), 2);
  // Without a template, and a conversation that does not end with a reply: one line each.
  expect_mentions(user_error_of([&] { prepare("chat.jsonl", "none", ""); }),
                  {"chat.jsonl:1", "needs a chat template (--chat-template FILE)"});
  {
    std::ofstream bad(tmp.file("bad.jsonl"));
    bad << R"({"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]})" << "\n";
  }
  expect_mentions(user_error_of([&] { prepare("bad.jsonl", "bad", tmpl); }),
                  {"bad.jsonl:1", "ending with an assistant's reply"});
  {
    std::ofstream bad(tmp.file("role.jsonl"));
    bad << R"({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]})" << "\n";
  }
  expect_mentions(user_error_of([&] { prepare("role.jsonl", "role", tmpl); }),
                  {"role.jsonl:1", "messages[0].role"});
}

}  // namespace
}  // namespace jumbo
