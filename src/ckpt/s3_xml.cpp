#include "s3_xml.h"

#include <cstdlib>

namespace jumbo::s3 {

std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (const unsigned char c : s) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
                            c == '~' || (keep_slash && c == '/');
    if (unreserved) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

namespace {

// A character reference (&#233;) as UTF-8: 1 to 4 bytes, continuation bytes 10xxxxxx.
void append_utf8(std::string& out, unsigned long cp) {
  static const unsigned char lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  const int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  out += static_cast<char>(n == 1 ? cp : lead[n] | (cp >> (6 * (n - 1))));
  for (int i = n - 2; i >= 0; --i) out += static_cast<char>(0x80 | ((cp >> (6 * i)) & 0x3F));
}

}  // namespace

std::string xml_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t semi = s[i] == '&' ? s.find(';', i) : std::string_view::npos;
    if (semi == std::string_view::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    const std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") out += '&';
    else if (ent == "lt") out += '<';
    else if (ent == "gt") out += '>';
    else if (ent == "quot") out += '"';
    else if (ent == "apos") out += '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      const bool hex = ent[1] == 'x' || ent[1] == 'X';
      append_utf8(out, std::strtoul(std::string(ent.substr(hex ? 2 : 1)).c_str(), nullptr,
                                    hex ? 16 : 10));
    } else {
      out.append(s.substr(i, semi - i + 1));  // unknown entity: keep as is
    }
    i = semi;
  }
  return out;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

std::vector<std::string_view> xml_all(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  // Piecewise: GCC 12 warns falsely (-Wrestrict) on "</" + std::string(tag).
  std::string open = "<";
  open += tag;
  std::string close = "</";
  close += tag;
  close += '>';
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    const size_t after = pos + open.size();
    if (after >= xml.size()) break;
    const char c = xml[after];
    if (c != '>' && c != '/' && c != ' ') {  // a longer name: <PrefixX>
      pos = after;
      continue;
    }
    const size_t gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {
      out.emplace_back();
      pos = gt + 1;
      continue;
    }
    const size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

std::string xml_first(std::string_view xml, std::string_view tag) {
  const auto all = xml_all(xml, tag);
  return all.empty() ? std::string() : xml_unescape(all.front());
}

}  // namespace jumbo::s3
