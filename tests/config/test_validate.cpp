// validate(): every consistency check fails with one line that starts with the config's
// source and names the key(s), the value(s) and what is allowed.
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

using ::testing::HasSubstr;

const char* kSource = "sweep.toml";
const char* kRun = R"(
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
lr = 1e-3
min_lr = 1e-4
eval_every = 5
[data]
train = "corpus/train"
valid = "corpus/valid"
tokenizer = "corpus/tok.model"
)";

RunConfig run_with(const std::vector<std::string>& sets) {
  return parse_run_config(kRun, kSource, sets);
}

// Loads kRun with `sets` and checks it against `world_size`; returns the UserError's message.
std::string error_of(const std::vector<std::string>& sets, int world_size = 1) {
  try {
    validate(run_with(sets), world_size);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

void expect_error(const std::vector<std::string>& sets, std::initializer_list<std::string> parts,
                  int world_size = 1) {
  const std::string message = error_of(sets, world_size);
  EXPECT_EQ(message.rfind(std::string(kSource) + ": ", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
}

TEST(Validate, TheBaseRunIsValid) {
  EXPECT_NO_THROW(validate(run_with({}), 1));
  EXPECT_NO_THROW(validate(run_with({"parallel.tp=2"}), 2));
  EXPECT_NO_THROW(validate(run_with({"parallel.tp=2", "parallel.pp=2"}), 8));  // dp 2: 8 = 2 x 2 x 2
  EXPECT_NO_THROW(validate(run_with({"train.rampup_start_batch=4", "train.rampup_tokens=1000"}), 2));
}

TEST(Validate, ModelShape) {
  expect_error({"model.heads=7"}, {"model.heads = 7 does not divide model.d_model = 64"});
  expect_error({"model.layers=0"}, {"model.layers = 0: expected > 0"});
  expect_error({"model.vocab=-3"}, {"model.vocab = -3: expected > 0"});
  expect_error({"model.context=0"}, {"model.context = 0"});
  expect_error({"model.ffn=-1"}, {"model.ffn = -1"});
  expect_error({"model.vocab_multiple=0"}, {"model.vocab_multiple = 0"});
  ModelConfig m = run_with({}).model;
  m.d_model = 0;
  EXPECT_THROW(validate_model(m, "preset.toml"), UserError);
}

TEST(Validate, ParallelLayout) {
  expect_error({"parallel.tp=2"}, {"world size 3 is not divisible by parallel.tp x parallel.pp = 2 x 1"}, 3);
  expect_error({"parallel.tp=3"}, {"parallel.tp = 3 does not divide model.heads = 4"}, 3);
  expect_error({"parallel.tp=4", "model.ffn=90"},
               {"parallel.tp = 4 does not divide the ffn width 90"}, 4);
  expect_error({"parallel.pp=3"}, {"parallel.pp = 3 exceeds model.layers = 2"}, 3);
  expect_error({"parallel.tp=0"}, {"parallel.tp = 0: expected >= 1"});
  expect_error({"parallel.micro_batch=0"}, {"parallel.micro_batch = 0: expected >= 1"});
}

TEST(Validate, LoadingChecksWhatItCanBeforeTheWorldIsKnown) {
  // parse_run_config runs the world-independent checks (dp = 1) itself.
  EXPECT_THROW(run_with({"train.global_batch=7"}), UserError);
  EXPECT_NO_THROW(validate(run_with({"parallel.tp=2", "parallel.pp=2"}), 0));
}

TEST(Validate, AnomalyAndStragglerKeys) {
  // A name that is not a choice fails while parsing, naming the override.
  try {
    run_with({"train.on_anomaly=retry"});
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("train.on_anomaly = \"retry\": expected \"stop\", "
                                    "\"skip\" or \"rewind\""));
  }
  expect_error({"train.spike_ratio=0.9"}, {"train.spike_ratio = 0.9: expected > 1", "or 0"});
  expect_error({"train.spike_window=0"}, {"train.spike_window = 0: expected >= 1"});
  expect_error({"train.max_anomalies=-1"}, {"train.max_anomalies = -1: expected >= 0"});
  expect_error({"train.anomaly_window=0"}, {"train.anomaly_window = 0: expected >= 1"});
  expect_error({"train.rewind_skip_batches=-2"}, {"train.rewind_skip_batches = -2"});
  expect_error({"train.on_anomaly=rewind", "checkpoint.dir=\"\""},
               {"train.on_anomaly = \"rewind\" but checkpoint.dir is empty"});
  expect_error({"log.straggler_ratio=1"}, {"log.straggler_ratio = 1: expected > 1"});
  expect_error({"log.straggler_intervals=0"}, {"log.straggler_intervals = 0: expected >= 1"});
}

TEST(Validate, BatchesDivideIntoMicrobatchesOnEveryDataParallelRank) {
  expect_error({"train.global_batch=6"},
               {"train.global_batch = 6 is not a multiple of parallel.micro_batch x dp = 2 x 2"}, 2);
  expect_error({"train.global_batch=0"}, {"train.global_batch = 0: expected > 0"});
  expect_error({"train.steps=0"}, {"train.steps = 0: expected > 0"});
}

TEST(Validate, LearningRateSchedule) {
  expect_error({"train.min_lr=0.01"},
               {"train.min_lr = 0.01 with train.lr = 0.001: expected 0 <= min_lr <= lr"});
  expect_error({"train.min_lr=-1"}, {"train.min_lr = -1"});
  expect_error({"train.lr=0", "train.min_lr=0"}, {"train.lr = 0: expected > 0"});
  expect_error({"train.warmup_tokens=-1"}, {"train.warmup_tokens = -1: expected >= 0"});
  expect_error({"train.decay_tokens=-5"}, {"train.decay_tokens = -5"});
}

TEST(Validate, BatchRampUp) {
  expect_error({"train.rampup_start_batch=2", "train.rampup_tokens=100"},
               {"train.rampup_start_batch = 2 is not a multiple of parallel.micro_batch x dp = 2 x 2"},
               2);
  expect_error({"train.rampup_start_batch=16", "train.rampup_tokens=100"},
               {"train.rampup_start_batch = 16 exceeds train.global_batch = 8"});
  expect_error({"train.rampup_start_batch=4"},
               {"train.rampup_tokens = 0 with train.rampup_start_batch = 4: expected > 0"});
}

TEST(Validate, Optimizer) {
  expect_error({"train.beta1=1"}, {"train.beta1 = 1: expected 0 <= train.beta1 < 1"});
  expect_error({"train.beta2=-0.5"}, {"train.beta2 = -0.5"});
  expect_error({"train.eps=0"}, {"train.eps = 0: expected > 0"});
  expect_error({"train.weight_decay=-0.1"}, {"train.weight_decay = -0.1: expected >= 0"});
  expect_error({"train.grad_clip=-1"}, {"train.grad_clip = -1: expected >= 0"});
  expect_error({"train.eps=nan"}, {"train.eps = nan"});
}

TEST(Validate, LoraDropout) {
  const std::string lora = "finetune.method=lora", base = "train.init_from=runs/base";
  EXPECT_NO_THROW(validate(run_with({lora, base, "finetune.lora_dropout=0.1"}), 1));
  expect_error({lora, base, "finetune.lora_dropout=1"},
               {"finetune.lora_dropout = 1: expected 0 <= p < 1"});
  expect_error({lora, base, "finetune.lora_dropout=-0.2"}, {"finetune.lora_dropout = -0.2"});
  expect_error({"finetune.lora_dropout=0.1"},
               {"finetune.lora_dropout = 0.1: only with finetune.method = \"lora\""});
}

TEST(Validate, EvaluationDataAndLogging) {
  expect_error({"train.eval_every=-1"}, {"train.eval_every = -1"});
  expect_error({"train.eval_batches=0"}, {"train.eval_batches = 0: expected >= 1"});
  expect_error({"data.valid="}, {"data.valid is empty but train.eval_every = 5"});
  EXPECT_NO_THROW(run_with({"data.valid=", "train.eval_every=0"}));
  expect_error({"data.train="}, {"data.train is empty"});
  expect_error({"data.tokenizer=\"\""}, {"data.tokenizer is empty"});
  expect_error({"log.every=0"}, {"log.every = 0: expected >= 1"});
  expect_error({"log.peak_tflops=-1"}, {"log.peak_tflops = -1"});
  expect_error({"train.threads=-2"}, {"train.threads = -2"});
}

TEST(Validate, CheckpointKeys) {
  expect_error({"checkpoint.every=100", "checkpoint.dir="},
               {"checkpoint.every = 100 but checkpoint.dir is empty"});
  expect_error({"checkpoint.resume=auto", "checkpoint.dir="},
               {"checkpoint.resume = \"auto\" but checkpoint.dir is empty"});
  expect_error({"checkpoint.resume=12", "checkpoint.dir="},
               {"checkpoint.resume = \"12\" but checkpoint.dir is empty"});
  expect_error({"checkpoint.resume="}, {"checkpoint.resume is empty"});
  expect_error({"checkpoint.every=-1"}, {"checkpoint.every = -1: expected >= 0"});
  expect_error({"checkpoint.keep_last=-1"}, {"checkpoint.keep_last = -1: expected >= 0"});
  expect_error({"checkpoint.dir=ck", "checkpoint.every=10", "checkpoint.keep_every=15"},
               {"checkpoint.keep_every = 15 is not a multiple of checkpoint.every = 10"});
  expect_error({"checkpoint.dir=s3://"}, {"checkpoint.dir = \"s3://\""});
  EXPECT_NO_THROW(run_with({"checkpoint.dir=ck", "checkpoint.every=10", "checkpoint.keep_every=20",
                            "checkpoint.keep_last=3", "checkpoint.async=true",
                            "checkpoint.resume=auto"}));
  // A path (another run's checkpoint) needs no checkpoint.dir.
  EXPECT_NO_THROW(run_with({"checkpoint.dir=", "checkpoint.resume=/ckpt/step_00000010"}));
}

}  // namespace
}  // namespace jumbo

namespace jumbo {
namespace {

TEST(Validate, ParallelismKeys) {
  expect_error({"parallel.pp=2", "parallel.stage_layers=[1, 2]"},
               {"parallel.stage_layers", "2 entries summing to 3", "model.layers = 2"}, 2);
  expect_error({"parallel.pp=2", "parallel.stage_layers=[2, 0]"}, {"each >= 1"}, 2);
  expect_error({"parallel.comm_timeout_s=0"}, {"parallel.comm_timeout_s = 0"});
  expect_error({"parallel.bucket_size=0"}, {"parallel.bucket_size"});
  EXPECT_NO_THROW(validate(run_with({"parallel.pp=2", "parallel.stage_layers=[1, 1]",
                                     "parallel.zero1=true", "parallel.recompute=full"}),
                           2));
}

// The world sets dp once; a tool that takes a layout on its command line gets the same rules
// with its flags named.
TEST(Validate, OneLayoutForConfigAndTools) {
  const RunConfig cfg = validated_for_world(run_with({"parallel.tp=2", "parallel.zero1=true"}), 8);
  EXPECT_EQ(cfg.parallel.dp, 4);
  EXPECT_TRUE(cfg.parallel.zero1_active());
  EXPECT_EQ(cfg.parallel.world_size(), 8);
  EXPECT_EQ(validated_for_world(cfg, 2).parallel.dp, 1);
  Layout l;
  l.tp = 3;
  try {
    validate_layout(l, cfg.model, "jumbo ckpt convert", LayoutKeys::flags);
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("jumbo ckpt convert: --tp 3 does not divide"));
  }
  l.tp = 1;
  l.virtual_stages = 2;
  try {
    validate_layout(l, cfg.model, "x", LayoutKeys::config);
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(std::string(e.what()),
                HasSubstr("x: parallel.virtual_stages = 2: interleaving needs parallel.pp > 1"));
  }
}

TEST(Load, StageLayersMustBeAnArrayOfIntegers) {
  try {
    run_with({"parallel.stage_layers=3"});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("an array of integers"));
  }
}

}  // namespace
}  // namespace jumbo

namespace jumbo {
namespace {

TEST(Validate, LayoutDependentBatchRules) {
  // 4 data-parallel ranks cannot share 5 evaluation microbatches.
  expect_error({"train.eval_batches=5", "train.global_batch=8", "parallel.micro_batch=1"},
               {"train.eval_batches = 5", "data-parallel size 4"}, 4);
  // Interleaving over 2 stages needs an even number of microbatches per step (6 / 2 = 3).
  expect_error({"parallel.pp=2", "parallel.virtual_stages=2", "model.layers=4",
                "train.global_batch=6", "parallel.micro_batch=2"},
               {"parallel.virtual_stages = 2", "= 3", "parallel.pp = 2"}, 2);
}

}  // namespace
}  // namespace jumbo
