// S3 over libcurl. libcurl 7.88 signs the query string exactly as written (canonicalisation
// came in 8.1), so every query here is built already canonical: names sorted, values
// RFC 3986-encoded, "name=" for valueless sub-resources. Credentials go to libcurl only.
#include "jumbo/ckpt/s3_client.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <thread>

#include "jumbo/config/config.h"
#include "s3_http.h"
#include "s3_xml.h"

namespace jumbo {

using namespace s3;

namespace {

// One line: messages must not wrap whatever a server put in them.
std::string one_line(std::string s, size_t max = 300) {
  std::replace_if(s.begin(), s.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

struct Upload {
  const char* data;
  size_t size, pos;
};

size_t read_cb(char* buf, size_t size, size_t n, void* p) {
  auto* u = static_cast<Upload*>(p);
  const size_t len = std::min(size * n, u->size - u->pos);
  if (len > 0) std::memcpy(buf, u->data + u->pos, len);
  u->pos += len;
  return len;
}

int seek_cb(void* p, curl_off_t offset, int origin) {
  auto* u = static_cast<Upload*>(p);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > u->size) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  u->pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

// No exception may cross libcurl's C frames: out of memory ends the transfer instead.
size_t write_cb(char* ptr, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  try {
    t->body.insert(t->body.end(), ptr, ptr + size * n);
  } catch (const std::exception&) {
    t->error = "out of memory for the response";
    return 0;
  }
  return size * n;
}

size_t header_cb(char* buf, size_t size, size_t n, void* p) {
  auto* t = static_cast<Transfer*>(p);
  const std::string_view line(buf, size * n);
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) {
    value.remove_suffix(1);
  }
  if (name == "etag") t->etag = value;
  if (name == "x-amz-bucket-region") t->bucket_region = value;
  if (name == "content-length") {
    // Reserve once for big objects instead of regrowing the vector (a hint: may fail).
    const unsigned long long len = std::strtoull(std::string(value).c_str(), nullptr, 10);
    try {
      t->body.reserve(static_cast<size_t>(std::min(len, 64ULL << 30)));
    } catch (const std::exception&) {
    }
  }
  return size * n;
}


bool transient(CURLcode rc) {
  for (const CURLcode t : {CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT,
                           CURLE_OPERATION_TIMEDOUT, CURLE_SEND_ERROR, CURLE_RECV_ERROR,
                           CURLE_GOT_NOTHING, CURLE_PARTIAL_FILE, CURLE_SSL_CONNECT_ERROR,
                           CURLE_HTTP2, CURLE_HTTP2_STREAM}) {
    if (rc == t) return true;
  }
  return false;
}

// 100 ms doubling to 5 s, with jitter so that many ranks do not retry in lockstep.
std::chrono::milliseconds backoff(int attempt) {
  const double ms = std::min(5000.0, 100.0 * std::pow(2.0, attempt - 1));
  thread_local std::mt19937 rng{std::random_device{}()};
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(ms * jitter(rng)));
}

}  // namespace

// One HTTP exchange, signed with `creds` unless null (the metadata service).
void s3::perform(CURL* h, const HttpCall& c, const AwsCredentials* creds,
                 const std::string& region, Transfer& t) {
  curl_easy_reset(h);  // keeps the connection cache
  char errbuf[CURL_ERROR_SIZE] = "";
  curl_slist* headers = nullptr;
  for (const auto& line : c.headers) headers = curl_slist_append(headers, line.c_str());
  if (creds) {
    // S3 rejects SigV4 requests without it; UNSIGNED-PAYLOAD spares hashing the body.
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!creds->session_token.empty()) {
      headers = curl_slist_append(headers,
                                  ("x-amz-security-token: " + creds->session_token).c_str());
    }
    const std::string sigv4 = "aws:amz:" + region + ":s3";
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());  // copied by libcurl
    curl_easy_setopt(h, CURLOPT_USERNAME, creds->access_key.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, creds->secret_key.c_str());
  }
  curl_easy_setopt(h, CURLOPT_URL, c.url.c_str());
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // keys are not paths to normalise
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);    // safe from several threads
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c.connect_timeout_ms);
  if (c.timeout_ms > 0) {
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c.timeout_ms);
  } else {
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  Upload upload{c.body ? c.body : "", c.body_size, 0};
  if (c.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
    curl_easy_setopt(h, CURLOPT_READDATA, &upload);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &upload);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(c.body_size));
  } else if (c.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(c.body_size));
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, upload.data);
  } else if (c.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, c.method.c_str());
  }
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  t.rc = curl_easy_perform(h);
  if (t.rc != CURLE_OK && t.error.empty()) {
    t.error = errbuf[0] ? errbuf : curl_easy_strerror(t.rc);
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &t.status);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, nullptr);  // errbuf is about to go
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
}


// Easy handles kept for their connections (TLS sessions), one per concurrent request.
struct S3Client::HandlePool {
  std::mutex mutex;
  std::vector<CURL*> idle;
  CURL* take() {
    std::lock_guard<std::mutex> lock(mutex);
    if (idle.empty()) return curl_easy_init();
    CURL* h = idle.back();
    idle.pop_back();
    return h;
  }
  void give(CURL* h) {
    std::lock_guard<std::mutex> lock(mutex);
    idle.push_back(h);
  }
  ~HandlePool() {
    for (CURL* h : idle) curl_easy_cleanup(h);
  }
};


S3Client::S3Client(std::string bucket, const S3Options& opts)
    : bucket_(std::move(bucket)), opts_(opts), pool_(std::make_unique<HandlePool>()) {
  global_init();
  region_ = !opts.region.empty()               ? opts.region
            : !env("AWS_REGION").empty()         ? env("AWS_REGION")
            : !env("AWS_DEFAULT_REGION").empty() ? env("AWS_DEFAULT_REGION")
                                                 : "us-east-1";
  std::string source = "checkpoint.s3_endpoint";
  endpoint_ = opts.endpoint;
  for (const char* var : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    if (endpoint_.empty() && !env(var).empty()) {
      endpoint_ = env(var);
      source = var;
    }
  }
  endpoint_ = strip_slash(endpoint_);
  if (!endpoint_.empty() && endpoint_.rfind("http://", 0) != 0 &&
      endpoint_.rfind("https://", 0) != 0) {
    throw UserError(fmt::format("{} = {}: expected an http:// or https:// URL such as "
                                "http://127.0.0.1:4568", source, endpoint_));
  }
}

S3Client::~S3Client() = default;

// Path-style with an endpoint; else virtual-hosted, except for dotted bucket names, which
// the *.s3.amazonaws.com certificate does not cover.
std::string S3Client::object_url(const std::string& key, const std::string& query) const {
  std::string url;
  if (!endpoint_.empty()) url = endpoint_ + "/" + bucket_ + "/";
  else if (bucket_.find('.') != std::string::npos)
    url = "https://s3." + region_ + ".amazonaws.com/" + bucket_ + "/";
  else url = "https://" + bucket_ + ".s3." + region_ + ".amazonaws.com/";
  url += uri_encode(key, true);
  return query.empty() ? url : url + "?" + query;
}

std::string S3Client::bucket_url(const std::string& query) const {
  std::string url = object_url("", "");
  if (!endpoint_.empty() || bucket_.find('.') != std::string::npos) url.pop_back();  // "/b"
  return query.empty() ? url : url + "?" + query;
}


S3Client::Response S3Client::send(Request& req, const std::vector<long>& accept) {
  const int attempts = std::max(1, req.max_attempts > 0 ? req.max_attempts : opts_.max_attempts);
  bool refreshed = false;
  for (int attempt = 1;; ++attempt) {
    const AwsCredentials creds = credentials(false);
    Response r;
    CURL* h = pool_->take();
    if (!h) throw UserError(fmt::format("S3 {} {}: cannot start libcurl", req.method, req.where));
    perform(h, req, &creds, region_, r);
    pool_->give(h);

    std::string what;
    bool retry = false;
    if (r.rc != CURLE_OK) {
      what = one_line(r.error);
      retry = transient(r.rc);
    } else {
      const bool error_body = req.error_in_200 && r.text().find("<Error>") != std::string::npos;
      const bool ok = (r.status / 100 == 2 && !error_body) ||
                      std::find(accept.begin(), accept.end(), r.status) != accept.end();
      if (ok) return r;
      const std::string code = xml_first(r.text(), "Code");
      const std::string message = xml_first(r.text(), "Message");
      if ((code == "ExpiredToken" || code == "InvalidToken") && creds_from_imds_.load() &&
          !refreshed) {
        credentials(true);  // the role's credentials rotated under us: fetch and resend once
        refreshed = true;
        --attempt;
        continue;
      }
      retry = r.status >= 500 || r.status == 429 || error_body || code == "SlowDown" ||
              code == "RequestTimeout" || code == "InternalError";
      what = fmt::format("HTTP {}", r.status);
      if (!code.empty()) what += " " + code;
      if (!message.empty()) what += ": " + one_line(message);
      if (code.empty() && !r.body.empty() && r.text().find('<') == std::string_view::npos) {
        what += ": " + one_line(std::string(r.text()), 120);
      }
      if (r.status == 403) {
        what += " (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the instance role)";
      }
      if (!r.bucket_region.empty() && r.bucket_region != region_) {
        what += fmt::format(" (the bucket is in region {}, not {}: set checkpoint.s3_region)",
                            r.bucket_region, region_);
      }
    }
    if (!retry || attempt >= attempts) {
      throw UserError(fmt::format("S3 {} {}: {}{}", req.method, req.where, what,
                                  attempt > 1 ? fmt::format(" (after {} attempts)", attempt)
                                              : std::string()));
    }
    std::this_thread::sleep_for(backoff(attempt));
  }
}

S3Client::PutResult S3Client::put_object(const std::string& key, const void* data,
                                         size_t size) {
  const int64_t threshold = opts_.multipart_threshold > 0 ? opts_.multipart_threshold
                                                          : S3Options{}.multipart_threshold;
  if (static_cast<int64_t>(size) > threshold) {
    return put_multipart(key, static_cast<const char*>(data), size);
  }
  Request req{"PUT", object_url(key, ""), s3_url(key), {"Content-Type: application/octet-stream"},
              static_cast<const char*>(data), size};
  return {send(req).etag, 0};
}

S3Client::PutResult S3Client::put_multipart(const std::string& key, const char* data,
                                            size_t size) {
  // S3 allows 10,000 parts: grow the parts rather than fail on a huge object.
  size_t part = static_cast<size_t>(opts_.part_size > 0 ? opts_.part_size : S3Options{}.part_size);
  part = std::max(part, (size + 9999) / 10000);
  Request create{"POST", object_url(key, "uploads="), s3_url(key),
                 {"Content-Type: application/octet-stream"}};
  const Response created = send(create);
  const std::string upload_id = xml_first(created.text(), "UploadId");
  if (upload_id.empty()) {
    throw UserError(fmt::format("S3 POST {}: CreateMultipartUpload gave no UploadId", s3_url(key)));
  }
  const std::string id_query = "uploadId=" + uri_encode(upload_id, false);
  try {
    std::string xml = "<CompleteMultipartUpload>";
    int number = 0;
    for (size_t off = 0; off < size; off += part) {
      ++number;
      Request put{"PUT", object_url(key, fmt::format("partNumber={}&{}", number, id_query)),
                  fmt::format("{} (part {})", s3_url(key), number), {}, data + off,
                  std::min(part, size - off)};
      const Response r = send(put);
      if (r.etag.empty()) {
        throw UserError(fmt::format("S3 PUT {} (part {}): no ETag in the answer", s3_url(key),
                                    number));
      }
      xml += fmt::format("<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>", number,
                         xml_escape(r.etag));
    }
    xml += "</CompleteMultipartUpload>";
    Request complete{"POST", object_url(key, id_query), s3_url(key),
                     {"Content-Type: application/xml"}, xml.data(), xml.size()};
    complete.error_in_200 = true;
    const Response done = send(complete);
    return {xml_first(done.text(), "ETag"), number};
  } catch (...) {
    // Parts of an abandoned upload are billed until aborted; the first error is the news.
    try {
      Request abort{"DELETE", object_url(key, id_query), s3_url(key), {}};
      abort.max_attempts = 2;
      send(abort);
    } catch (const std::exception&) {
    }
    throw;
  }
}

std::optional<std::vector<char>> S3Client::get_object(const std::string& key) {
  Request req{"GET", object_url(key, ""), s3_url(key), {}};
  Response r = send(req, {404});
  if (r.status == 404) {
    const std::string code = xml_first(r.text(), "Code");
    if (!code.empty() && code != "NoSuchKey") {
      throw UserError(fmt::format("S3 GET {}: HTTP 404 {}: {}", s3_url(key), code,
                                  one_line(xml_first(r.text(), "Message"))));
    }
    return std::nullopt;
  }
  return std::move(r.body);
}

std::vector<std::string> S3Client::list(const std::string& prefix, bool delimited,
                                        int page_size) {
  std::vector<std::string> out;
  std::string token;
  for (;;) {
    std::string q;  // names in canonical (sorted) order
    if (!token.empty()) q += "continuation-token=" + uri_encode(token, false) + "&";
    if (delimited) q += "delimiter=%2F&";
    q += "list-type=2";
    if (page_size != 1000) q += fmt::format("&max-keys={}", page_size);
    if (!prefix.empty()) q += "&prefix=" + uri_encode(prefix, false);
    Request req{"GET", bucket_url(q), s3_url(prefix), {}};
    const Response r = send(req);
    const std::string_view xml = r.text();
    for (const auto block : xml_all(xml, delimited ? "CommonPrefixes" : "Contents")) {
      std::string name = xml_first(block, delimited ? "Prefix" : "Key");
      if (!name.empty()) out.push_back(std::move(name));
    }
    if (xml_first(xml, "IsTruncated") != "true") break;
    token = xml_first(xml, "NextContinuationToken");
    if (token.empty()) {
      throw UserError(fmt::format("S3 GET {}: a truncated listing without NextContinuationToken",
                                  s3_url(prefix)));
    }
  }
  return out;
}

std::vector<std::string> S3Client::list_prefixes(const std::string& prefix) {
  return list(prefix, true, 1000);
}

std::vector<std::string> S3Client::list_keys(const std::string& prefix, int page_size) {
  return list(prefix, false, page_size);
}

void S3Client::delete_object(const std::string& key) {
  Request req{"DELETE", object_url(key, ""), s3_url(key), {}};
  const Response r = send(req, {404});
  const std::string code = r.status == 404 ? xml_first(r.text(), "Code") : "";
  if (!code.empty() && code != "NoSuchKey") {  // a missing key is gone already; a bucket is not
    throw UserError(fmt::format("S3 DELETE {}: HTTP 404 {}: {}", s3_url(key), code,
                                one_line(xml_first(r.text(), "Message"))));
  }
}

size_t S3Client::delete_prefix(const std::string& prefix) {
  // One DELETE per key: DeleteObjects needs a Content-MD5 we would have to compute, and
  // checkpoint directories hold few objects.
  const auto keys = list_keys(prefix);
  for (const auto& key : keys) delete_object(key);
  return keys.size();
}

}  // namespace jumbo
