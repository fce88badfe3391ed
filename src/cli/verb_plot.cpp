// jumbo plot METRICS.jsonl -o loss.svg: the training curves of a metrics file, as an SVG.
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "jumbo/config/config.h"
#include "jumbo/obs/plot.h"
#include "verbs.h"

namespace jumbo::cli {

void add_plot_verb(CLI::App& app, VerbRunner& run) {
  struct Args {
    std::string metrics, output, title;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plot", "loss, validation loss and learning rate against tokens from a metrics file, as SVG");
  cmd->add_option("metrics", args->metrics, "JSON lines written by log.metrics_file")->required();
  cmd->add_option("-o,--output", args->output, "the SVG file to write")->required();
  cmd->add_option("--title", args->title, "default: the metrics file's name");
  cmd->callback([&run, args] {
    run = [args] {
      const MetricsHistory history = read_metrics_history(args->metrics);
      PlotOptions options;
      options.title = args->title.empty()
                          ? std::filesystem::path(args->metrics).filename().string()
                          : args->title;
      const std::string svg = render_training_svg(history, options);
      std::ofstream out(args->output, std::ios::binary);
      if (!out || !out.write(svg.data(), static_cast<std::streamsize>(svg.size())) || !out.flush()) {
        throw UserError(fmt::format("--output {}: cannot write: {}", args->output, std::strerror(errno)));
      }
      if (history.nonfinite_loss > 0) {
        fmt::print(stderr, "note: {} step(s) with a non-finite loss left off the loss curve\n",
                   history.nonfinite_loss);
      }
      fmt::print("wrote {}: {} step{} from {} line{}{}\n", args->output, history.rows.size(),
                 history.rows.size() == 1 ? "" : "s", history.lines, history.lines == 1 ? "" : "s",
                 history.replaced > 0
                     ? fmt::format(" ({} repeated steps: the last line of each kept)", history.replaced)
                     : "");
      return 0;
    };
  });
}

}  // namespace jumbo::cli
