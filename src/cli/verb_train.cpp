#include <fmt/format.h>

#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/embedded_demo.h"
#include "jumbo/train/device.h"
#include "jumbo/train/stop_signal.h"
#include "jumbo/train/trainer.h"
#include "verbs.h"

namespace jumbo::cli {

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
      const RunConfig cfg =
          args->config.empty()
              ? parse_run_config(kEmbeddedDemoToml, "<embedded inputs/runs/demo.toml>",
                                 args->overrides)
              : load_run_config(args->config, args->overrides);
      auto backend = make_backend(cfg.parallel.device);
      install_stop_signal_handlers();
      Trainer trainer(cfg, *backend, make_world_comm(*backend));
      const TrainSummary s = trainer.run();
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
