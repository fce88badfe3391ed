#pragma once
// The text formats S3 speaks besides HTTP: RFC 3986 URI encoding and the little XML we read
// from its answers or write into requests.
#include <string>
#include <string_view>
#include <vector>

namespace jumbo::s3 {

// RFC 3986: everything but unreserved characters as %XX; '/' kept when keep_slash.
std::string uri_encode(std::string_view s, bool keep_slash);

std::string xml_unescape(std::string_view s);
std::string xml_escape(std::string_view s);

// The raw contents of every <tag>...</tag> (or <tag/>) in order. S3's answers are flat
// enough that this scan is all we need: no element contains one of its own name.
std::vector<std::string_view> xml_all(std::string_view xml, std::string_view tag);

// The first <tag>'s contents, unescaped; "" when there is none.
std::string xml_first(std::string_view xml, std::string_view tag);

}  // namespace jumbo::s3
