// The S3 backend. S3Fake*/S3Imds* talk to a tiny HTTP server in this process and always run;
// S3Server* need a real S3 API (tests/ckpt/s3.sh starts s3rver and sets the variables).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "jumbo/ckpt/s3_client.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

// Sets or unsets variables for one test and puts the old values back.
class EnvGuard {
 public:
  void set(const char* name, const std::string& value) {
    save(name);
    ::setenv(name, value.c_str(), 1);
  }
  void unset(const char* name) {
    save(name);
    ::unsetenv(name);
  }
  ~EnvGuard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  void save(const char* name) {
    const char* v = std::getenv(name);
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// HTTP/1.1 on 127.0.0.1, one request per connection, answered by `handler`.
class TinyServer {
 public:
  struct Request {
    std::string method, target;               // target: path and query as sent
    std::map<std::string, std::string> headers;  // names in lower case
    std::string body;
  };
  struct Response {
    int status = 200;
    std::string body;
    std::vector<std::string> headers = {};
  };
  using Handler = std::function<Response(const Request&)>;

  explicit TinyServer(Handler handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      handle(c);
      ::close(c);
    }
  }
  static bool read_more(int c, std::string& buf) {
    char tmp[65536];
    const ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<size_t>(n));
    return true;
  }
  static void send_all(int c, const std::string& s) {
    for (size_t off = 0; off < s.size();) {
      const ssize_t n = ::send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  void handle(int c) {
    std::string buf;
    size_t end;
    while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (!read_more(c, buf)) return;
    }
    Request req;
    size_t pos = buf.find("\r\n");
    const std::string first = buf.substr(0, pos);
    req.method = first.substr(0, first.find(' '));
    req.target = first.substr(first.find(' ') + 1, first.rfind(' ') - first.find(' ') - 1);
    while (pos < end) {
      const size_t next = buf.find("\r\n", pos + 2);
      const std::string line = buf.substr(pos + 2, next - pos - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& ch : name) ch = static_cast<char>(std::tolower(ch));
        req.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
      }
      pos = next;
    }
    const size_t length = req.headers.count("content-length")
                              ? std::stoul(req.headers["content-length"]) : 0;
    if (req.headers.count("expect")) send_all(c, "HTTP/1.1 100 Continue\r\n\r\n");
    req.body = buf.substr(end + 4);
    while (req.body.size() < length && read_more(c, req.body)) {
    }
    Response resp = handler_(req);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requests_.push_back(req);
    }
    std::string out = "HTTP/1.1 " + std::to_string(resp.status) + " X\r\nConnection: close\r\n" +
                      "Content-Length: " + std::to_string(resp.body.size()) + "\r\n";
    for (const auto& h : resp.headers) out += h + "\r\n";
    send_all(c, out + "\r\n" + resp.body);
  }

  Handler handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::vector<Request> requests_;
};

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

TEST(S3Storage, RejectsMalformedUrls) {
  for (const std::string url : {"s3://", "s3:///prefix", "s3://bad bucket/x"}) {
    try {
      open_s3_storage(url, S3Options{});
      ADD_FAILURE() << url << ": no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(url), std::string::npos) << e.what();
    }
  }
}

// ---- against a real S3 API (s3rver) ----

class S3ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* endpoint = std::getenv("JUMBO_TEST_S3_ENDPOINT");
    if (!endpoint || !*endpoint) {
      GTEST_SKIP() << "JUMBO_TEST_S3_ENDPOINT not set (tests/ckpt/s3.sh starts s3rver)";
    }
    opts_.endpoint = endpoint;
    opts_.max_attempts = 2;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = "s3://jumbo-test/run-" + std::to_string(::getpid()) + "/" + info->name();
  }
  std::unique_ptr<Storage> open() { return open_s3_storage(root_, opts_); }
  static std::string str(const std::optional<std::vector<char>>& v) {
    return v ? std::string(v->begin(), v->end()) : "<nullopt>";
  }
  S3Options opts_;
  std::string root_;
};

TEST_F(S3ServerTest, RoundTripsSmallObjects) {
  auto s = open();
  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  s->write("step_1/manifest.json", "{\"a\":1}", 7);
  s->write("step_1/empty", "", 0);
  s->write("step_1/bin", binary.data(), binary.size());
  s->write("odd name/a+b&c=d %.bin", "odd", 3);
  EXPECT_EQ(str(s->read("step_1/manifest.json")), "{\"a\":1}");
  EXPECT_EQ(str(s->read("step_1/empty")), "");
  EXPECT_EQ(str(s->read("step_1/bin")), binary);
  EXPECT_EQ(str(s->read("odd name/a+b&c=d %.bin")), "odd");
  s->write("step_1/manifest.json", "v2", 2);  // replaces
  EXPECT_EQ(str(s->read("step_1/manifest.json")), "v2");
  EXPECT_EQ(s->url("step_1/bin"), root_ + "/step_1/bin");
}

TEST_F(S3ServerTest, MultipartUploadOfTwelveMiB) {
  opts_.multipart_threshold = 5 << 20;
  opts_.part_size = 5 << 20;
  std::vector<char> data((12 << 20) + 123);
  uint32_t x = 12345;
  for (char& c : data) c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
  S3Client client("jumbo-test", opts_);
  const std::string key = root_.substr(std::string("s3://jumbo-test/").size()) + "/big.bin";
  EXPECT_EQ(client.put_object(key, data.data(), data.size()).parts, 3);
  const auto got = open()->read("big.bin");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->size(), data.size());
  EXPECT_TRUE(*got == data);
}

TEST_F(S3ServerTest, MissingKeyIsNullopt) {
  EXPECT_FALSE(open()->read("no/such/key"));
}

TEST_F(S3ServerTest, ListsDirectories) {
  auto s = open();
  // s3rver drops a common prefix whose objects all lie two levels down ("step_3/x/y"
  // alone), so every directory here also holds an object of its own.
  for (const char* k : {"step_2/a", "step_10/z", "step_10/x/y", "step_1/b", "step_1/c",
                        "top_file"}) {
    s->write(k, "x", 1);
  }
  EXPECT_EQ(s->list_dirs(""), (std::vector<std::string>{"step_1", "step_10", "step_2"}));
  EXPECT_EQ(s->list_dirs("step_10"), (std::vector<std::string>{"x"}));
  EXPECT_TRUE(s->list_dirs("none").empty());
}

TEST_F(S3ServerTest, ListsKeysAcrossPages) {
  auto s = open();
  for (int i = 0; i < 5; ++i) s->write("k/" + std::to_string(i), "x", 1);
  S3Client client("jumbo-test", opts_);
  const std::string prefix = root_.substr(std::string("s3://jumbo-test/").size()) + "/k/";
  EXPECT_EQ(client.list_keys(prefix, 2).size(), 5u);
}

TEST_F(S3ServerTest, RemovesAllUnderAPrefix) {
  auto s = open();
  for (const char* k : {"d/x", "d/y/z", "dd/keep"}) s->write(k, "x", 1);
  s->remove_all("d");
  EXPECT_FALSE(s->read("d/x"));
  EXPECT_FALSE(s->read("d/y/z"));
  EXPECT_EQ(str(s->read("dd/keep")), "x");
  EXPECT_EQ(s->list_dirs(""), (std::vector<std::string>{"dd"}));
}

TEST_F(S3ServerTest, WritesFromSeveralThreadsAtOnce) {
  opts_.multipart_threshold = opts_.part_size = 5 << 20;
  auto s = open();
  const std::vector<char> big((6 << 20) + 1, 'b');  // multipart, in the background
  std::thread background([&] { s->write("bg/big", big.data(), big.size()); });
  std::vector<std::thread> small;
  for (int t = 0; t < 3; ++t) {
    small.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        std::string key = "t";  // piecewise: GCC 12 warns falsely (-Wrestrict) on "t" + ...
        key += std::to_string(t) + '/' + std::to_string(i);
        s->write(key, key.data(), key.size());
      }
    });
  }
  for (auto& t : small) t.join();
  background.join();
  EXPECT_EQ(str(s->read("t2/4")), "t2/4");
  EXPECT_EQ(s->read("bg/big")->size(), big.size());
  EXPECT_EQ(s->list_dirs("").size(), 4u);
}

TEST_F(S3ServerTest, MissingBucketIsAClearError) {
  EnvGuard env;
  env.set("AWS_SECRET_ACCESS_KEY", "secret-XYZ-123");  // s3rver does not check V4 secrets
  auto s = open_s3_storage("s3://no-such-bucket-jumbo/ckpt", opts_);
  for (int op = 0; op < 2; ++op) {
    try {
      if (op == 0) s->write("a", "x", 1);
      else s->read("a");
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("s3://no-such-bucket-jumbo/ckpt/a"), std::string::npos) << msg;
      EXPECT_NE(msg.find("NoSuchBucket"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("secret-XYZ-123"), std::string::npos) << msg;
    }
  }
}

TEST_F(S3ServerTest, UnknownAccessKeyIsAClearError) {
  EnvGuard env;
  env.set("AWS_ACCESS_KEY_ID", "NOT-A-KEY");
  env.set("AWS_SECRET_ACCESS_KEY", "secret-XYZ-123");
  try {
    open()->write("a", "x", 1);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("HTTP 403 InvalidAccessKeyId"), std::string::npos) << msg;
    EXPECT_NE(msg.find(root_ + "/a"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("secret-XYZ-123"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace jumbo
