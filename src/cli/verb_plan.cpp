#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/config/gpus.h"
#include "jumbo/plan/finetune.h"
#include "jumbo/config/machine.h"
#include "jumbo/plan/search.h"
#include "jumbo/plan/storage.h"
#include "flags.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

// The whole of `text` as a finite number, or NaN. Read here rather than by CLI11 so that a
// bad value gets the one-line error and exit status 2 of every other plan flag.
double parse_number(const std::string& text) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  return ec == std::errc() && ptr == end && std::isfinite(v) ? v : std::nan("");
}

// "7200GiB", "7.5 TiB", "8e12" (bytes), "500MB": a byte count with an optional binary (KiB..PiB)
// or decimal (KB..PB) unit, or -1 when it is not one.
int64_t parse_bytes(const std::string& text) {
  static const std::pair<const char*, double> kUnits[] = {
      {"PiB", 1125899906842624.0}, {"TiB", 1099511627776.0}, {"GiB", 1073741824.0},
      {"MiB", 1048576.0},          {"KiB", 1024.0},          {"PB", 1e15},
      {"TB", 1e12},                {"GB", 1e9},              {"MB", 1e6},
      {"KB", 1e3},                 {"B", 1.0}};
  std::string number = text;
  double scale = 1;
  for (const auto& [unit, factor] : kUnits) {
    const std::string u = unit;
    if (number.size() > u.size() && number.compare(number.size() - u.size(), u.size(), u) == 0) {
      number.resize(number.size() - u.size());
      scale = factor;
      break;
    }
  }
  while (!number.empty() && number.back() == ' ') number.pop_back();
  const double v = parse_number(number) * scale;
  return v >= 0 && v < 9.2e18 ? static_cast<int64_t>(v) : -1;
}

}  // namespace

void add_plan_verb(CLI::App& app, VerbRunner& run) {
  struct Args {
    std::string model, config, gpu = "a100-40gb", machine, tokens,
        price = fmt::format("{}", kP4dOnDemandUsdPerNodeHour);
    std::vector<std::string> overrides;
    Precision precision = Precision::bf16;
    int64_t nodes = 0, gpus_per_node = 8, global_batch = 0, seq = 0;
    size_t limit = 20;
    bool best = false, storage = false;
    std::string data_bytes, fs_capacity, save_target = "600";
    FineTune fine_tune = FineTune::none;
    LoraPlan lora;
    std::string lora_targets = "all";  // resolved on the model (every_lora_target)
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "layouts of a model that fit N GPU nodes, with memory per GPU (docs/plan.md)");
  auto* model = cmd->add_option("-m,--model", args->model, "model preset TOML");
  auto* config = cmd->add_option("-c,--config", args->config,
                                 "run config TOML (model, global batch and precision from it)");
  model->excludes(config);
  cmd->add_option("--set", args->overrides, "override a key of the run config");
  auto* gpu_flag =
      cmd->add_option("--gpu", args->gpu, "GPU type: " + known_gpu_names())->capture_default_str();
  add_min_flag<int64_t>(*cmd, "--nodes", args->nodes, 1,
                        "nodes (required, but with --finetune: default the fewest that fit)");
  auto* per_node_flag =
      add_min_flag<int64_t>(*cmd, "--gpus-per-node", args->gpus_per_node, 1, "GPUs per node");
  cmd->add_option("--machine", args->machine,
                  "a machine description TOML (jumbo bench peak/comm --write-machine): its "
                  "peak, GEMM rate, memory and measured collectives instead of --gpu's "
                  "data sheet (docs/plan.md)")
      ->excludes(gpu_flag)
      ->excludes(per_node_flag);
  cmd->add_option("--global-batch", args->global_batch,
                  "sequences per step (default: the run config's, else 1536 = 3.2M tokens of 2048)");
  cmd->add_option("--seq", args->seq, "tokens per sequence (default: model.context)");
  add_choice_flag(*cmd, "--precision", args->precision, "fp32 or bf16 (--config: the config's)");
  cmd->add_option("--tokens", args->tokens,
                  "tokens to train on, e.g. 300e9: adds est. days, GPU-hours and cost per layout");
  cmd->add_option("--price-per-node-hour", args->price,
                  "USD per node-hour for the cost (default: p4d.24xlarge on demand, us-east-1; "
                  "pass your own negotiated or reserved price)")
      ->capture_default_str();
  cmd->add_option("--limit", args->limit, "rows to print; 0 = all")->capture_default_str();
  cmd->add_flag("--best", args->best,
                "print only the recommended layout as --set overrides (for sbatch scripts)");
  cmd->add_option("--data-bytes", args->data_bytes,
                  "bytes of the training data (default: the run config's data files, if readable)");
  cmd->add_option("--save-target-seconds", args->save_target,
                  "a checkpoint save should take at most this long: sets the file-system "
                  "throughput line (default 600: slurm/train_jumbo.sh's --signal lead)")
      ->capture_default_str();
  cmd->add_option("--fs-capacity", args->fs_capacity,
                  "file-system capacity (bytes, or e.g. 7200GiB, 7.2TiB): whether the "
                  "checkpoints and the data fit");
  cmd->add_option_function<std::string>(
      "--finetune",
      [args](const std::string& text) {
        const std::optional<FineTune> method = parse_fine_tune(text);
        if (!method) throw flag_error("--finetune", text, kFineTuneChoices);
        args->fine_tune = *method;
      },
      "plan a fine-tune: full (pre-training's memory) or lora (a frozen bf16 base and trained "
      "adapters); without --nodes, the fewest nodes that fit");
  auto* lora_rank = add_min_flag<int64_t>(*cmd, "--lora-rank", args->lora.rank, 1,
                                          "LoRA's rank r (--finetune lora)");
  auto* lora_targets = cmd->add_option_function<std::string>(
      "--lora-targets",
      [args](const std::string& text) {
        if (text != "all" && !parse_lora_targets(text)) {
          throw flag_error("--lora-targets", text, kLoraTargetChoices);
        }
        args->lora_targets = text;
      },
      "the maps of every layer that carry an adapter (--finetune lora)");
  lora_targets->default_str("all");
  cmd->add_flag("--storage", args->storage,
                "print only the storage of the recommended layout as key=value lines "
                "(for parallelcluster/render.sh)");
  cmd->callback([&run, args, lora_rank, lora_targets] {
    const bool lora_flags = lora_rank->count() > 0 || lora_targets->count() > 0;
    run = [args, lora_flags] {
      PlanRequest r;
      CheckpointConfig checkpoint;  // --model: the defaults of docs/config.md
      std::string checkpoint_source =
          "checkpoint settings: the defaults (docs/config.md: every = 0, keep_last = 0, "
          "keep_every = 0); pass --config RUN.toml for a run's";
      int64_t run_steps = 0;
      std::optional<int64_t> data_bytes;
      std::string data_unknown_why = "--model names no data";
      std::optional<RunConfig> run_config;
      if (!args->model.empty()) {
        r.model = load_model_config(args->model);
        validate_model(r.model, args->model);
        r.target.global_batch = 1536;
      } else if (!args->config.empty()) {
        const RunConfig cfg = load_run_config(args->config, args->overrides);
        run_config = cfg;
        r.model = cfg.model;
        r.target.global_batch = cfg.train.global_batch;
        args->precision = cfg.train.precision;
        checkpoint = cfg.checkpoint;
        checkpoint_source = fmt::format(
            "checkpoint settings from {} (every = {}, keep_last = {}, keep_every = {})",
            args->config, checkpoint.every, checkpoint.keep_last, checkpoint.keep_every);
        run_steps = cfg.train.steps;
        data_unknown_why = fmt::format("the files of data.train or data.valid of {} are not "
                                       "readable here", args->config);
        data_bytes = data_files_bytes(cfg.data.train);
        if (data_bytes && !cfg.data.valid.empty()) {
          const std::optional<int64_t> valid = data_files_bytes(cfg.data.valid);
          data_bytes = valid ? std::optional<int64_t>(*data_bytes + *valid) : std::nullopt;
        }
      } else {
        throw UserError("jumbo plan: give --model FILE or --config FILE");
      }
      const GpuSpec* gpu = find_gpu(args->gpu);
      if (!gpu)
        throw UserError(fmt::format("jumbo plan: --gpu {}: expected one of {}", args->gpu,
                                    known_gpu_names()));
      if (args->global_batch < 0 || args->seq < 0 || args->seq > r.model.context)
        throw UserError(fmt::format("jumbo plan: --global-batch {} --seq {}: expected >= 1, and "
                                    "a sequence no longer than model.context = {}",
                                    args->global_batch, args->seq, r.model.context));
      if (lora_flags && args->fine_tune != FineTune::lora)
        throw UserError("jumbo plan: --lora-rank and --lora-targets need --finetune lora");
      if (args->nodes == 0 && args->fine_tune == FineTune::none)
        throw UserError("jumbo plan: give --nodes N (with --finetune, omit it for the fewest "
                        "nodes that fit)");
      if (args->storage && args->fine_tune == FineTune::lora)
        throw UserError("jumbo plan: --storage sizes a pre-training checkpoint; with --finetune "
                        "lora the plan prints the adapter-only checkpoint's bytes");
      r.nodes = args->nodes;
      r.set_gpu(*gpu, args->gpus_per_node);
      r.target.device = PlanDevice::gpu;
      if (!args->machine.empty()) {
        r.set_machine(load_machine(args->machine));
        if (r.machine.device == Device::cpu) r.target.device = PlanDevice::cpu;
      }
      if (args->global_batch > 0) r.target.global_batch = args->global_batch;
      r.target.seq = args->seq;
      r.target.precision = args->precision;
      r.target.fine_tune = args->fine_tune;
      r.target.lora = args->lora;
      r.target.lora.targets = *parse_lora_targets(args->lora_targets, r.model);
      if (const std::string problem = lora_targets_problem(r.target.lora.targets, r.model);
          !problem.empty()) {
        throw UserError(fmt::format("--lora-targets {}: {}", args->lora_targets, problem));
      }
      if (!args->tokens.empty()) {
        r.tokens = parse_number(args->tokens);
        if (!(r.tokens > 0))
          throw UserError(fmt::format("jumbo plan: --tokens {}: expected a finite number > 0, "
                                      "e.g. 300e9",
                                      args->tokens));
      }
      if (run_config) {
        // Only layouts the run config can train: `validate` on the config with that layout.
        run_config->train.global_batch = r.target.global_batch;
        r.accepts = [run = *run_config](const Layout& l, int64_t world) {
          RunConfig c = run;
          static_cast<Layout&>(c.parallel) = l;
          c.parallel.bucket_size = run.parallel.bucket_size;
          c.parallel.device = run.parallel.device;
          try {
            validate(c, static_cast<int>(world));
            return true;
          } catch (const UserError&) {
            return false;
          }
        };
      }
      r.price_per_node_hour = parse_number(args->price);
      if (!(r.price_per_node_hour >= 0))
        throw UserError(fmt::format("jumbo plan: --price-per-node-hour {}: expected a finite "
                                    "number of USD >= 0, e.g. 32.7726",
                                    args->price));
      if (!args->data_bytes.empty()) {
        data_bytes = parse_bytes(args->data_bytes);
        if (*data_bytes < 0)
          throw UserError(fmt::format("jumbo plan: --data-bytes {}: expected a byte count, e.g. "
                                      "1.5TiB or 1649267441664",
                                      args->data_bytes));
      }
      std::optional<int64_t> fs_capacity;
      if (!args->fs_capacity.empty()) {
        fs_capacity = parse_bytes(args->fs_capacity);
        if (*fs_capacity <= 0)
          throw UserError(fmt::format("jumbo plan: --fs-capacity {}: expected a byte count > 0, "
                                      "e.g. 7200GiB or 7.2TiB",
                                      args->fs_capacity));
      }
      const double save_target = parse_number(args->save_target);
      if (!(save_target > 0))
        throw UserError(fmt::format("jumbo plan: --save-target-seconds {}: expected a finite "
                                    "number of seconds > 0, e.g. 600",
                                    args->save_target));
      int64_t searched = 0;
      std::vector<PlanCandidate> fitting;
      std::string fewest_line;
      if (r.nodes == 0) {  // --finetune without --nodes
        FewestNodes fewest = search_fewest_nodes(r);
        r = fewest.request;
        searched = fewest.searched;
        fitting = std::move(fewest.fitting);
        fewest_line = format_fewest_nodes(fewest);
      } else {
        fitting = search_layouts(r, &searched);
      }
      // Storage, for the layout the plan recommends.
      const PlanCandidate* chosen = recommended_layout(fitting);
      std::optional<StoragePlan> storage;
      // LoRA saves adapters only: the fine-tune's lines give their checkpoint.
      if (chosen && r.target.fine_tune != FineTune::lora) {
        StoragePlan& s = storage.emplace();
        s.checkpoint = checkpoint_size(r.model, chosen->layout);
        const int64_t steps = r.tokens > 0 ? static_cast<int64_t>(training_cost(r, *chosen).steps)
                                           : run_steps;
        s.retention = checkpoints_at_peak(checkpoint, steps);
        s.data_bytes = data_bytes;
        s.data_unknown_why = data_unknown_why;
        s.save_target_s = save_target;
        s.fs_capacity = fs_capacity;
      }
      if (args->storage) {
        if (!storage)
          throw UserError(fmt::format(
              "jumbo plan: no layout of {} fits {} nodes of {} x {} ({} layouts tried): no "
              "storage to size",
              r.model.name, r.nodes, r.gpus_per_node, r.device_label(), searched));
        fmt::print("{}", format_storage_keys(*storage));
        return 0;
      }
      if (args->best) {
        const PlanCandidate* best = recommended_layout(fitting);
        if (!best)
          throw UserError(fmt::format(
              "jumbo plan: no layout of {} fits {} nodes of {} x {} ({} layouts tried)",
              r.model.name, r.nodes, r.gpus_per_node, r.device_label(), searched));
        fmt::print("{}\n", layout_overrides(best->layout));
        return 0;
      }
      fmt::print("{}{}", fewest_line, format_plan(r, fitting, searched, args->limit));
      if (storage) fmt::print("{}", format_storage(*storage, chosen->layout, checkpoint_source));
      return fitting.empty() ? 1 : 0;
    };
  });
}

}  // namespace jumbo::cli
