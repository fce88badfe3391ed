// Where S3Client's credentials come from: the AWS environment variables, else an EC2
// instance role through the metadata service (IMDSv2), fetched again before they expire.
#include "jumbo/ckpt/s3_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "jumbo/config/config.h"
#include "s3_http.h"
#include "s3_xml.h"

namespace jumbo {

using namespace s3;

namespace {

using Clock = std::chrono::system_clock;

Clock::time_point parse_iso8601(const std::string& s) {
  std::tm tm{};
  if (std::sscanf(s.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6) {
    return Clock::now() + std::chrono::minutes(15);  // unknown: look again soon
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return Clock::from_time_t(timegm(&tm));
}

}  // namespace

std::optional<AwsCredentials> fetch_imds_credentials(const std::string& endpoint,
                                                     std::string* why) {
  global_init();
  std::unique_ptr<CURL, void (*)(CURL*)> h(curl_easy_init(), curl_easy_cleanup);
  const std::string base = strip_slash(endpoint);
  auto call = [&](const std::string& method, const std::string& path,
                  const std::string& header) {
    HttpCall c{method, base + path, "", {header}};
    c.connect_timeout_ms = 1000;
    c.timeout_ms = 3000;
    Transfer t;
    perform(h.get(), c, nullptr, "", t);
    return t;
  };
  Transfer t = call("PUT", "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 21600");
  if (t.rc != CURLE_OK) {
    *why = "no EC2 metadata service (" + t.error + ")";
    return std::nullopt;
  }
  if (t.status != 200) {
    *why = fmt::format("the EC2 metadata service answered HTTP {} to the token request", t.status);
    return std::nullopt;
  }
  const std::string token_header = "X-aws-ec2-metadata-token: " + std::string(t.text());
  const std::string roles_path = "/latest/meta-data/iam/security-credentials/";
  t = call("GET", roles_path, token_header);
  std::string role(t.text().substr(0, t.text().find('\n')));
  while (!role.empty() && (role.back() == '\r' || role.back() == ' ')) role.pop_back();
  if (t.rc != CURLE_OK || t.status != 200 || role.empty()) {
    *why = t.rc != CURLE_OK ? "the EC2 metadata service did not answer (" + t.error + ")"
                            : "no IAM role is attached to this instance";
    return std::nullopt;
  }
  t = call("GET", roles_path + uri_encode(role, false), token_header);
  if (t.rc != CURLE_OK || t.status != 200) {
    *why = fmt::format("the EC2 metadata service gave no credentials for role {}", role);
    return std::nullopt;
  }
  const auto j = nlohmann::json::parse(t.text(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("AccessKeyId") || !j.contains("SecretAccessKey") ||
      !j["AccessKeyId"].is_string() || !j["SecretAccessKey"].is_string()) {
    *why = fmt::format("the EC2 metadata service gave unreadable credentials for role {}", role);
    return std::nullopt;
  }
  AwsCredentials c;
  c.access_key = j["AccessKeyId"].get<std::string>();
  c.secret_key = j["SecretAccessKey"].get<std::string>();
  c.session_token = j.value("Token", std::string());
  c.expiration = parse_iso8601(j.value("Expiration", std::string()));
  return c;
}

AwsCredentials S3Client::credentials(bool force_refresh) {
  std::lock_guard<std::mutex> lock(cred_mutex_);
  const auto now = Clock::now();
  // Refresh instance-role credentials well before they expire (AWS rotates them >= 5 min early).
  if (creds_ && !force_refresh && now + std::chrono::minutes(5) < creds_->expiration) {
    return *creds_;
  }
  const std::string key = env("AWS_ACCESS_KEY_ID"), secret = env("AWS_SECRET_ACCESS_KEY");
  if (!key.empty() && !secret.empty()) {
    creds_ = AwsCredentials{key, secret, env("AWS_SESSION_TOKEN")};
    return *creds_;
  }
  if (!key.empty() || !secret.empty()) {
    throw UserError(fmt::format("s3://{}: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be "
                                "set together (only {} is set)", bucket_,
                                key.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID"));
  }
  std::string disabled = env("AWS_EC2_METADATA_DISABLED");
  std::transform(disabled.begin(), disabled.end(), disabled.begin(), ::tolower);
  if (disabled == "true") {
    throw UserError(fmt::format("s3://{}: no AWS credentials: set AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY (the EC2 metadata service is off: "
                                "AWS_EC2_METADATA_DISABLED=true)", bucket_));
  }
  std::string endpoint = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (endpoint.empty()) endpoint = "http://169.254.169.254";
  std::string why;
  auto fetched = fetch_imds_credentials(endpoint, &why);
  if (!fetched) {
    if (creds_ && now < creds_->expiration) return *creds_;  // still valid: try again later
    throw UserError(fmt::format("s3://{}: no AWS credentials: set AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY or use an EC2 instance role ({} at {})",
                                bucket_, why, endpoint));
  }
  creds_ = std::move(*fetched);
  creds_from_imds_ = true;
  return *creds_;
}

}  // namespace jumbo
