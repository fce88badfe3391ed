// Loading run configs from files: presets and their precedence, --set overrides, and the
// one-line UserError for each kind of mistake in a file or an override.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A fresh directory per test for config files, removed afterwards.
class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("jumbo-config-") + std::to_string(getpid()) + "-" + test->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) const {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

 private:
  fs::path dir_;
};

// The message of the UserError `load` throws; fails the test if it throws nothing.
std::string error_of(const std::function<void()>& load) {
  try {
    load();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

void expect_error(const std::function<void()>& load, std::initializer_list<std::string> parts) {
  const std::string message = error_of(load);
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
}

// A complete run with the model written out (no preset).
const std::string kSections = R"(
[parallel]
micro_batch = 2
[train]
steps = 10
global_batch = 8
lr = 1e-3
min_lr = 1e-4
[data]
train = "corpus/train"
tokenizer = "corpus/tok.model"
)";
const std::string kModel = R"(
[model]
layers = 2
d_model = 64
heads = 4
vocab = 512
context = 32
)";

TEST_F(ConfigFiles, ReadsEveryKindOfValue) {
  const std::string path = write("run.toml", kModel + kSections + R"(
[checkpoint]
dir = "ckpt"
[log]
peak_tflops = 312     # integers are fine where floats are expected
every = 1e2           # integral floats are fine where integers are expected
)");
  const RunConfig cfg = load_run_config(path, {});
  EXPECT_EQ(cfg.source, path);
  EXPECT_EQ(cfg.model.preset, "");
  EXPECT_EQ(cfg.model.name, "custom");
  EXPECT_EQ(cfg.model.ffn_dim(), 256);  // ffn = 0: 4 x d_model
  EXPECT_DOUBLE_EQ(cfg.log.peak_tflops, 312.0);
  EXPECT_EQ(cfg.log.every, 100);
  EXPECT_EQ(cfg.checkpoint.dir, "ckpt");
  EXPECT_DOUBLE_EQ(cfg.train.lr, 1e-3);
  EXPECT_EQ(cfg.train.warmup_tokens, 375'000'000);  // GPT-3 default kept
}

TEST_F(ConfigFiles, PresetThenRunFileThenOverrides) {
  const std::string preset = write("tiny.toml", R"(
name = "tiny"
layers = 2
d_model = 64
heads = 4
ffn = 256
vocab = 512
context = 32
)");
  const std::string other = write("wide.toml", "[model]\nname = \"wide\"\nlayers = 1\n"
                                               "d_model = 128\nheads = 8\nvocab = 1000\n"
                                               "context = 16\n");
  const std::string run = write("run.toml", "[model]\npreset = \"" + preset +
                                                "\"\nlayers = 3\nheads = 8\n" + kSections);
  const RunConfig file_only = load_run_config(run, {});
  EXPECT_EQ(file_only.model.preset, preset);
  EXPECT_EQ(file_only.model.name, "tiny");     // preset
  EXPECT_EQ(file_only.model.d_model, 64);      // preset
  EXPECT_EQ(file_only.model.layers, 3);        // run file beats preset
  EXPECT_EQ(file_only.model.heads, 8);         // run file beats preset

  const RunConfig with_set = load_run_config(run, {"model.heads=2", "model.vocab=640"});
  EXPECT_EQ(with_set.model.heads, 2);          // --set beats run file
  EXPECT_EQ(with_set.model.vocab, 640);        // --set beats preset
  EXPECT_EQ(with_set.model.layers, 3);

  // --set model.preset switches the preset; run-file keys still win over it.
  const RunConfig switched = load_run_config(run, {"model.preset=" + other});
  EXPECT_EQ(switched.model.preset, other);
  EXPECT_EQ(switched.model.name, "wide");
  EXPECT_EQ(switched.model.d_model, 128);
  EXPECT_EQ(switched.model.vocab, 1000);
  EXPECT_EQ(switched.model.layers, 3);

  // The last of several overrides of one key wins.
  EXPECT_EQ(load_run_config(run, {"train.steps=5", "train.steps=7"}).train.steps, 7);
}

TEST_F(ConfigFiles, OverrideValuesAreTomlOrBareStrings) {
  const std::string run = write("run.toml", kModel + kSections);
  const RunConfig cfg = load_run_config(
      run, {"train.precision=bf16", "data.train=build/x", "train.lr=1e-4", "train.steps=1_000",
            "train.global_batch=1e2", "checkpoint.dir=2024", "data.valid=\"a b\"",
            "log.metrics_file=", "train.seed=7", "model.name=true"});
  EXPECT_EQ(cfg.train.precision, Precision::bf16);
  EXPECT_EQ(cfg.data.train.describe(), "build/x");
  EXPECT_DOUBLE_EQ(cfg.train.lr, 1e-4);
  EXPECT_EQ(cfg.train.steps, 1000);
  EXPECT_EQ(cfg.train.global_batch, 100);
  EXPECT_EQ(cfg.checkpoint.dir, "2024");  // text keys keep text that looks like a number
  EXPECT_EQ(cfg.data.valid.describe(), "1 a 1 b");  // two sets, equal weights
  EXPECT_EQ(cfg.log.metrics_file, "");
  EXPECT_EQ(cfg.train.seed, 7u);
  EXPECT_EQ(cfg.model.name, "true");
}

TEST_F(ConfigFiles, PresetUnderAModelTable) {
  const std::string preset = write("p.toml", std::string(kModel) + "name = \"tabled\"\n");
  const ModelConfig m = load_model_config(preset);
  EXPECT_EQ(m.name, "tabled");
  EXPECT_EQ(m.d_model, 64);
}

TEST_F(ConfigFiles, DescribeReadsBackAsTheSameConfig) {
  const std::string run = write("run.toml", kModel + kSections);
  const RunConfig cfg = load_run_config(
      run, {"model.name=x\"y", "model.ffn=128", "model.vocab_multiple=64", "parallel.tp=2",
            "parallel.pp=2", "train.warmup_tokens=1000", "train.decay_tokens=5000",
            "train.rampup_start_batch=4", "train.rampup_tokens=100", "train.weight_decay=0.0",
            "train.beta1=0.8", "train.beta2=0.99", "train.eps=1e-6", "train.grad_clip=0.5",
            "train.seed=99", "train.precision=bf16", "train.eval_every=3",
            "train.eval_batches=2", "train.threads=1", "data.valid=v", "checkpoint.dir=c",
            "log.metrics_file=m.jsonl", "log.every=5", "log.peak_tflops=1.5"});
  const std::string text = describe(cfg);
  const RunConfig back = parse_run_config(text, cfg.source, {});
  EXPECT_EQ(describe(back), text);
  EXPECT_EQ(back.model.name, "x\"y");
  EXPECT_EQ(back.train.precision, Precision::bf16);
  EXPECT_DOUBLE_EQ(back.train.eps, 1e-6);
  EXPECT_DOUBLE_EQ(back.train.weight_decay, 0.0);
  EXPECT_THAT(text, HasSubstr("peak_tflops = 1.5\n"));
  EXPECT_THAT(text, HasSubstr("weight_decay = 0.0\n"));
}

// ---- mistakes in files ----

TEST_F(ConfigFiles, UnknownKeyListsTheKnownKeys) {
  const std::string run = write("run.toml", kModel + kSections + "[log]\nevry = 5\n");
  expect_error([&] { load_run_config(run, {}); },
               {run + ": unknown key log.evry", "known keys of [log]: metrics_file, every, "
                                                "peak_tflops",
                "(line "});
}

TEST_F(ConfigFiles, UnknownSection) {
  const std::string run = write("run.toml", kModel + kSections + "[optimizer]\nlr = 1\n");
  expect_error([&] { load_run_config(run, {}); },
               {run, "unknown section [optimizer]", "known sections: model, parallel, train"});
}

TEST_F(ConfigFiles, KeyOutsideAnySectionOrSectionNotATable) {
  const std::string loose = write("loose.toml", "lr = 0.1\n" + kModel + kSections);
  expect_error([&] { load_run_config(loose, {}); }, {loose, "lr = 0.1", "outside any section"});
  const std::string flat = write("flat.toml", "log = 5\n" + kModel + kSections);
  expect_error([&] { load_run_config(flat, {}); }, {flat, "log = 5", "expected a section [log]"});
}

TEST_F(ConfigFiles, WrongTypeNamesKeyAndValue) {
  std::string text = kModel + kSections;
  text.replace(text.find("lr = 1e-3"), 9, "lr = \"abc\"");
  const std::string run = write("run.toml", text);
  expect_error([&] { load_run_config(run, {}); },
               {run + ": train.lr = \"abc\": expected a number"});
  const std::string arr = write("arr.toml", kModel + kSections + "[log]\nevery = [1, 2]\n");
  expect_error([&] { load_run_config(arr, {}); }, {arr + ": log.every = ", "expected an integer"});
}

TEST_F(ConfigFiles, FractionalFloatForAnInteger) {
  std::string text = kModel + kSections;
  text.replace(text.find("steps = 10"), 10, "steps = 1.5");
  const std::string run = write("run.toml", text);
  expect_error([&] { load_run_config(run, {}); },
               {run + ": train.steps = 1.5: expected an integer"});
}

TEST_F(ConfigFiles, BadPrecision) {
  const std::string run = write("run.toml", kModel + kSections);
  expect_error([&] { load_run_config(run, {"train.precision=fp16"}); },
               {"--set 'train.precision=fp16'", "train.precision = \"fp16\"",
                "expected \"fp32\" or \"bf16\""});
}

// Keys whose values are names are parsed into enums: a bad name is an error at once.
TEST_F(ConfigFiles, BadRecomputeAndDevice) {
  const std::string run = write("run.toml", kModel + kSections);
  expect_error([&] { load_run_config(run, {"parallel.recompute=some"}); },
               {"--set 'parallel.recompute=some'", "parallel.recompute = \"some\"",
                "expected \"none\", \"selective\" or \"full\""});
  expect_error([&] { load_run_config(run, {"train.device=tpu"}); },
               {"train.device = \"tpu\"", "expected \"cpu\" or \"cuda\""});
  const RunConfig cfg =
      load_run_config(run, {"parallel.recompute=selective", "train.device=cuda"});
  EXPECT_EQ(cfg.parallel.recompute, Recompute::selective);
  EXPECT_EQ(cfg.parallel.device, Device::cuda);
}

TEST_F(ConfigFiles, NegativeSeed) {
  const std::string run = write("run.toml", kModel + kSections);
  expect_error([&] { load_run_config(run, {"train.seed=-1"}); },
               {"train.seed = -1", "non-negative integer"});
}

TEST_F(ConfigFiles, SyntaxErrorGivesFileLineAndColumn) {
  const std::string run = write("run.toml", "[train]\nsteps = 10\nlr = = 1\n");
  expect_error([&] { load_run_config(run, {}); }, {run + ":3:", "TOML syntax error"});
  const std::string twice = write("twice.toml", "[train]\nsteps = 10\nsteps = 11\n");
  expect_error([&] { load_run_config(twice, {}); }, {twice + ":3:", "steps"});
}

TEST_F(ConfigFiles, MissingRunFile) {
  expect_error([&] { load_run_config("no/such/run.toml", {}); },
               {"no/such/run.toml: cannot open the run config file"});
}

// ---- presets ----

TEST_F(ConfigFiles, MissingPresetNamesKeyAndPath) {
  const std::string run =
      write("run.toml", "[model]\npreset = \"models/nope.toml\"\n" + kSections);
  expect_error([&] { load_run_config(run, {}); },
               {run + ": model.preset = \"models/nope.toml\": no such preset file"});
  const std::string good = write("good.toml", kModel + kSections);
  expect_error([&] { load_run_config(good, {"model.preset=gone.toml"}); },
               {"--set 'model.preset=gone.toml': model.preset = \"gone.toml\""});
  expect_error([&] { load_model_config("gone.toml"); }, {"gone.toml: cannot open"});
}

TEST_F(ConfigFiles, MistakesInsideAPresetNameThePreset) {
  const std::string preset = write("p.toml", "layers = 2\nd_model = 64\nwidth = 3\n");
  expect_error([&] { load_model_config(preset); },
               {preset + ": unknown key model.width", "known keys of [model]: name, layers"});
  const std::string nested = write("n.toml", "preset = \"p.toml\"\n");
  expect_error([&] { load_model_config(nested); }, {nested, "unknown key model.preset"});
  const std::string bad = write("bad.toml", "layers = 2\nd_model = 64\nheads = 5\nvocab = 9\n"
                                            "context = 4\n");
  expect_error([&] { load_model_config(bad); },
               {bad + ": model.heads = 5 does not divide model.d_model = 64"});
}

// ---- mistakes in overrides ----

TEST_F(ConfigFiles, MalformedOverride) {
  const std::string run = write("run.toml", kModel + kSections);
  for (const std::string bad : {"trainlr=1", "train.lr", ".lr=1", "train.=1", "a.b.c=1"})
    expect_error([&] { load_run_config(run, {bad}); },
                 {"--set '" + bad + "': expected section.key=value"});
}

TEST_F(ConfigFiles, UnknownOverrideKeyOrSection) {
  const std::string run = write("run.toml", kModel + kSections);
  expect_error([&] { load_run_config(run, {"train.lrr=1"}); },
               {"--set 'train.lrr=1': unknown key train.lrr", "known keys of [train]: steps"});
  expect_error([&] { load_run_config(run, {"optim.lr=1"}); },
               {"--set 'optim.lr=1': unknown section [optim]"});
}

TEST_F(ConfigFiles, OverrideOfWrongType) {
  const std::string run = write("run.toml", kModel + kSections);
  expect_error([&] { load_run_config(run, {"train.lr=abc"}); },
               {"--set 'train.lr=abc': train.lr = \"abc\": expected a number"});
  expect_error([&] { load_run_config(run, {"train.steps=2.5"}); },
               {"--set 'train.steps=2.5': train.steps = 2.5: expected an integer"});
  expect_error([&] { load_run_config(run, {"train.lr=nan"}); }, {run, "train.lr = nan"});
}

}  // namespace
}  // namespace jumbo
