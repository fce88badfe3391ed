// The S3 storage backend. S3Server* need a real S3 API (tests/ckpt/s3.sh starts s3rver and
// sets the variables) and skip without one; s3_client_test.cpp has the S3Fake*/S3Imds*
// tests against a tiny HTTP server in this process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "jumbo/ckpt/s3_client.h"
#include "jumbo/ckpt/storage.h"
#include "jumbo/config/config.h"
#include "ckpt_test_support.h"

namespace jumbo {
namespace {

using test::EnvGuard;

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
