// The trainer end to end on real Brown text: a tokenizer and datasets made by the data part,
// a tiny GPT, and the run config machinery.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../data/data_test_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/data/prepare.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/train/trainer.h"
#include "train_test_support.h"

namespace jumbo {
namespace {

// A second tokenizer with another vocabulary size, DIR/other.model; returns its documents.
std::string other_tokenizer(TinyRun& run) {
  TokenizerTrainOptions o;
  const std::string docs = run.dir.file("other.jsonl");
  test::write_brown_subset(docs, 5);
  o.inputs = {docs};
  o.model_prefix = run.dir.file("other");
  o.vocab_size = 450;
  train_tokenizer(o);
  return docs;
}

TEST(Trainer, TinyGptLearnsBrownText) {
  TinyRun run;
  const RunConfig cfg = load_run_config(run.config(), {});
  const TrainSummary s = train(cfg);
  ASSERT_EQ(s.steps, 40);
  EXPECT_GT(s.losses.front(), std::log(512.0) - 0.2);
  EXPECT_LT(s.losses.back(), s.losses.front() - 1.0);
  ASSERT_TRUE(s.final_val_loss.has_value());
  EXPECT_LT(*s.final_val_loss, std::log(512.0) - 1.0);
  // One JSON line per step, with the evaluation's val_loss on steps 20 and 40.
  std::ifstream metrics(run.dir.file("metrics.jsonl"));
  std::string line;
  int lines = 0, with_val = 0;
  while (std::getline(metrics, line)) {
    ++lines;
    with_val += line.find("\"val_loss\"") != std::string::npos;
  }
  EXPECT_EQ(lines, 40);
  EXPECT_EQ(with_val, 2);
}

TEST(Trainer, SameConfigReproducesBitForBitAndBf16Agrees) {
  TinyRun run;
  RunConfig cfg = load_run_config(run.config(), {"train.steps=8", "log.metrics_file=\"\""});
  const TrainSummary a = train(cfg);
  const TrainSummary b = train(cfg);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << i;
  cfg.train.precision = Precision::bf16;
  const TrainSummary c = train(cfg);
  // bf16 storage: ~3 significant digits per activation; the mean loss stays within 1%.
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(c.losses[i], a.losses[i], 0.01 * a.losses[i]) << i;
  }
}

TEST(Trainer, BatchRampUpChangesTheBatchAndStillTrains) {
  TinyRun run;
  const RunConfig cfg = load_run_config(
      run.config(), {"train.rampup_start_batch=4", "train.rampup_tokens=1024", "train.steps=6"});
  const TrainSummary s = train(cfg);
  EXPECT_EQ(s.steps, 6);
  std::ifstream metrics(run.dir.file("metrics.jsonl"));
  std::string first;
  std::getline(metrics, first);
  EXPECT_NE(first.find("\"global_batch\":4"), std::string::npos) << first;
}

TEST(Trainer, NonFiniteLossStopsNamingTheStep) {
  TinyRun run;
  const RunConfig cfg = load_run_config(
      run.config(), {"train.lr=1e30", "train.min_lr=1e29", "train.warmup_tokens=0",
                     "train.grad_clip=0"});
  const std::string msg = test::user_error_of([&] { train(cfg); });
  EXPECT_NE(msg.find("step "), std::string::npos) << msg;
  EXPECT_NE(msg.find("loss is"), std::string::npos) << msg;
}

TEST(Trainer, TokenizerThatDoesNotMatchTheDataIsRefused) {
  TinyRun run;
  other_tokenizer(run);
  const RunConfig cfg =
      load_run_config(run.config(), {"data.tokenizer=\"" + run.dir.file("other.model") + "\""});
  const std::string msg = test::user_error_of([&] { train(cfg); });
  EXPECT_NE(msg.find("train.parts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("other.model"), std::string::npos) << msg;
}

TEST(Trainer, MissingDatasetNamesTheFile) {
  TinyRun run;
  const RunConfig cfg =
      load_run_config(run.config(), {"data.train=\"" + run.dir.file("nope") + "\""});
  const std::string msg = test::user_error_of([&] { train(cfg); });
  EXPECT_NE(msg.find("nope"), std::string::npos) << msg;
}

TEST(Trainer, SeveralValidationSetsEachGetALossAndTheirWeightedMean) {
  TinyRun run;
  // A second held-out set of other text: the last documents of the validation split.
  const auto docs = read_documents(test::brown_valid(), "text");
  {
    std::ofstream tail(run.dir.file("tail.jsonl"));
    for (size_t d = docs.size() - 3; d < docs.size(); ++d)
      tail << nlohmann::json{{"text", docs[d]}}.dump() << "\n";
  }
  PrepareOptions p;
  p.inputs = {run.dir.file("tail.jsonl")};
  p.tokenizer = run.tokenizer;
  p.output_prefix = run.dir.file("tail");
  prepare_dataset(p);
  const RunConfig cfg = load_run_config(
      run.config(), {"train.steps=10", "train.eval_every=5",
                     "data.valid=0.25 " + run.dir.file("valid") + " 0.75 " + run.dir.file("tail")});
  train(cfg);
  std::ifstream metrics(run.dir.file("metrics.jsonl"));
  int evaluations = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("val_loss")) continue;
    ++evaluations;
    ASSERT_TRUE(j.contains("val_loss.valid") && j.contains("val_loss.tail")) << line;
    const double a = j["val_loss.valid"], b = j["val_loss.tail"];
    EXPECT_NE(a, b);  // two sets, two losses
    EXPECT_NEAR(j["val_loss"].get<double>(), 0.25 * a + 0.75 * b, 1e-9) << line;
  }
  EXPECT_EQ(evaluations, 2);
}

TEST(Trainer, DatasetsOfDifferentTokenizersInOneRunNameBothFiles) {
  TinyRun run;
  const std::string docs = other_tokenizer(run);
  PrepareOptions p;
  p.inputs = {docs};
  p.tokenizer = run.dir.file("other.model");
  p.output_prefix = run.dir.file("foreign");
  prepare_dataset(p);
  const RunConfig cfg = load_run_config(
      run.config(), {"data.train=0.5 " + run.dir.file("train") + " 0.5 " + run.dir.file("foreign")});
  const std::string msg = test::user_error_of([&] { train(cfg); });
  EXPECT_NE(msg.find(run.dir.file("train") + " and " + run.dir.file("foreign") +
                     " were made with different tokenizers"), std::string::npos) << msg;
}

TEST(Trainer, ResumeWithAnotherMixtureContinuesTheSampleIndexAndSaysSo) {
  TinyRun run;
  const std::string ckpt = run.dir.file("ckpt");
  RunConfig cfg = load_run_config(
      run.config(), {"train.steps=4", "train.eval_every=0", "checkpoint.every=4",
                     "checkpoint.dir=" + ckpt});
  train(cfg);
  std::ifstream manifest(ckpt + "/step_00000004/manifest.json");
  ASSERT_TRUE(manifest.good());
  const auto m = nlohmann::json::parse(manifest);
  ASSERT_EQ(m["data"]["mixture"].size(), 1u);
  EXPECT_EQ(m["data"]["mixture"][0]["prefix"], run.dir.file("train"));

  const std::string blend = "0.5 " + run.dir.file("train") + " 0.5 " + run.dir.file("valid");
  cfg = load_run_config(run.config(), {"train.steps=6", "train.eval_every=0",
                                       "checkpoint.dir=" + ckpt, "checkpoint.resume=auto",
                                       "data.train=" + blend});
  testing::internal::CaptureStdout();
  const TrainSummary s = train(cfg);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(s.steps, 6);
  EXPECT_NE(out.find("checkpoint: trained on data.train = \"" + run.dir.file("train") +
                     "\", this run blends \"" + blend + "\": the sample index continues at 32"),
            std::string::npos) << out;
}

}  // namespace
}  // namespace jumbo
