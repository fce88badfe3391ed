#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/embedded_demo.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/runtime/device.h"
#include "jumbo/runtime/stop_signal.h"
#include "jumbo/train/trainer.h"
#include "verbs.h"

namespace jumbo::cli {

namespace {

constexpr const char* kDemoSource = "<embedded inputs/runs/demo.toml>";

// The embedded demo names its files relative to a checkout: the working directory when it is
// one, else the repository this binary was built from, so `jumbo train` runs from anywhere.
std::string demo_base_dir() {
  const char* preset = "inputs/models/demo-small.toml";
  if (std::filesystem::exists(preset)) return "";
  if (std::filesystem::exists(std::filesystem::path(kJumboSourceDir) / preset)) return kJumboSourceDir;
  throw UserError(fmt::format("{}: jumbo train without --config runs the demo of the checkout it "
                              "was built from ({}), which is gone: run it from a checkout "
                              "(scripts/demo.sh) or give --config RUN.toml",
                              kDemoSource, kJumboSourceDir));
}

}  // namespace

void add_train_verb(CLI::App& app, VerbRunner& run) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "train a model from a run config (default: the "
                                              "embedded demo, inputs/runs/demo.toml)");
  cmd->add_option("-c,--config", args->config, "run config TOML");
  cmd->add_option("--set", args->overrides, "override a key: section.key=value (repeatable)");
  cmd->callback([&run, args] {
    run = [args] {
      const bool demo = args->config.empty();
      const RunConfig cfg =
          demo ? parse_run_config(kEmbeddedDemoToml, kDemoSource, args->overrides, demo_base_dir())
               : load_run_config(args->config, args->overrides);
      // Before a device is opened; every stage shares rank 0's head size and dtype.
      check_device_supports(cfg, plan_stage(cfg, GridCoords{}).model, cfg.parallel.device);
      auto backend = make_backend(cfg.parallel.device);
      install_stop_signal_handlers();
      std::unique_ptr<Trainer> trainer;
      try {
        trainer = std::make_unique<Trainer>(cfg, *backend,
                                            make_world_comm(*backend, cfg.comm.emulate));
      } catch (const UserError& e) {
        if (!demo || std::filesystem::exists(cfg.data.tokenizer)) throw;
        throw UserError(fmt::format("{}; scripts/demo.sh makes the demo's tokenizer and data "
                                    "(once, then trains)", e.what()));
      }
      const TrainSummary s = trainer->run();
      if (s.stop_no_room) return kExitStoppedForRequeue;
      if (s.stop_signal != 0) return s.stop_saved ? kExitStoppedForRequeue : 128 + s.stop_signal;
      if (mpi_world()->rank() == 0) {
        fmt::print("done: {} steps, final loss {:.4f}", s.steps, s.final_loss);
        if (s.final_val_loss) fmt::print(", validation loss {:.4f}", *s.final_val_loss);
        fmt::print("\n");
      }
      return 0;
    };
  });
}

}  // namespace jumbo::cli
