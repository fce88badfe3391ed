// Reads a Hugging Face tokenizer.json (and tokenizer_config.json beside it, for EOS and BOS)
// into a BpeSpec. Only what ByteLevelBpe reproduces exactly is accepted; anything else is
// refused in one line naming the file, the field and its value.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "jumbo/config/config.h"
#include "jumbo/data/tokenizer_bpe.h"

namespace jumbo {
namespace {

using nlohmann::json;

// A value as it reads in a message: short, one line.
std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  return s;
}

struct Reader {
  std::string path;

  [[noreturn]] void refuse(const std::string& field, const json& value,
                           const std::string& why) const {
    throw UserError(fmt::format("{}: {} = {}: {}", path, field, shown(value), why));
  }

  const json& need(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) {
      throw UserError(fmt::format("{}: {}{} is missing", path, where.empty() ? "" : where + ".", key));
    }
    return obj.at(key);
  }

  // A field that must be absent, null or one of `allowed` (compared as JSON).
  void only(const json& obj, const char* key, const std::string& where,
            std::initializer_list<json> allowed, const std::string& why) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return;
    for (const json& a : allowed)
      if (obj.at(key) == a) return;
    refuse(where.empty() ? std::string(key) : where + "." + key, obj.at(key), why);
  }

  std::string string_of(const json& v, const std::string& field) const {
    if (!v.is_string()) refuse(field, v, "expected a string");
    return v.get<std::string>();
  }

  void model(const json& m, BpeSpec& spec) const {
    if (!m.is_object()) refuse("model", m, "expected an object");
    const json type = m.value("type", json());
    if (type != "BPE") {
      refuse("model.type", type,
             "jumbo reads byte-level BPE tokenizer.json files only (not WordPiece, Unigram or "
             "WordLevel)");
    }
    only(m, "dropout", "model", {0, 0.0}, "BPE dropout is not supported");
    only(m, "unk_token", "model", {}, "a byte-level BPE needs no unknown token; not supported");
    only(m, "continuing_subword_prefix", "model", {""}, "not supported");
    only(m, "end_of_word_suffix", "model", {""}, "not supported");
    only(m, "byte_fallback", "model", {false}, "byte fallback is not supported");
    if (m.contains("ignore_merges") && !m.at("ignore_merges").is_null()) {
      if (!m.at("ignore_merges").is_boolean())
        refuse("model.ignore_merges", m.at("ignore_merges"), "expected true or false");
      spec.ignore_merges = m.at("ignore_merges").get<bool>();
    }
    const json& vocab = need(m, "vocab", "model");
    if (!vocab.is_object()) refuse("model.vocab", vocab, "expected an object of token: id");
    std::vector<bool> taken;
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        refuse("model.vocab[" + json(token).dump() + "]", id, "expected an id >= 0");
      }
      const auto i = static_cast<size_t>(id.get<int64_t>());
      if (i >= taken.size()) taken.resize(i + 1);
      if (taken[i]) refuse("model.vocab[" + json(token).dump() + "]", id, "this id is taken twice");
      taken[i] = true;
      spec.vocab.emplace(token, static_cast<int32_t>(i));
    }
    const json& merges = need(m, "merges", "model");
    if (!merges.is_array()) refuse("model.merges", merges, "expected an array");
    spec.merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& e = merges[r];
      const std::string field = fmt::format("model.merges[{}]", r);
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          refuse(field, e, "expected two tokens separated by one space");
        spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        spec.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        refuse(field, e, "expected \"a b\" or [\"a\", \"b\"]");
      }
    }
  }

  // ByteLevel as a pre-tokenizer: must be the last step.
  void byte_level(const json& p, const std::string& where, BpeSpec& spec) const {
    if (p.contains("add_prefix_space") && !p.at("add_prefix_space").is_null()) {
      if (!p.at("add_prefix_space").is_boolean())
        refuse(where + ".add_prefix_space", p.at("add_prefix_space"), "expected true or false");
      spec.add_prefix_space = p.at("add_prefix_space").get<bool>();
    }
    spec.byte_level_regex = true;  // tokenizers' default
    if (p.contains("use_regex") && !p.at("use_regex").is_null()) {
      if (!p.at("use_regex").is_boolean())
        refuse(where + ".use_regex", p.at("use_regex"), "expected true or false");
      spec.byte_level_regex = p.at("use_regex").get<bool>();
    }
  }

  void split(const json& p, const std::string& where, BpeSpec& spec) const {
    const json& pattern = need(p, "pattern", where);
    if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex")) {
      spec.split_regexes.push_back(string_of(pattern.at("Regex"), where + ".pattern.Regex"));
      spec.split_literal.push_back(false);
    } else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String")) {
      spec.split_regexes.push_back(string_of(pattern.at("String"), where + ".pattern.String"));
      spec.split_literal.push_back(true);
    } else {
      refuse(where + ".pattern", pattern, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    const json behavior = p.value("behavior", json());
    if (behavior != "Isolated") {
      refuse(where + ".behavior", behavior, "only \"Isolated\" is supported");
    }
    only(p, "invert", where, {false}, "only false is supported");
  }

  void pre_tokenizer(const json& p, BpeSpec& spec) const {
    std::vector<std::pair<json, std::string>> steps;
    const json type = p.is_object() ? p.value("type", json()) : json();
    if (type == "Sequence") {
      const json& list = need(p, "pretokenizers", "pre_tokenizer");
      if (!list.is_array()) refuse("pre_tokenizer.pretokenizers", list, "expected an array");
      for (size_t k = 0; k < list.size(); ++k)
        steps.emplace_back(list[k], fmt::format("pre_tokenizer.pretokenizers[{}]", k));
    } else {
      steps.emplace_back(p, "pre_tokenizer");
    }
    for (size_t k = 0; k < steps.size(); ++k) {
      const auto& [step, where] = steps[k];
      const json t = step.is_object() ? step.value("type", json()) : json();
      if (t == "ByteLevel" && k + 1 == steps.size()) {
        byte_level(step, where, spec);
      } else if (t == "Split" && k + 1 < steps.size()) {
        split(step, where, spec);
      } else {
        refuse(where + ".type", t,
               "jumbo supports Split (Regex, Isolated) steps followed by one ByteLevel, last");
      }
    }
  }

  void added_tokens(const json& list, BpeSpec& spec) const {
    if (list.is_null()) return;
    if (!list.is_array()) refuse("added_tokens", list, "expected an array");
    std::unordered_map<int32_t, const std::string*> by_id;
    for (const auto& [text, vid] : spec.vocab) by_id.emplace(vid, &text);
    for (size_t k = 0; k < list.size(); ++k) {
      const json& t = list[k];
      const std::string where = fmt::format("added_tokens[{}]", k);
      AddedTokenSpec a;
      const json& id = need(t, "id", where);
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        refuse(where + ".id", id, "expected an id >= 0");
      a.id = static_cast<int32_t>(id.get<int64_t>());
      a.content = string_of(need(t, "content", where), where + ".content");
      if (a.content.empty()) refuse(where + ".content", t.at("content"), "an empty token");
      const auto flag = [&](const char* key, bool fallback) {
        if (!t.contains(key) || t.at(key).is_null()) return fallback;
        if (!t.at(key).is_boolean()) refuse(where + "." + key, t.at(key), "expected true or false");
        return t.at(key).get<bool>();
      };
      a.special = flag("special", false);
      a.single_word = flag("single_word", false);
      a.lstrip = flag("lstrip", false);
      a.rstrip = flag("rstrip", false);
      a.normalized = flag("normalized", !a.special);
      if (auto it = by_id.find(a.id); it != by_id.end() && *it->second != a.content) {
        refuse(where + ".id", id,
               fmt::format("model.vocab gives this id to {}", json(*it->second).dump()));
      }
      spec.added.push_back(std::move(a));
    }
  }
};

// The id of a token named by tokenizer_config.json ("<|eot|>" or {"content": "<|eot|>"}).
std::optional<int32_t> config_token(const Reader& r, const json& config, const char* key,
                                    const std::string& config_path, const BpeSpec& spec) {
  if (!config.contains(key) || config.at(key).is_null()) return std::nullopt;
  json v = config.at(key);
  if (v.is_object() && v.contains("content")) v = v.at("content");
  if (!v.is_string()) {
    throw UserError(fmt::format("{}: {} = {}: expected a token's text", config_path, key, shown(v)));
  }
  const std::string text = v.get<std::string>();
  for (const auto& a : spec.added)
    if (a.content == text) return a.id;
  if (auto it = spec.vocab.find(text); it != spec.vocab.end()) return it->second;
  throw UserError(fmt::format("{}: {} = {}: not a token of {}", config_path, key, json(text).dump(),
                              r.path));
}

// The special tokens TemplateProcessing's "single" puts before the text ($A), alone or inside a
// Sequence of processors (Llama 3.1's: ByteLevel, then TemplateProcessing).
std::vector<int32_t> template_document_start(const Reader& r, const json& post) {
  if (!post.is_object()) return {};
  if (post.value("type", json()) == "Sequence") {
    for (const json& p : post.value("processors", json::array())) {
      if (std::vector<int32_t> ids = template_document_start(r, p); !ids.empty()) return ids;
    }
    return {};
  }
  if (post.value("type", json()) != "TemplateProcessing") return {};
  std::vector<int32_t> ids;
  const json specials = post.value("special_tokens", json::object());
  for (const json& item : post.value("single", json::array())) {
    if (!item.is_object() || item.contains("Sequence")) break;
    if (!item.contains("SpecialToken")) continue;
    const std::string name = item["SpecialToken"].value("id", std::string());
    const json entry = specials.value(name, json());
    if (!entry.is_object() || !entry.value("ids", json()).is_array()) {
      r.refuse("post_processor.special_tokens", json(name), "a special token of \"single\" "
               "without its ids");
    }
    for (const json& id : entry["ids"]) ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace

std::unique_ptr<TokenizerModel> load_tokenizer_json(const std::string& path,
                                                    const std::string& bytes) {
  const Reader r{path};
  json j;
  try {
    j = json::parse(bytes);
  } catch (const json::parse_error& e) {
    throw UserError(fmt::format(
        "{}: not a SentencePiece model, and not a tokenizer.json (it starts with '{{' but is not "
        "valid JSON: {})", path, e.what()));
  }
  if (!j.is_object() || !j.contains("model")) {
    throw UserError(fmt::format(
        "{}: not a SentencePiece model, and not a tokenizer.json (a JSON {} without a \"model\" "
        "field)", path, j.is_object() ? "object" : "value"));
  }
  BpeSpec spec;
  spec.path = path;
  r.model(r.need(j, "model", ""), spec);
  // Unicode NFC (Qwen 2.5's), alone or as a one-element Sequence; null: none.
  const json normalizer = j.value("normalizer", json());
  if (!normalizer.is_null()) {
    const bool nfc = normalizer.is_object() && normalizer.value("type", json()) == "NFC";
    const json inner = normalizer.is_object() ? normalizer.value("normalizers", json()) : json();
    const bool sequence_nfc = normalizer.is_object() &&
                              normalizer.value("type", json()) == "Sequence" && inner.is_array() &&
                              inner.size() == 1 && inner[0].is_object() &&
                              inner[0].value("type", json()) == "NFC";
    if (!nfc && !sequence_nfc) {
      r.refuse("normalizer", normalizer, "the only normalizer is {\"type\": \"NFC\"} (or null)");
    }
    spec.nfc = true;
  }
  const json pre = j.value("pre_tokenizer", json());
  if (pre.is_null()) r.refuse("pre_tokenizer", pre, "a byte-level BPE needs a ByteLevel pre_tokenizer");
  r.pre_tokenizer(pre, spec);
  const json decoder = j.value("decoder", json());
  if (!decoder.is_object() || decoder.value("type", json()) != "ByteLevel") {
    r.refuse("decoder", decoder, "expected {\"type\": \"ByteLevel\", ...}");
  }
  r.only(j, "truncation", "", {}, "truncation is not supported (null only)");
  r.only(j, "padding", "", {}, "padding is not supported (null only)");
  const json post = j.value("post_processor", json());
  if (post.is_object()) spec.post_processor = post.value("type", std::string("?"));
  spec.document_start = template_document_start(r, post);
  r.added_tokens(j.value("added_tokens", json::array()), spec);

  // EOS and BOS: tokenizer_config.json beside the file, else the usual end-of-text tokens.
  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  json config = json::object();
  if (std::ifstream in(config_path, std::ios::binary); in) {
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    try {
      config = json::parse(text);
    } catch (const json::parse_error& e) {
      throw UserError(fmt::format("{}: not valid JSON: {}", config_path.string(), e.what()));
    }
  }
  spec.eos_id = config_token(r, config, "eos_token", config_path.string(), spec).value_or(-1);
  spec.bos_id = config_token(r, config, "bos_token", config_path.string(), spec).value_or(-1);
  if (spec.eos_id < 0) {
    for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>"}) {
      auto ids = std::optional<int32_t>();
      for (const auto& a : spec.added)
        if (a.content == name) ids = a.id;
      if (!ids) {
        if (auto it = spec.vocab.find(name); it != spec.vocab.end()) ids = it->second;
      }
      if (ids) {
        spec.eos_id = *ids;
        break;
      }
    }
  }
  if (spec.eos_id < 0) {
    throw UserError(fmt::format(
        "{}: no EOS token: tokenizer_config.json beside it names no eos_token, and none of "
        "<|end_of_text|>, <|endoftext|>, </s>, <|im_end|> is a token; documents need one",
        path));
  }
  return std::make_unique<ByteLevelBpe>(std::move(spec));
}

}  // namespace jumbo
