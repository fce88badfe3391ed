// The request parser against hostile bodies: nesting far deeper than any OpenAI body, values
// quoted back in errors at a bounded size, integral floats as integers.
#include <gtest/gtest.h>

#include <string>

#include "request_body.h"

namespace jumbo::serve {
namespace {

ApiError error_of(const std::string& body) {
  try {
    parse_body(body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body.substr(0, 80);
  return ApiError(0, "", "");
}

TEST(RequestBody, RefusesDeepNestingBeforeParsing) {
  const std::string deep = "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const ApiError e = error_of(deep);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("more than 32 deep"), std::string::npos);
  // Brackets inside strings are text, not nesting.
  EXPECT_NO_THROW(parse_body("{\"prompt\": \"" + std::string(1000, '[') + "\"}"));
  EXPECT_NO_THROW(parse_body("{\"a\": \"\\\"[[[\", \"b\": [[[[1]]]]}"));
  std::string ok = "{\"a\": ";
  for (int i = 0; i < 31; ++i) ok += "[";
  for (int i = 0; i < 31; ++i) ok += "]";
  EXPECT_NO_THROW(parse_body(ok + "}"));
}

TEST(RequestBody, BadJsonAndNonObjectsAreTheBodysFault) {
  EXPECT_EQ(error_of("{\"a\": ").param, "");
  EXPECT_NE(std::string(error_of("[1]").what()).find("not a JSON object"), std::string::npos);
  EXPECT_NE(std::string(error_of("\xff\xfe").what()).find("not valid JSON"), std::string::npos);
  EXPECT_NE(std::string(error_of("").what()).find("not valid JSON"), std::string::npos);
}

TEST(RequestBody, QuotesAreBounded) {
  EXPECT_EQ(quote(json("short")), "\"short\"");
  EXPECT_LT(quote(json(std::string(1 << 20, 'x'))).size(), 120u);
  EXPECT_EQ(quote(json::array({1, 2, 3})), "an array of 3 items");
  EXPECT_EQ(quote(json::object({{"a", 1}})), "an object of 1 keys");
  EXPECT_EQ(quote(json(5)), "5");
}

TEST(RequestBody, IntegralFloatsAreIntegers) {
  const json body = json::parse(R"({"a": 5.0, "b": 4.5, "c": 1e300, "d": true})");
  EXPECT_EQ(integer_in(body, "a", 0, 0, 10), 5);
  EXPECT_THROW(integer_in(body, "b", 0, 0, 10), ApiError);
  EXPECT_THROW(integer_in(body, "c", 0, 0, 10), ApiError);
  EXPECT_THROW(integer_in(body, "d", 0, 0, 10), ApiError);
  EXPECT_EQ(integer_in(body, "missing", 7, 0, 10), 7);
  try {
    integer_in(body, "a", 0, 6, 10);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "a");
    EXPECT_STREQ(e.what(), "a: 5 is not in 6 .. 10");
  }
}

}  // namespace
}  // namespace jumbo::serve
