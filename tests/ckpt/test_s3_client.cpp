// The S3 client against a tiny HTTP server in this process (always run): the EC2 metadata
// service, signing headers, retries, multipart uploads and listing. s3_storage_test.cpp
// has the tests against a real S3 API.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <string>
#include <vector>

#include "jumbo/ckpt/s3_client.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/config/config.h"
#include "ckpt_test_support.h"

namespace jumbo {
namespace {

using test::EnvGuard;
using test::TinyServer;

std::string s3_error(const std::string& code, const std::string& message) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + code + "</Code><Message>" +
         message + "</Message><RequestId>1</RequestId></Error>";
}

std::string iso8601(std::time_t t) {
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// An EC2 metadata service: IMDSv2 token, one role, credentials expiring at `expires`.
TinyServer::Response imds(const TinyServer::Request& r, std::time_t expires) {
  if (r.method == "PUT" && r.target == "/latest/api/token") {
    if (r.headers.count("x-aws-ec2-metadata-token-ttl-seconds") == 0) return {400, "no ttl"};
    return {200, "TOKEN-1"};
  }
  const auto token = r.headers.find("x-aws-ec2-metadata-token");
  if (token == r.headers.end() || token->second != "TOKEN-1") return {401, ""};
  if (r.target == "/latest/meta-data/iam/security-credentials/") return {200, "jumbo-role\n"};
  if (r.target == "/latest/meta-data/iam/security-credentials/jumbo-role") {
    return {200, "{\"Code\":\"Success\",\"AccessKeyId\":\"ASIAFAKE\",\"SecretAccessKey\":"
                 "\"imds-secret-XYZ\",\"Token\":\"imds-token-XYZ\",\"Expiration\":\"" +
                     iso8601(expires) + "\"}"};
  }
  return {404, ""};
}

TEST(S3Imds, FetchesRoleCredentials) {
  const std::time_t expires = std::time(nullptr) + 3600;
  TinyServer server([&](const TinyServer::Request& r) { return imds(r, expires); });
  std::string why;
  const auto c = fetch_imds_credentials(server.url(), &why);
  ASSERT_TRUE(c) << why;
  EXPECT_EQ(c->access_key, "ASIAFAKE");
  EXPECT_EQ(c->secret_key, "imds-secret-XYZ");
  EXPECT_EQ(c->session_token, "imds-token-XYZ");
  EXPECT_EQ(std::chrono::system_clock::to_time_t(c->expiration), expires);
  EXPECT_EQ(server.requests().size(), 3u);
}

TEST(S3Imds, NoServiceGivesAReason) {
  std::string url;
  { TinyServer gone([](const TinyServer::Request&) { return TinyServer::Response{200, ""}; });
    url = gone.url(); }  // closed again: nothing listens there
  std::string why;
  EXPECT_FALSE(fetch_imds_credentials(url, &why));
  EXPECT_NE(why.find("no EC2 metadata service"), std::string::npos) << why;
}

// A client of a fake S3 at `server`, with key/secret from the environment.
struct FakeS3 {
  EnvGuard env;
  explicit FakeS3(int attempts = 3) {
    env.set("AWS_ACCESS_KEY_ID", "AKIDFAKE");
    env.set("AWS_SECRET_ACCESS_KEY", "env-secret-XYZ");
    env.unset("AWS_SESSION_TOKEN");
    opts.region = "eu-west-3";
    opts.max_attempts = attempts;
  }
  S3Options opts;
};

TEST(S3Fake, SignsWithImdsCredentialsAndRefreshesThem) {
  // Expiring within the 5-minute margin: every request must fetch them again.
  const std::time_t expires = std::time(nullptr) + 120;
  TinyServer server([&](const TinyServer::Request& r) {
    if (r.target.rfind("/latest/", 0) == 0) return imds(r, expires);
    return TinyServer::Response{200, "hello"};
  });
  EnvGuard env;
  for (const char* v : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                        "AWS_EC2_METADATA_DISABLED"}) {
    env.unset(v);
  }
  env.set("AWS_EC2_METADATA_SERVICE_ENDPOINT", server.url());
  S3Options opts;
  opts.endpoint = server.url();
  opts.region = "eu-west-3";
  S3Client client("bkt", opts);
  for (int i = 0; i < 2; ++i) {
    const auto got = client.get_object("dir one/a+b.bin");
    ASSERT_TRUE(got);
    EXPECT_EQ(std::string(got->begin(), got->end()), "hello");
  }
  int role_fetches = 0;
  std::vector<TinyServer::Request> gets;
  for (const auto& r : server.requests()) {
    if (r.target == "/latest/meta-data/iam/security-credentials/jumbo-role") ++role_fetches;
    if (r.target.rfind("/bkt/", 0) == 0) gets.push_back(r);
  }
  EXPECT_EQ(role_fetches, 2);
  ASSERT_EQ(gets.size(), 2u);
  const auto& g = gets[0];
  EXPECT_EQ(g.target, "/bkt/dir%20one/a%2Bb.bin");
  EXPECT_EQ(g.headers.at("x-amz-content-sha256"), "UNSIGNED-PAYLOAD");
  EXPECT_EQ(g.headers.at("x-amz-security-token"), "imds-token-XYZ");
  const std::string auth = g.headers.at("authorization");
  EXPECT_EQ(auth.rfind("AWS4-HMAC-SHA256 Credential=ASIAFAKE/", 0), 0u) << auth;
  EXPECT_NE(auth.find("/eu-west-3/s3/aws4_request"), std::string::npos) << auth;
  EXPECT_NE(auth.find("x-amz-security-token"), std::string::npos) << auth;
}

TEST(S3Fake, RetriesSlowDownThenSucceeds) {
  FakeS3 fake(5);
  std::atomic<int> calls{0};
  TinyServer server([&](const TinyServer::Request&) {
    if (++calls <= 2) return TinyServer::Response{503, s3_error("SlowDown", "Reduce rate")};
    return TinyServer::Response{200, "ok"};
  });
  fake.opts.endpoint = server.url();
  S3Client client("bkt", fake.opts);
  const auto got = client.get_object("k");
  ASSERT_TRUE(got);
  EXPECT_EQ(std::string(got->begin(), got->end()), "ok");
  EXPECT_EQ(calls.load(), 3);
}

TEST(S3Fake, GivesUpAfterMaxAttempts) {
  FakeS3 fake(2);
  TinyServer server([](const TinyServer::Request&) {
    return TinyServer::Response{500, s3_error("InternalError", "Try again")};
  });
  fake.opts.endpoint = server.url();
  S3Client client("bkt", fake.opts);
  const std::string data = "abc";
  try {
    client.put_object("a/k", data.data(), data.size());
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("S3 PUT s3://bkt/a/k: HTTP 500 InternalError: Try again"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("after 2 attempts"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("env-secret-XYZ"), std::string::npos) << msg;
  }
  EXPECT_EQ(server.requests().size(), 2u);
}

TEST(S3Fake, ClientErrorFailsAtOnceInOneLine) {
  FakeS3 fake(5);
  fake.env.set("AWS_SESSION_TOKEN", "env-token-XYZ");
  TinyServer server([](const TinyServer::Request&) {
    return TinyServer::Response{403, s3_error("AccessDenied", "Access &amp; more\ndenied")};
  });
  fake.opts.endpoint = server.url();
  S3Client client("bkt", fake.opts);
  try {
    client.get_object("k");
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("S3 GET s3://bkt/k: HTTP 403 AccessDenied: Access & more denied"),
              std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const char* secret : {"env-secret-XYZ", "env-token-XYZ", "AKIDFAKE", "AWS4-HMAC"}) {
      EXPECT_EQ(msg.find(secret), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(server.requests().size(), 1u);
}

// A fake multipart upload; parts numbered from `fail_part` on are refused.
TinyServer::Response multipart(const TinyServer::Request& r, int fail_part) {
  if (r.method == "POST" && r.target == "/bkt/big?uploads=") {
    return {200, "<InitiateMultipartUploadResult><UploadId>up/1</UploadId>"
                 "</InitiateMultipartUploadResult>"};
  }
  const size_t n = r.target.find("partNumber=");
  if (r.method == "PUT" && n != std::string::npos) {
    const int part = std::stoi(r.target.substr(n + 11));
    if (part >= fail_part) return {400, s3_error("InvalidArgument", "no")};
    return {200, "", {"ETag: \"e" + std::to_string(part) + "\""}};
  }
  if (r.method == "POST") {
    return {200, "<CompleteMultipartUploadResult><ETag>&quot;x-3&quot;</ETag>"
                 "</CompleteMultipartUploadResult>"};
  }
  return {204, ""};
}

TEST(S3Fake, MultipartUploadSendsPartsAndCompletes) {
  FakeS3 fake;
  TinyServer server([](const TinyServer::Request& r) { return multipart(r, 99); });
  fake.opts.endpoint = server.url();
  fake.opts.multipart_threshold = fake.opts.part_size = 5;
  S3Client client("bkt", fake.opts);
  const std::string data = "abcdefghijkl";
  const auto put = client.put_object("big", data.data(), data.size());
  EXPECT_EQ(put.parts, 3);
  EXPECT_EQ(put.etag, "\"x-3\"");
  const auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 5u);
  EXPECT_EQ(reqs[1].target, "/bkt/big?partNumber=1&uploadId=up%2F1");
  EXPECT_EQ(reqs[1].body + reqs[2].body + reqs[3].body, data);
  EXPECT_EQ(reqs[4].target, "/bkt/big?uploadId=up%2F1");
  EXPECT_EQ(reqs[4].body, "<CompleteMultipartUpload>"
                          "<Part><PartNumber>1</PartNumber><ETag>\"e1\"</ETag></Part>"
                          "<Part><PartNumber>2</PartNumber><ETag>\"e2\"</ETag></Part>"
                          "<Part><PartNumber>3</PartNumber><ETag>\"e3\"</ETag></Part>"
                          "</CompleteMultipartUpload>");
}

TEST(S3Fake, MultipartUploadAbortsOnFailure) {
  FakeS3 fake;
  TinyServer server([](const TinyServer::Request& r) { return multipart(r, 2); });
  fake.opts.endpoint = server.url();
  fake.opts.multipart_threshold = fake.opts.part_size = 5;
  S3Client client("bkt", fake.opts);
  const std::string data = "abcdefghijkl";
  EXPECT_THROW(client.put_object("big", data.data(), data.size()), UserError);
  const auto reqs = server.requests();
  ASSERT_FALSE(reqs.empty());
  EXPECT_EQ(reqs.back().method, "DELETE");
  EXPECT_EQ(reqs.back().target, "/bkt/big?uploadId=up%2F1");
}

TEST(S3Fake, ListingFollowsContinuationAndUnescapesKeys) {
  FakeS3 fake;
  TinyServer server([](const TinyServer::Request& r) {
    const std::string head = "<ListBucketResult><Name>bkt</Name><Prefix>p/</Prefix>";
    if (r.target.find("continuation-token=") == std::string::npos) {
      return TinyServer::Response{
          200, head + "<Contents><Key>p/a&amp;b &lt;1&gt;</Key><Size>1</Size></Contents>"
                      "<IsTruncated>true</IsTruncated>"
                      "<NextContinuationToken>t/+=</NextContinuationToken></ListBucketResult>"};
    }
    return TinyServer::Response{200, head + "<Contents><Key>p/c&#233;</Key></Contents>"
                                            "<IsTruncated>false</IsTruncated></ListBucketResult>"};
  });
  fake.opts.endpoint = server.url();
  S3Client client("bkt", fake.opts);
  const auto keys = client.list_keys("p/");
  EXPECT_EQ(keys, (std::vector<std::string>{"p/a&b <1>", "p/c\xC3\xA9"}));
  const auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 2u);
  // Already canonical (sorted names, encoded values): libcurl 7.88 signs it as written.
  EXPECT_EQ(reqs[0].target, "/bkt?list-type=2&prefix=p%2F");
  EXPECT_EQ(reqs[1].target, "/bkt?continuation-token=t%2F%2B%3D&list-type=2&prefix=p%2F");
}

}  // namespace
}  // namespace jumbo
