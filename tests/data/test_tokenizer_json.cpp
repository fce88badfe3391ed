// Hugging Face tokenizer.json (byte-level BPE) behind jumbo::Tokenizer, on small files written
// here: the byte alphabet, merges by rank, the pre-tokenizer, added tokens (longest match,
// lstrip/rstrip, single_word), ignore_merges, EOS/BOS, invalid UTF-8 and the refusals. The
// comparison with Hugging Face's own implementation is tests/data/hf_tokenizer.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data_test_support.h"
#include "jumbo/config/config.h"
#include "jumbo/config/hashing.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/data/utf8.h"

namespace jumbo {
namespace {

using nlohmann::json;
using test::TempDir;
using test::user_error_of;

// GPT-2's bytes_to_unicode, written out again here: byte -> its alphabet character (UTF-8).
std::string byte_char(int b) {
  const bool kept = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!kept) {
    cp = 256;
    for (int k = 0; k < b; ++k) {
      if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++cp;
    }
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

const std::string G = byte_char(' ');  // "Ġ"

// A byte-level BPE: ids 0..255 the byte characters in byte order, then these merges' results.
json base_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = vocab.size();
    m.push_back(a + " " + b);
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
            {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", m}}}};
}

json added(int id, const std::string& content, bool lstrip = false, bool rstrip = false,
           bool single_word = false) {
  return {{"id", id}, {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", false}, {"special", true}};
}

std::string write(const TempDir& dir, const json& j, const std::string& name = "tokenizer.json") {
  const std::string path = dir.file(name);
  test::write_bytes(path, j.dump(2));
  return path;
}

int32_t id_of(const Tokenizer& t, const std::string& text) {
  const auto id = t.token_id(text);
  EXPECT_TRUE(id.has_value()) << text;
  return id.value_or(-1);
}

json with_eos(json j, int id = 1000) {
  j["added_tokens"].push_back(added(id, "<|endoftext|>"));
  return j;
}

TEST(TokenizerJson, ByteAlphabetMergesByRankAndRoundTrip) {
  TempDir dir;
  // "b c" outranks "a b": "abc" is a + bc, never ab + c.
  const json j = with_eos(base_tokenizer({{"b", "c"}, {"a", "b"}, {G, "t"}, {"h", "e"},
                                          {G + "t", "he"}}));
  const Tokenizer tok(write(dir, j));
  EXPECT_EQ(tok.kind(), TokenizerKind::hf_byte_level_bpe);
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{'a', id_of(tok, "bc")}));
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{id_of(tok, "ab")}));
  // GPT-2's regex: " the" is one word, merged whole; "the" has no Ġ.
  EXPECT_EQ(tok.encode("the the"),
            (std::vector<int32_t>{'t', id_of(tok, "he"), id_of(tok, G + "the")}));
  // Bytes outside printable Latin-1 are their alphabet characters: space is Ġ (id 32 here).
  EXPECT_EQ(tok.encode("\n"), (std::vector<int32_t>{'\n'}));
  const std::string text = "héllo wörld, 日本語 🙂\n\n  tabs\tand 12345";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  EXPECT_EQ(tok.piece(id_of(tok, G + "the")), G + "the");
  EXPECT_EQ(tok.token_bytes(id_of(tok, G + "the")), " the");
  EXPECT_EQ(tok.token_bytes(0xE6), "\xE6");  // part of a character
  EXPECT_TRUE(tok.is_learned(id_of(tok, G + "the")));
  EXPECT_FALSE(tok.is_learned(1000));
  EXPECT_EQ(tok.vocab_size(), 1001);  // the added token's id, beyond the BPE vocabulary
  EXPECT_EQ(tok.piece(900), "");      // an unused id
  EXPECT_EQ(tok.eos_id(), 1000);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_FALSE(tok.token_id("no such token").has_value());
  // A lone byte decodes to U+FFFD, as tokenizers' lossy decode.
  EXPECT_EQ(tok.decode({0xE6}), "\xEF\xBF\xBD");
  // No word-start mark: a continuation is encoded as it is.
  EXPECT_EQ(encode_after_boundary(tok, " the"), tok.encode(" the"));
  EXPECT_EQ(tok.fingerprint(), fnv1a64(test::read_bytes(dir.file("tokenizer.json"))));
}

TEST(TokenizerJson, SplitRegexThenByteLevelAndMergePairs) {
  TempDir dir;
  json j = with_eos(base_tokenizer({{"1", "2"}, {"12", "3"}}));
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", R"(\p{N}{1,3}| ?\p{L}+|\s+(?!\S)|\s+|[^\s\p{L}\p{N}]+)"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  // The pair form of merges: ["1", "2"].
  j["model"]["merges"] = json::array({json::array({"1", "2"}), json::array({"12", "3"})});
  const Tokenizer tok(write(dir, j));
  // Digits in threes: "1231" is "123" + "1".
  EXPECT_EQ(tok.encode("1231"), (std::vector<int32_t>{id_of(tok, "123"), '1'}));
}

TEST(TokenizerJson, AddedTokensLongestFirstWithStrips) {
  TempDir dir;
  json j = base_tokenizer({});
  j["added_tokens"] = {added(300, "<|a|>"), added(301, "<|a|>x"), added(302, "<S>", true, true),
                       added(303, "<|endoftext|>"), added(304, "word", false, false, true)};
  const Tokenizer tok(write(dir, j));
  // The longest content at a position wins: "<|a|>x" over "<|a|>".
  EXPECT_EQ(tok.encode("<|a|>xy"), (std::vector<int32_t>{301, 'y'}));
  EXPECT_EQ(tok.encode("<|a|>y"), (std::vector<int32_t>{300, 'y'}));
  // lstrip and rstrip take the whitespace around the token; without them it stays text.
  EXPECT_EQ(tok.encode("a  <S>  b"), (std::vector<int32_t>{'a', 302, 'b'}));
  EXPECT_EQ(tok.encode("a <|a|> b"), (std::vector<int32_t>{'a', 32, 300, 32, 'b'}));
  // single_word: only where no word character touches it.
  EXPECT_EQ(tok.encode("a word b"), (std::vector<int32_t>{'a', 32, 304, 32, 'b'}));
  EXPECT_EQ(tok.encode("swords"), (std::vector<int32_t>{'s', 'w', 'o', 'r', 'd', 's'}));
  EXPECT_EQ(tok.piece(302), "<S>");
  EXPECT_EQ(tok.token_bytes(302), "<S>");
  EXPECT_EQ(tok.decode({'a', 302, 'b'}), "a<S>b");
  EXPECT_EQ(tok.eos_id(), 303);  // no tokenizer_config.json: the first of the usual names
}

TEST(TokenizerJson, IgnoreMergesEmitsAWordThatIsAToken) {
  TempDir dir;
  json j = with_eos(base_tokenizer({{"x", "y"}}));
  j["model"]["vocab"][G + "xyz"] = 400;  // no merges reach it
  const std::string plain = write(dir, j);
  EXPECT_EQ(Tokenizer(plain).encode(" xyz"), (std::vector<int32_t>{32, 256, 'z'}));
  j["model"]["ignore_merges"] = true;
  const Tokenizer tok(write(dir, j));
  EXPECT_EQ(tok.encode(" xyz"), (std::vector<int32_t>{400}));
  EXPECT_EQ(tok.encode(" xyzxyz"), (std::vector<int32_t>{32, 256, 'z', 256, 'z'}));
}

TEST(TokenizerJson, InvalidUtf8IsEncodedAsReplacementCharacters) {
  TempDir dir;
  const Tokenizer tok(write(dir, with_eos(base_tokenizer({}))));
  // WHATWG: each maximal invalid subsequence is one U+FFFD ("\xE2\x82" is one, "\xFF" one).
  EXPECT_EQ(tok.encode("a\xE2\x82" "b\xFF"), tok.encode("a\xEF\xBF\xBD" "b\xEF\xBF\xBD"));
  EXPECT_EQ(tok.encode("\xC0\xAF"), tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD"));
  EXPECT_EQ(tok.encode("\xED\xA0\x80"), tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x99"), "\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("ok \xF0\x9F\x99\x82"), "ok \xF0\x9F\x99\x82");
}

TEST(TokenizerJson, EosAndBosFromTokenizerConfig) {
  TempDir dir;
  json j = base_tokenizer({});
  j["added_tokens"] = {added(500, "<|begin_of_text|>"), added(501, "<|end_of_text|>"),
                       added(502, "<|eot_id|>")};
  const std::string path = write(dir, j);
  EXPECT_EQ(Tokenizer(path).eos_id(), 501);
  test::write_bytes(dir.file("tokenizer_config.json"),
                    R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})");
  const Tokenizer tok(path);
  EXPECT_EQ(tok.eos_id(), 502);
  EXPECT_EQ(tok.bos_id(), 500);
  EXPECT_EQ(tok.token_id("<|eot_id|>"), 502);
  EXPECT_TRUE(tok.encode("<|begin_of_text|>hi").front() == 500);  // only when in the text
  EXPECT_EQ(tok.encode("hi"), (std::vector<int32_t>{'h', 'i'}));
  test::write_bytes(dir.file("tokenizer_config.json"), R"({"eos_token": "<nope>"})");
  EXPECT_EQ(user_error_of([&] { Tokenizer{path}; }),
            dir.file("tokenizer_config.json") + ": eos_token = \"<nope>\": not a token of " + path);
}

TEST(TokenizerJson, RefusalsNameFileFieldAndValue) {
  TempDir dir;
  const auto refused = [&](json j) { return user_error_of([&] { Tokenizer{write(dir, j)}; }); };
  json wp = base_tokenizer({});
  wp["model"]["type"] = "WordPiece";
  const std::string path = dir.file("tokenizer.json");
  EXPECT_EQ(refused(wp), path + ": model.type = \"WordPiece\": jumbo reads byte-level BPE "
                                "tokenizer.json files only (not WordPiece, Unigram or WordLevel)");
  json uni = {{"model", {{"type", "Unigram"}, {"vocab", {{"<unk>", 0.0}}}, {"unk_id", 0}}}};
  EXPECT_NE(refused(uni).find(path + ": model.type = \"Unigram\": "), std::string::npos);
  json bad_merge = with_eos(base_tokenizer({}));
  bad_merge["model"]["merges"] = json::array({"q \xE2\x82\xAC"});
  EXPECT_EQ(refused(bad_merge),
            path + ": model.merges[0] = \"q \xE2\x82\xAC\": \"\xE2\x82\xAC\" is not in model.vocab");
  json no_join = with_eos(base_tokenizer({}));
  no_join["model"]["merges"] = json::array({"a b"});
  EXPECT_EQ(refused(no_join),
            path + ": model.merges[0] = \"a b\": their concatenation is not in model.vocab");
  json nfkc = with_eos(base_tokenizer({}));
  nfkc["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(refused(nfkc), path + ": normalizer = {\"type\":\"NFKC\"}: the only normalizer is "
                                  "{\"type\": \"NFC\"} (or null)");
  json fallback = with_eos(base_tokenizer({}));
  fallback["model"]["byte_fallback"] = true;
  EXPECT_EQ(refused(fallback),
            path + ": model.byte_fallback = true: byte fallback is not supported");
  json meta = with_eos(base_tokenizer({}));
  meta["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_NE(refused(meta).find(path + ": pre_tokenizer.type = \"Metaspace\": "), std::string::npos);
  json no_eos = base_tokenizer({});
  EXPECT_NE(refused(no_eos).find(path + ": no EOS token"), std::string::npos);
  json bad_regex = with_eos(base_tokenizer({}));
  bad_regex["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_NE(refused(bad_regex).find(path + ": pre_tokenizer Split pattern 0 = (unclosed: "),
            std::string::npos);
  // One line each.
  for (const json& j : {wp, uni, bad_merge, nfkc, meta})
    EXPECT_EQ(refused(j).find('\n'), std::string::npos);
}

// A document starts as transformers' tokenizer(text) starts it: Llama 3's post_processor
// (ByteLevel, then TemplateProcessing "<|begin_of_text|> $A") puts its BOS first; prompts and
// documents get it once, even when the text wrote it (a chat template's bos_token). Without a
// TemplateProcessing (Qwen 2.5, GPT-2) nothing is put; SentencePiece prompts follow EOS.
TEST(TokenizerJson, DocumentStartIsThePostProcessorsSpecialTokens) {
  TempDir dir;
  json j = with_eos(base_tokenizer({{"a", "b"}}));
  j["added_tokens"].push_back(added(1001, "<|begin_of_text|>"));
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false},
                     {"use_regex", true}},
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"},
                                                               {"ids", {1001}},
                                                               {"tokens", {"<|begin_of_text|>"}}}}}}}})}};
  const Tokenizer llama(write(dir, j));
  EXPECT_EQ(llama.document_start(), (std::vector<int32_t>{1001}));
  EXPECT_EQ(llama.prompt_prefix(), (std::vector<int32_t>{1001}));
  size_t added_count = 9;
  EXPECT_EQ(with_prefix_once(llama.encode("ab"), llama.prompt_prefix(), &added_count),
            (std::vector<int32_t>{1001, id_of(llama, "ab")}));
  EXPECT_EQ(added_count, 1u);
  EXPECT_EQ(with_prefix_once(llama.encode("<|begin_of_text|>ab"), llama.prompt_prefix(), &added_count),
            (std::vector<int32_t>{1001, id_of(llama, "ab")}));
  EXPECT_EQ(added_count, 0u);
  TempDir other;
  const Tokenizer qwen(write(other, with_eos(base_tokenizer({{"a", "b"}}))));
  EXPECT_TRUE(qwen.document_start().empty());
  EXPECT_TRUE(qwen.prompt_prefix().empty());
  const Tokenizer sp(test::small_tokenizer());
  EXPECT_TRUE(sp.document_start().empty());
  EXPECT_EQ(sp.prompt_prefix(), (std::vector<int32_t>{sp.eos_id()}));
}

TEST(TokenizerJson, SentencePieceTokenBytesMatchItsPieces) {
  const Tokenizer tok(test::small_tokenizer());
  EXPECT_EQ(tok.kind(), TokenizerKind::sentencepiece);
  EXPECT_EQ(tok.token_id("</s>"), tok.eos_id());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.token_bytes(*tok.token_id("<0x0A>")), "\n");
  EXPECT_EQ(tok.token_bytes(tok.eos_id()), "");
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (!tok.is_learned(id)) continue;
    std::string want = tok.piece(id);
    for (size_t at; (at = want.find("\xE2\x96\x81")) != std::string::npos;) want.replace(at, 3, " ");
    EXPECT_EQ(tok.token_bytes(id), want);
  }
}

}  // namespace
}  // namespace jumbo
