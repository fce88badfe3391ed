#pragma once
// UTF-8 as data/ needs it: the tokenizers (tokenizer.json's byte alphabet, invalid input, NFC)
// and the chat templates' string escapes. src/data/utf8.cpp.
#include <cstdint>
#include <string>
#include <string_view>

namespace jumbo {

// Appends code point `cp` (at most U+10FFFF) as UTF-8.
void append_utf8(std::string& out, uint32_t cp);
// `text` with each maximal invalid UTF-8 subsequence replaced by U+FFFD, as the WHATWG
// Encoding standard (and so node's TextDecoder) does; valid UTF-8 comes back unchanged.
std::string sanitize_utf8(std::string_view text);
bool is_valid_utf8(std::string_view text);
// Unicode Normalization Form C of valid UTF-8 (utf8proc, Debian's libutf8proc), as a
// tokenizer.json's {"type": "NFC"} normalizer applies it.
std::string nfc_normalized(std::string_view text);

}  // namespace jumbo
