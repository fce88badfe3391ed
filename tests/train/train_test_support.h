#pragma once
// The one-rank trainer tests' run: a tokenizer, training and validation datasets made from
// Brown text by the data part, and a config of the tiny GPT over them.
#include <fstream>
#include <string>

#include "../data/data_test_support.h"
#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/data/prepare.h"
#include "jumbo/train/trainer.h"

namespace jumbo {

struct TinyRun {
  test::TempDir dir;
  std::string tokenizer = test::small_tokenizer();

  TinyRun() {
    const std::string docs = dir.file("docs.jsonl");
    test::write_brown_subset(docs, 12);
    PrepareOptions p;
    p.inputs = {docs};
    p.tokenizer = tokenizer;
    p.output_prefix = dir.file("train");
    prepare_dataset(p);
    p.output_prefix = dir.file("valid");
    prepare_dataset(p);
  }

  std::string config(const std::string& extra = "") {
    const std::string path = dir.file("run.toml");
    std::ofstream out(path);
    out << "[model]\npreset = \"" << JUMBO_SOURCE_DIR << "/inputs/models/tiny.toml\"\n"
        << "[parallel]\nmicro_batch = 4\n"
        << "[train]\nsteps = 40\nglobal_batch = 8\nlr = 3e-3\nmin_lr = 3e-4\n"
        << "warmup_tokens = 1000\neval_every = 20\neval_batches = 2\n"
        << "[data]\ntrain = \"" << dir.file("train") << "\"\nvalid = \"" << dir.file("valid")
        << "\"\ntokenizer = \"" << tokenizer << "\"\n"
        << "[log]\nmetrics_file = \"" << dir.file("metrics.jsonl") << "\"\nevery = 100\n"
        << extra;
    return path;
  }
};

inline TrainSummary train(const RunConfig& cfg) {
  auto backend = make_cpu_backend();
  Trainer t(cfg, *backend, mpi_world());
  return t.run();
}

}  // namespace jumbo
