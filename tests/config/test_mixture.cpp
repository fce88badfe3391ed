// data.train / data.valid as mixtures: Megatron's "0.6 data/web 0.4 data/books", a TOML array,
// --set for sweeps, and one clear line for every malformed list.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

using ::testing::HasSubstr;

std::string run_text(const std::string& data) {
  return R"(
[model]
layers = 2
d_model = 64
heads = 4
ffn = 256
vocab = 512
context = 32
[parallel]
micro_batch = 2
[train]
steps = 10
global_batch = 8
eval_every = 5
[data]
tokenizer = "tok.model"
)" + data + "\n";
}

RunConfig parse(const std::string& data, const std::vector<std::string>& sets = {},
                const std::string& base_dir = "") {
  return parse_run_config(run_text(data), "mix.toml", sets, base_dir);
}

std::string error_of(const std::string& data, const std::vector<std::string>& sets = {}) {
  try {
    parse(data, sets);
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for " << data;
  return "";
}

TEST(DataMixture, MegatronFormTomlArraysAndOnePrefix) {
  RunConfig c = parse("train = \"0.6 data/web 0.3 data/books 0.1 data/wiki\"\nvalid = \"v/web v/books\"");
  ASSERT_EQ(c.data.train.datasets.size(), 3u);
  EXPECT_EQ(c.data.train.datasets[0], (DatasetWeight{"data/web", 0.6}));
  EXPECT_EQ(c.data.train.datasets[2], (DatasetWeight{"data/wiki", 0.1}));
  EXPECT_EQ(c.data.train.describe(), "0.6 data/web 0.3 data/books 0.1 data/wiki");
  EXPECT_EQ(c.data.valid.datasets.size(), 2u);  // prefixes alone: equal weights
  EXPECT_EQ(c.data.valid.name(0), "web");
  EXPECT_EQ(c.data.valid.name(1), "books");

  c = parse("train = [3, \"data/web\", 1, \"data/books\"]\nvalid = [\"v/a\", \"v/b\"]");
  EXPECT_EQ(c.data.train.describe(), "3 data/web 1 data/books");
  EXPECT_EQ(c.data.valid.describe(), "1 v/a 1 v/b");

  c = parse("train = \"data/web\"\nvalid = \"v\"");
  EXPECT_EQ(c.data.train.describe(), "data/web");  // one dataset: just its prefix, as before

  // Relative prefixes of a file resolve against its directory, each one.
  c = parse("train = \"0.5 a 0.5 /abs/b\"\nvalid = \"v\"", {}, "/runs");
  EXPECT_EQ(c.data.train.describe(), "0.5 /runs/a 0.5 /abs/b");
}

TEST(DataMixture, SetOverridesForSweepsAndDescribeRoundTrips) {
  RunConfig c = parse("train = \"x\"\nvalid = \"v\"", {"data.train=0.7 data/web 0.3 data/code"});
  EXPECT_EQ(c.data.train.describe(), "0.7 data/web 0.3 data/code");
  c = parse("train = \"x\"\nvalid = \"v\"", {"data.train=[1, \"a\", 2, \"b\"]"});
  EXPECT_EQ(c.data.train.describe(), "1 a 2 b");
  // describe() writes TOML that reads back to the same mixture, spaces in paths included.
  c = parse("train = [0.25, \"my data/web\", 0.75, \"b\"]\nvalid = \"v\"");
  const std::string text = describe(c);
  EXPECT_THAT(text, HasSubstr("train = [0.25, \"my data/web\", 0.75, \"b\"]"));
  const RunConfig again = parse_run_config(text, "again.toml", {});
  EXPECT_EQ(again.data.train, c.data.train);
}

TEST(DataMixture, MalformedListsAreOneLineNamingTheKey) {
  EXPECT_THAT(error_of("train = \"0.6 data/web 0.4\"\nvalid = \"v\""),
              HasSubstr("data.train = \"0.6 data/web 0.4\" has 3 words: expected pairs"));
  EXPECT_THAT(error_of("train = \"data/web 0.4 data/books\"\nvalid = \"v\""),
              HasSubstr("mixes prefixes and weights"));
  EXPECT_THAT(error_of("train = \"0.6 0.4\"\nvalid = \"v\""),
              HasSubstr("is a number where a prefix was expected"));
  EXPECT_THAT(error_of("train = \"-1 data/web 2 data/books\"\nvalid = \"v\""),
              HasSubstr("dataset data/web has weight -1, expected a number > 0"));
  EXPECT_THAT(error_of("train = \"0 data/web 1 data/books\"\nvalid = \"v\""),
              HasSubstr("expected a number > 0"));
  EXPECT_THAT(error_of("train = [0.5, 3]\nvalid = \"v\""), HasSubstr("data.train = [ 0.5, 3 ]: expected"));
  EXPECT_THAT(error_of("train = 5\nvalid = \"v\""), HasSubstr("data.train = 5: expected a dataset prefix"));
  EXPECT_THAT(error_of("train = \"x\"\nvalid = \"a/web b/web\""),
              HasSubstr("a/web and b/web are both named web"));
  EXPECT_THAT(error_of("train = \"x\"\nvalid = \"v\"", {"data.train=0.5 a 0.5"}),
              HasSubstr("--set 'data.train=0.5 a 0.5': data.train = \"0.5 a 0.5\" has 3 words"));
}

}  // namespace
}  // namespace jumbo
