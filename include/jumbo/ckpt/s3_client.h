#pragma once
// A small S3 client on libcurl: SigV4 signing is libcurl's (CURLOPT_AWS_SIGV4); we add the
// payload header, addressing, credentials (environment or EC2 IMDSv2), retries and the few
// XML elements we need. Thread-safe: requests from several threads may run at once.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "jumbo/ckpt/storage.h"

namespace jumbo {

// Never printed: no message or log may contain these.
struct AwsCredentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty for long-term keys
  // When the instance-role credentials expire; max() for keys from the environment.
  std::chrono::system_clock::time_point expiration = std::chrono::system_clock::time_point::max();
};

// IMDSv2 at `endpoint` ("http://169.254.169.254"): token, role name, role credentials.
// nullopt with *why set (one phrase, no secrets) when there is no metadata service or role.
std::optional<AwsCredentials> fetch_imds_credentials(const std::string& endpoint,
                                                     std::string* why);

class S3Client {
 public:
  // Region, endpoint and credentials come from `opts`, else the AWS environment variables.
  S3Client(std::string bucket, const S3Options& opts);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const std::string& bucket() const { return bucket_; }
  const std::string& region() const { return region_; }
  std::string s3_url(const std::string& key) const { return "s3://" + bucket_ + "/" + key; }

  struct PutResult {
    std::string etag;
    int parts = 0;  // 0: a single PUT; else the number of multipart parts
  };
  // A single PUT up to opts.multipart_threshold bytes, else a multipart upload.
  PutResult put_object(const std::string& key, const void* data, size_t size);
  // The whole object; nullopt when the key does not exist (a missing bucket throws).
  std::optional<std::vector<char>> get_object(const std::string& key);
  // ListObjectsV2 with delimiter '/': the common prefixes ("a/b/") right under `prefix`.
  std::vector<std::string> list_prefixes(const std::string& prefix);
  // Every key that starts with `prefix`; page_size < 1000 only to test paging.
  std::vector<std::string> list_keys(const std::string& prefix, int page_size = 1000);
  void delete_object(const std::string& key);
  // Deletes every key that starts with `prefix`; returns how many.
  size_t delete_prefix(const std::string& prefix);

  // One HTTP request and its answer; defined in src/ckpt/s3_http.h (public for its helpers).
  struct Request;
  struct Response;

 private:
  std::string object_url(const std::string& key, const std::string& query) const;
  std::string bucket_url(const std::string& query) const;
  // Sends with retries; throws UserError unless the status is 2xx or in `accept`.
  Response send(Request& req, const std::vector<long>& accept = {});
  AwsCredentials credentials(bool force_refresh);  // in s3_credentials.cpp
  std::vector<std::string> list(const std::string& prefix, bool delimited, int page_size);
  PutResult put_multipart(const std::string& key, const char* data, size_t size);

  std::string bucket_;
  std::string region_;
  std::string endpoint_;  // "" = AWS virtual-hosted addressing
  S3Options opts_;
  std::mutex cred_mutex_;
  std::optional<AwsCredentials> creds_;
  std::atomic<bool> creds_from_imds_{false};  // read by send() outside the mutex
  struct HandlePool;
  std::unique_ptr<HandlePool> pool_;
};

}  // namespace jumbo
