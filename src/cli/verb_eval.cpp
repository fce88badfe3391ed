// jumbo eval: score a checkpoint on a prepared dataset (mean loss, perplexity, bits per byte,
// every token once) and/or a multiple-choice task, in any tp x pp x dp layout under mpirun.
// Prints a table for people, then one JSON line for scripts (the last line).
#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "inference_flags.h"
#include "jumbo/infer/cloze.h"
#include "jumbo/infer/evaluate.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

struct Args {
  CheckpointOptions checkpoint;
  std::string data, task, per_item;
  std::string adapter;  // a LoRA checkpoint of this base
  int64_t micro_batch = 1, stride = 0, windows = -1;
  ClozeScoring scoring = ClozeScoring::whole;
};

// The UTF-8 bytes each token stands for (Tokenizer::token_bytes): a learned piece with "▁" as
// one space, a byte piece one byte, a byte-level BPE token its bytes, control and unknown
// pieces none.
std::vector<int32_t> piece_bytes(const Tokenizer& tok) {
  std::vector<int32_t> out(static_cast<size_t>(tok.vocab_size()), 0);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    out[static_cast<size_t>(id)] = static_cast<int32_t>(tok.token_bytes(id).size());
  }
  return out;
}

void write_per_item(const std::string& path, const ClozeResult& r) {
  std::ofstream out(path);
  if (!out) throw UserError(fmt::format("--per-item {}: cannot write the file", path));
  for (size_t i = 0; i < r.items.size(); ++i) {
    const ItemScore& s = r.items[i];
    nlohmann::json conts = nlohmann::json::array();
    for (const ContinuationScore& c : s.continuations) {
      conts.push_back({{"context_tokens", c.context_tokens},
                       {"tokens", c.tokens},
                       {"text", c.text},
                       {"loglikelihood", c.loglikelihood}});
    }
    out << nlohmann::json{{"index", i}, {"answer", s.answer}, {"predicted", s.predicted},
                          {"predicted_norm", s.predicted_norm}, {"context_tokens", s.context_tokens},
                          {"continuations", conts}}.dump()
        << "\n";
  }
}

int run_eval(const Args& a) {
  if (a.data.empty() && a.task.empty()) {
    throw UserError("jumbo eval: give --data PREFIX (a prepared dataset) and/or --task FILE.jsonl");
  }
  OpenedCheckpoint c = open_checkpoint_for(a.checkpoint, "eval");
  Comm& world = *c.world;
  const bool leader = world.rank() == 0;
  const ResolvedCheckpoint& ckpt = c.checkpoint;
  const Manifest& m = ckpt.manifest;
  std::vector<ClozeItem> items;
  std::vector<char> table;
  if (leader) {
    const std::vector<int32_t> bytes = piece_bytes(*c.tokenizer);
    table.resize(bytes.size() * sizeof(int32_t));
    std::memcpy(table.data(), bytes.data(), table.size());
    if (!a.task.empty()) items = read_cloze_task(a.task);
  }
  world.broadcast_bytes(table, 0);
  std::vector<int32_t> bytes(table.size() / sizeof(int32_t));
  std::memcpy(bytes.data(), table.data(), table.size());

  EvalLayout layout;
  layout.tp = a.checkpoint.tp;
  layout.pp = a.checkpoint.pp;
  layout.micro_batch = a.micro_batch;
  layout.precision = c.precision;
  std::optional<ResolvedCheckpoint> adapter;
  if (!a.adapter.empty()) {
    adapter = open_checkpoint(a.adapter, S3Options{}, world);
    if (adapter->manifest.lora.rank <= 0) {  // named before a model of rank 0 is built
      check_adapter_base(adapter->manifest, "jumbo eval: --adapter " + a.adapter, m, "");
    }
    layout.lora = adapter->manifest.lora;
  }
  Evaluator ev(m.model, layout, m.model.context, *c.backend, c.world);
  ev.load(ckpt);
  if (adapter) ev.load_adapter(*adapter);
  nlohmann::json out = {{"checkpoint", ckpt.storage->url(ckpt.dir)},
                        {"adapter", adapter ? nlohmann::json(adapter->storage->url(adapter->dir))
                                            : nlohmann::json()},
                        {"step", m.progress.step},
                        {"layout", fmt::format("tp{}-pp{}-dp{}", layout.tp, layout.pp, ev.grid().dp_size())}};
  std::string table_text = fmt::format("checkpoint {} (step {}){}, {}\n", ckpt.storage->url(ckpt.dir),
                                       m.progress.step,
                                       adapter ? " with adapter " + out["adapter"].get<std::string>() : "",
                                       out["layout"].get<std::string>());
  if (!a.data.empty()) {
    const int64_t stride = a.stride > 0 ? a.stride : m.model.context;
    const DatasetEvalResult r = evaluate_dataset(ev, a.data, stride, a.windows, bytes);
    out["data"] = {{"prefix", a.data},          {"windows", r.windows},
                   {"stride", stride},          {"tokens", r.tokens_scored},
                   {"dataset_tokens", r.dataset_tokens},
                   {"bytes", r.bytes_scored},   {"loss", r.mean_loss()},
                   {"perplexity", r.perplexity()}, {"bits_per_byte", r.bits_per_byte()}};
    table_text += fmt::format(
        "{:<28} {:>9} {:>11} {:>10} {:>11} {:>13}\n{:<28} {:>9} {:>11} {:>10.6f} {:>11.4f} {:>13.4f}\n",
        "dataset", "windows", "tokens", "loss", "perplexity", "bits/byte", a.data, r.windows,
        r.tokens_scored, r.mean_loss(), r.perplexity(), r.bits_per_byte());
  }
  if (!a.task.empty()) {
    const ClozeResult r =
        evaluate_cloze(ev, c.tokenizer ? &*c.tokenizer : nullptr, items, a.scoring);
    if (leader) {
      out["task"] = {{"file", a.task},
                     {"items", r.items.size()},
                     {"scoring", to_string(r.scoring)},
                     {"accuracy", r.accuracy},
                     {"accuracy_norm", r.accuracy_norm},
                     {"truncated", r.truncated},
                     {"pairs", r.seams.pairs},
                     {"merged", r.seams.merged},
                     {"changed", r.seams.changed},
                     {"cut_inside", r.seams.cut_inside}};
      table_text += fmt::format(
          "{:<28} {:>9} {:>11} {:>13} {:>9}\n{:<28} {:>9} {:>11.4f} {:>13.4f} {:>9}\ntask: {}\n",
          "task", "items", "acc", "acc_norm", "scoring", a.task, r.items.size(), r.accuracy,
          r.accuracy_norm, to_string(r.scoring), describe_seams(r.seams));
      if (!a.per_item.empty()) write_per_item(a.per_item, r);
    }
  }
  if (leader) fmt::print("{}{}\n", table_text, out.dump());
  return 0;
}

}  // namespace

void add_eval_verb(CLI::App& app, VerbRunner& run) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "score a checkpoint: loss, perplexity and bits per byte over a prepared dataset, "
              "accuracy on a multiple-choice task (any tp x pp x dp layout under mpirun)");
  add_checkpoint_flags(*cmd, a->checkpoint);
  cmd->add_option("--adapter", a->adapter,
                  "a LoRA checkpoint of this base: evaluate the base with its adapters");
  cmd->add_option("--data", a->data, "a prepared dataset prefix: every token scored once");
  cmd->add_option("--stride", a->stride,
                  "tokens between window starts (default: the context; smaller overlaps windows, "
                  "each scoring only its new tokens)");
  cmd->add_option("--windows", a->windows,
                  "score only the first N windows (N = train.eval_batches x micro_batch "
                  "reproduces a run's val_loss)");
  cmd->add_option("--task", a->task,
                  "multiple-choice JSONL: {\"context\", \"continuations\": [...], \"answer\"}");
  cmd->add_option("--per-item", a->per_item, "with --task: write each item's log-likelihoods");
  cmd->add_option_function<std::string>(
         "--scoring",
         [a](const std::string& text) {
           const std::optional<ClozeScoring> s = parse_cloze_scoring(text);
           if (!s) throw flag_error("--scoring", text, kClozeScoringNames);
           a->scoring = *s;
         },
         "with --task: where a pair is cut into context and scored continuation: whole "
         "(encoded whole, cut after the context's own token count, as lm-evaluation-harness) or "
         "boundary (the context's and the continuation's own tokens: exactly its characters)")
      ->default_str("whole");
  cmd->add_option("--micro-batch", a->micro_batch, "windows per microbatch")->capture_default_str();
  cmd->callback([&run, a] { run = [a] { return run_eval(*a); }; });
}

}  // namespace jumbo::cli
