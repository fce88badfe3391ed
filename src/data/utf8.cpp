// UTF-8 (data/utf8.h): encoding a code point, validation, WHATWG replacement of invalid
// sequences (what node's TextDecoder and Python's errors="replace" do), NFC by utf8proc.
#include <utf8proc.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "jumbo/data/utf8.h"

namespace jumbo {
namespace {

// A lead byte's continuation count and the range its first continuation byte must lie in
// (WHATWG's bounds: no overlong forms, no surrogates, nothing above U+10FFFF); false when the
// byte cannot start a multi-byte character.
struct Lead {
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
};
bool lead_of(unsigned char c, Lead& l) {
  if (c >= 0xC2 && c <= 0xDF) {
    l.need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    l.need = 2;
    if (c == 0xE0) l.lo = 0xA0;
    if (c == 0xED) l.hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    l.need = 3;
    if (c == 0xF0) l.lo = 0x90;
    if (c == 0xF4) l.hi = 0x8F;
  } else {
    return false;
  }
  return true;
}

// How many of the lead byte at s[i]'s continuation bytes follow it in range.
size_t continuations_at(std::string_view s, size_t i, const Lead& l) {
  size_t k = 1;
  for (; k <= l.need && i + k < s.size(); ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if (d < (k == 1 ? l.lo : 0x80) || d > (k == 1 ? l.hi : 0xBF)) break;
  }
  return k - 1;
}

// Bytes of the valid UTF-8 character at s[i], or 0 when none starts there.
size_t valid_char_at(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  Lead l;
  if (!lead_of(c, l)) return 0;
  return continuations_at(s, i, l) == l.need ? l.need + 1 : 0;
}

// Bytes of the maximal subpart of an ill-formed sequence at s[i] (at least 1): the lead byte
// and the continuation bytes that are still in range.
size_t invalid_run_at(std::string_view s, size_t i) {
  Lead l;
  if (!lead_of(static_cast<unsigned char>(s[i]), l)) return 1;
  return continuations_at(s, i, l) + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = valid_char_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_char_at(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += invalid_run_at(s, i);
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string nfc_normalized(std::string_view text) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {  // only for invalid UTF-8, which encode has replaced before
    std::free(mapped);
    return std::string(text);
  }
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}


}  // namespace jumbo
