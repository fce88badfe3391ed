// Input of `jumbo data prepare`: units of files, and their documents read in batches through
// one large buffer (no per-line stream calls), JSON parsed per line, UTF-8 checked.
#include "prepare_input.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

constexpr size_t kReadBlock = size_t{16} << 20;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_input(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw UserError(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  return f;
}

void seek(std::FILE* f, uint64_t offset, const std::string& path) {
  if (::fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0) {
    throw UserError(fmt::format("{}: cannot seek to byte {} ({})", path, offset, std::strerror(errno)));
  }
}

// The first line start at or after `offset`: 0, or the byte after the first '\n' at or after
// offset - 1. `size` if there is none.
uint64_t line_start_at_or_after(std::FILE* f, uint64_t offset, uint64_t size, const std::string& path) {
  if (offset == 0) return 0;
  if (offset >= size) return size;
  seek(f, offset - 1, path);
  uint64_t pos = offset - 1;
  for (int c; (c = std::fgetc(f)) != EOF; ++pos)
    if (c == '\n') return pos + 1;
  if (std::ferror(f)) throw UserError(fmt::format("{}: read error ({})", path, std::strerror(errno)));
  return size;
}

// 1-based line number of the line starting at byte `offset` (counted only for a message).
uint64_t line_number(const std::string& path, uint64_t offset) {
  File f = open_input(path);
  std::vector<char> block(kReadBlock);
  uint64_t line = 1, done = 0;
  while (done < offset) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(block.size(), offset - done));
    const size_t got = std::fread(block.data(), 1, want, f.get());
    if (got == 0) break;
    for (size_t i = 0; i < got; ++i) line += block[i] == '\n';
    done += got;
  }
  return line;
}

// Offset of the first byte that is not part of valid UTF-8 (overlongs, surrogates and code
// points above U+10FFFF are invalid), or npos.
size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  auto cont = [&](size_t k) { return k < n && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80; };
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(i + 1)) return i;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(i + 1) || !cont(i + 2)) return i;
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) return i;
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return i;
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) return i;
      i += 4;
    } else {
      return i;
    }
  }
  return std::string_view::npos;
}

// The JSON object of one line into obj, or why the line is not one ("" on success); `key` is
// the field the line should hold, for the message.
std::string json_object_of_line(std::string_view line, const std::string& key, nlohmann::json& obj) {
  if (const size_t bad = invalid_utf8_at(line); bad != std::string_view::npos) {
    return fmt::format("invalid UTF-8 at column {} (expected UTF-8 text)", bad + 1);
  }
  try {
    obj = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is the column; the library's own message repeats it with internal detail.
    return fmt::format("not valid JSON at column {} (expected one JSON object per line)", e.byte);
  }
  if (!obj.is_object()) {
    return fmt::format("a JSON {}, expected an object with a string \"{}\"", obj.type_name(), key);
  }
  return "";
}

// obj[key] as a string into out, or why it is not one.
std::string string_field(const nlohmann::json& obj, const std::string& key, std::string& out) {
  const auto field = obj.find(key);
  if (field == obj.end() || !field->is_string()) {
    return fmt::format("{}, expected a string field \"{}\"",
                       field == obj.end() ? "no such key"
                                          : "the value is a " + std::string(field->type_name()),
                       key);
  }
  out = field->get<std::string>();
  return "";
}

}  // namespace

std::string document_of_json_line(std::string_view line, const std::string& json_key,
                                  std::string& doc) {
  nlohmann::json obj;
  if (std::string why = json_object_of_line(line, json_key, obj); !why.empty()) return why;
  return string_field(obj, json_key, doc);
}

namespace {

// {"messages": [{"role": ROLE, "content": TEXT}, ...]} as an example through the template.
std::string example_of_messages(const nlohmann::json& list, const ChatTemplate* chat_template,
                                std::string& prompt, std::string& completion) {
  if (!chat_template) {
    return "a \"messages\" line needs a chat template (--chat-template FILE) to become text";
  }
  if (!list.is_array()) return fmt::format("\"messages\" is a {}, expected a list", list.type_name());
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& m = list[i];
    const auto role = m.is_object() && m.contains("role") && m["role"].is_string()
                          ? chat_role_of(m["role"].get<std::string>())
                          : std::nullopt;
    if (!role) return fmt::format("messages[{}].role: expected \"system\", \"user\" or \"assistant\"", i);
    std::string content;
    if (std::string why = string_field(m, "content", content); !why.empty()) {
      return fmt::format("messages[{}]: {}", i, why);
    }
    messages.push_back({*role, std::move(content)});
  }
  return chat_template->training_example(messages, prompt, completion);
}

}  // namespace

std::string example_of_json_line(std::string_view line, std::string& prompt,
                                 std::string& completion, const ChatTemplate* chat_template) {
  nlohmann::json obj;  // parsed once for both fields
  if (std::string why = json_object_of_line(line, "prompt", obj); !why.empty()) return why;
  if (const auto m = obj.find("messages"); m != obj.end() && !obj.contains("prompt")) {
    return example_of_messages(*m, chat_template, prompt, completion);
  }
  if (std::string why = string_field(obj, "prompt", prompt); !why.empty()) return why;
  if (std::string why = string_field(obj, "completion", completion); !why.empty()) return why;
  if (completion.empty()) return "the completion is empty, expected the text to learn";
  return "";
}

bool is_jsonl(const std::string& path) {
  return path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
}

std::vector<InputUnit> plan_units(const std::vector<std::string>& files, uint64_t part_bytes) {
  std::vector<InputUnit> units;
  for (const std::string& path : files) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) throw UserError(fmt::format("{}: cannot read its size ({})", path, ec.message()));
    if (!is_jsonl(path)) {
      units.push_back({path, 0, size, false});
      continue;
    }
    for (uint64_t begin = 0; begin < size; begin += part_bytes)
      units.push_back({path, begin, std::min(size, begin + part_bytes), true});
  }
  return units;
}

void for_each_unit_batch(const InputUnit& unit, const DocumentFields& fields, BadDocuments bad,
                         size_t batch_bytes,
                         const std::function<void(std::vector<InputDocument>&)>& batch,
                         UnitStats& stats) {
  const std::string& path = unit.path;
  File f = open_input(path);
  std::vector<InputDocument> docs;
  size_t pending = 0;
  auto reject = [&](uint64_t line_offset, const std::string& why) {
    const std::string where = fmt::format("{}:{}: {}", path, line_number(path, line_offset), why);
    if (bad == BadDocuments::fail) throw UserError(where);
    if (stats.skipped++ == 0) stats.first_skipped = where;
  };
  auto take = [&](InputDocument doc, uint64_t bytes) {
    stats.documents += 1;
    stats.bytes += bytes;
    pending += doc.text.size() + doc.completion.size();
    docs.push_back(std::move(doc));
    if (pending >= batch_bytes) {
      batch(docs);
      docs.clear();
      pending = 0;
    }
  };

  if (!unit.jsonl && fields.kind == DocumentKind::prompt_completion) {
    throw UserError(fmt::format("{}: not a .jsonl file; prompt-completion examples are JSON lines "
                                "{{\"prompt\": ..., \"completion\": ...}}", path));
  }
  if (!unit.jsonl) {  // the whole file is one document
    std::string text(static_cast<size_t>(unit.end), '\0');
    if (unit.end > 0 && std::fread(text.data(), 1, text.size(), f.get()) != text.size()) {
      throw UserError(fmt::format("{}: read error ({})", path, std::strerror(errno)));
    }
    if (const size_t at = invalid_utf8_at(text); at != std::string::npos) {
      reject(at, fmt::format("invalid UTF-8 at byte {} (expected UTF-8 text)", at));
    } else {
      take({std::move(text), {}}, unit.end);
    }
    if (!docs.empty()) batch(docs);
    return;
  }

  uint64_t size = 0;
  {
    std::error_code ec;
    size = std::filesystem::file_size(path, ec);
    if (ec) throw UserError(fmt::format("{}: cannot read its size ({})", path, ec.message()));
  }
  const uint64_t start = line_start_at_or_after(f.get(), unit.begin, size, path);
  seek(f.get(), start, path);
  // buffer[0, filled) holds file bytes from `buffer_offset`; lines are cut from it in place.
  std::string buffer;
  uint64_t buffer_offset = start, line_begin = start;
  InputDocument doc;
  while (line_begin < unit.end && line_begin < size) {
    const size_t local = static_cast<size_t>(line_begin - buffer_offset);
    const size_t newline = buffer.find('\n', local);
    if (newline == std::string::npos && buffer_offset + buffer.size() < size) {
      buffer.erase(0, local);  // keep the partial line, read more after it
      buffer_offset = line_begin;
      const size_t old = buffer.size();
      buffer.resize(old + kReadBlock);
      const size_t got = std::fread(buffer.data() + old, 1, kReadBlock, f.get());
      buffer.resize(old + got);
      if (got == 0) {
        if (std::ferror(f.get())) throw UserError(fmt::format("{}: read error ({})", path, std::strerror(errno)));
        size = buffer_offset + buffer.size();  // the file shrank while read: stop at its end
      }
      continue;
    }
    const size_t line_end = newline == std::string::npos ? buffer.size() : newline;
    std::string_view line(buffer.data() + local, line_end - local);
    const uint64_t this_line = line_begin;
    line_begin = buffer_offset + line_end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines
    const std::string why = fields.kind == DocumentKind::text
                                ? document_of_json_line(line, fields.json_key, doc.text)
                                : example_of_json_line(line, doc.text, doc.completion,
                                                       fields.chat_template);
    if (!why.empty()) {
      reject(this_line, why);
      continue;
    }
    take(std::move(doc), line.size() + 1);
  }
  if (!docs.empty()) batch(docs);
}

}  // namespace jumbo
