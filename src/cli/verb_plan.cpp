#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/config/gpus.h"
#include "jumbo/plan/search.h"
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

}  // namespace

void add_plan_verb(CLI::App& app, VerbRunner& run) {
  struct Args {
    std::string model, config, gpu = "a100-40gb", precision = "bf16", tokens,
        price = fmt::format("{}", kP4dOnDemandUsdPerNodeHour);
    std::vector<std::string> overrides;
    int64_t nodes = 0, gpus_per_node = 8, global_batch = 0, seq = 0;
    size_t limit = 20;
    bool best = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "layouts of a model that fit N GPU nodes, with memory per GPU (docs/plan.md)");
  auto* model = cmd->add_option("-m,--model", args->model, "model preset TOML");
  auto* config = cmd->add_option("-c,--config", args->config,
                                 "run config TOML (model, global batch and precision from it)");
  model->excludes(config);
  cmd->add_option("--set", args->overrides, "override a key of the run config");
  cmd->add_option("--gpu", args->gpu, "GPU type: " + known_gpu_names())->capture_default_str();
  cmd->add_option("--nodes", args->nodes, "nodes")->required();
  cmd->add_option("--gpus-per-node", args->gpus_per_node, "GPUs per node")->capture_default_str();
  cmd->add_option("--global-batch", args->global_batch,
                  "sequences per step (default: the run config's, else 1536 = 3.2M tokens of 2048)");
  cmd->add_option("--seq", args->seq, "tokens per sequence (default: model.context)");
  cmd->add_option("--precision", args->precision, "bf16 or fp32")->capture_default_str();
  cmd->add_option("--tokens", args->tokens,
                  "tokens to train on, e.g. 300e9: adds est. days, GPU-hours and cost per layout");
  cmd->add_option("--price-per-node-hour", args->price,
                  "USD per node-hour for the cost (default: p4d.24xlarge on demand, us-east-1; "
                  "pass your own negotiated or reserved price)")
      ->capture_default_str();
  cmd->add_option("--limit", args->limit, "rows to print; 0 = all")->capture_default_str();
  cmd->add_flag("--best", args->best,
                "print only the recommended layout as --set overrides (for sbatch scripts)");
  cmd->callback([&run, args] {
    run = [args] {
      PlanRequest r;
      if (!args->model.empty()) {
        r.model = load_model_config(args->model);
        validate_model(r.model, args->model);
        r.target.global_batch = 1536;
      } else if (!args->config.empty()) {
        const RunConfig cfg = load_run_config(args->config, args->overrides);
        r.model = cfg.model;
        r.target.global_batch = cfg.train.global_batch;
        args->precision = to_string(cfg.train.precision);
      } else {
        throw UserError("jumbo plan: give --model FILE or --config FILE");
      }
      const GpuSpec* gpu = find_gpu(args->gpu);
      if (!gpu)
        throw UserError(fmt::format("jumbo plan: --gpu {}: expected one of {}", args->gpu,
                                    known_gpu_names()));
      r.gpu = *gpu;
      if (args->nodes < 1)
        throw UserError(fmt::format("jumbo plan: --nodes {}: expected >= 1", args->nodes));
      if (args->gpus_per_node < 1)
        throw UserError(fmt::format("jumbo plan: --gpus-per-node {}: expected >= 1",
                                    args->gpus_per_node));
      if (args->precision != "bf16" && args->precision != "fp32")
        throw UserError(fmt::format("jumbo plan: --precision {}: expected bf16 or fp32",
                                    args->precision));
      if (args->global_batch < 0 || args->seq < 0 || args->seq > r.model.context)
        throw UserError(fmt::format("jumbo plan: --global-batch {} --seq {}: expected >= 1, and "
                                    "a sequence no longer than model.context = {}",
                                    args->global_batch, args->seq, r.model.context));
      r.nodes = args->nodes;
      r.gpus_per_node = args->gpus_per_node;
      if (args->global_batch > 0) r.target.global_batch = args->global_batch;
      r.target.seq = args->seq;
      r.target.device = PlanDevice::gpu;
      r.target.precision = args->precision == "bf16" ? Precision::bf16 : Precision::fp32;
      if (!args->tokens.empty()) {
        r.tokens = parse_number(args->tokens);
        if (!(r.tokens > 0))
          throw UserError(fmt::format("jumbo plan: --tokens {}: expected a finite number > 0, "
                                      "e.g. 300e9",
                                      args->tokens));
      }
      r.price_per_node_hour = parse_number(args->price);
      if (!(r.price_per_node_hour >= 0))
        throw UserError(fmt::format("jumbo plan: --price-per-node-hour {}: expected a finite "
                                    "number of USD >= 0, e.g. 32.7726",
                                    args->price));
      int64_t searched = 0;
      const std::vector<PlanCandidate> fitting = search_layouts(r, &searched);
      if (args->best) {
        const PlanCandidate* best = recommended_layout(fitting);
        if (!best)
          throw UserError(fmt::format(
              "jumbo plan: no layout of {} fits {} nodes of {} x {} ({} layouts tried)",
              r.model.name, r.nodes, r.gpus_per_node, r.gpu.label, searched));
        fmt::print("{}\n", layout_overrides(best->layout));
        return 0;
      }
      fmt::print("{}", format_plan(r, fitting, searched, args->limit));
      return fitting.empty() ? 1 : 0;
    };
  });
}

}  // namespace jumbo::cli
