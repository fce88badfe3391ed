#pragma once
// The HTTP layer under S3Client, shared by s3_client.cpp (which defines it) and
// s3_credentials.cpp (the metadata service): one request, its answer, one libcurl exchange.
#include <curl/curl.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "jumbo/ckpt/s3_client.h"

namespace jumbo {

struct S3Client::Request {
  std::string method, url;
  std::string where;  // the s3:// URL, for messages
  std::vector<std::string> headers;
  const char* body = nullptr;
  size_t body_size = 0;
  int max_attempts = 0;       // 0: S3Options::max_attempts
  bool error_in_200 = false;  // CompleteMultipartUpload may answer 200 with an <Error>
  long connect_timeout_ms = 10000;
  long timeout_ms = 0;  // 0: none, but a stalled transfer (<1 KiB/s for 60 s) is abandoned
};

struct S3Client::Response {
  CURLcode rc = CURLE_OK;
  std::string error;  // curl's words for rc; never holds credentials
  long status = 0;
  std::vector<char> body;
  std::string etag;
  std::string bucket_region;
  std::string_view text() const { return {body.data(), body.size()}; }
};

namespace s3 {

using Transfer = S3Client::Response;
using HttpCall = S3Client::Request;

inline void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

inline std::string strip_slash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

// One HTTP exchange, signed with `creds` unless null (the metadata service).
void perform(CURL* h, const HttpCall& c, const AwsCredentials* creds, const std::string& region,
             Transfer& t);

}  // namespace s3
}  // namespace jumbo
