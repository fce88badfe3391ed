#include <fmt/format.h>

#include <string>
#include <vector>

#include "jumbo/config/config.h"
#include "jumbo/model/flops.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

void print_model_info(const ModelConfig& m) {
  const int64_t exact = parameter_count(m);
  const double formula = parameter_count_formula(m);
  fmt::print("model {}: {} layers, d_model {}, {} heads x {} ({} key/value heads), ffn {}, "
             "vocab {} (padded {}), context {}\n",
             m.name, m.layers, m.d_model, m.heads, m.head_dim(), m.kv_head_count(), m.ffn_dim(),
             m.vocab, m.padded_vocab(), m.context);
  fmt::print("block: {}, {} positions{}, {} MLP, {} embeddings, {}\n", to_string(m.norm),
             to_string(m.position),
             m.position == PositionEncoding::rope
                 ? fmt::format(" (theta {}{})", m.rope_theta,
                               m.rope_scaling == RopeScaling::llama3
                                   ? fmt::format(", llama3 scaling x{}", m.rope_factor)
                                   : "")
                 : "",
             to_string(m.mlp), m.tied_embeddings ? "tied" : "untied",
             m.linear_bias ? "biases" : (m.qkv_bias ? "q/k/v biases only" : "no biases"));
  fmt::print("parameters: {} ({:.2f}B) counted from the shapes, padded vocabulary included\n",
             exact, static_cast<double>(exact) / 1e9);
  fmt::print("parameters: {:.0f} ({:.2f}B) by {}\n", formula, formula / 1e9,
             parameter_count_formula_text(m));
  const double per_token = model_flops_per_token(m, m.context);
  fmt::print("model FLOPs per token (seq {}): {:.4g} = {:.2f} x parameters, by {} / (B s)\n",
             m.context, per_token, per_token / static_cast<double>(exact), kModelFlopsFormula);
  fmt::print("training memory at 18 bytes/parameter (bf16 weights, fp32 grads, master, Adam): "
             "{:.1f} GiB before sharding\n",
             static_cast<double>(exact) * 18.0 / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace

void add_info_verb(CLI::App& app, VerbRunner& run) {
  struct Args {
    std::string model, config;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("info", "parameter count and model FLOPs of a model");
  auto* model = cmd->add_option("-m,--model", args->model, "model preset TOML");
  auto* config = cmd->add_option("-c,--config", args->config, "run config TOML");
  model->excludes(config);
  cmd->add_option("--set", args->overrides, "override a key of a run config: section.key=value");
  cmd->callback([&run, args] {
    run = [args] {
      if (!args->model.empty()) {
        ModelConfig m = load_model_config(args->model);
        validate_model(m, args->model);
        print_model_info(m);
      } else if (!args->config.empty()) {
        const RunConfig cfg = load_run_config(args->config, args->overrides);
        print_model_info(cfg.model);
        fmt::print("\nresolved run config:\n{}", describe(cfg));
      } else {
        throw UserError("jumbo info: give --model FILE or --config FILE");
      }
      return 0;
    };
  });
}

}  // namespace jumbo::cli
