// jumbo <verb>: thin. Parse arguments, call the library, turn user mistakes into one line.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "jumbo/comm/agreed_error.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "verbs.h"

namespace {
// Under mpirun the failing rank names itself; one rank says nothing extra.
std::string rank_prefix(int world_size) {
  return world_size > 1 ? "rank " + std::to_string(jumbo::mpi_world()->rank()) + ": " : "";
}
// "train " for `jumbo train --bad`, "bench train " for a bench verb: where --help would help.
std::string verb_path(CLI::App& app) {
  std::string path;
  for (CLI::App* cmd = &app; !cmd->get_subcommands().empty();) {
    cmd = cmd->get_subcommands().front();
    path += cmd->get_name() + " ";
  }
  return path;
}
// "train, info, ...": every verb, in --help's order.
std::string verb_names(CLI::App& app) {
  std::string names;
  for (const CLI::App* verb : app.get_subcommands([](CLI::App*) { return true; })) {
    if (!names.empty()) names += ", ";
    names += verb->get_name();
  }
  return names;
}
}  // namespace

int main(int argc, char** argv) {
  // `jumbo doctor --local` must report on a node whose MPI (PMIx, the fabric) is what hangs or
  // fails: it never starts MPI, however it was launched (obs/doctor.h).
  if (argc > 1 && std::string(argv[1]) == "doctor")
    for (int i = 2; i < argc; ++i)
      if (std::string(argv[i]) == "--local") setenv("JUMBO_MPI", "0", 1);
  // MPI from the start: one rank is world size 1, and every verb runs under mpirun too.
  const int world_size = jumbo::mpi_init(&argc, &argv);
  CLI::App app{"jumbo: pre-train, fine-tune, evaluate and serve GPT- and Llama-family language "
               "models with tensor, pipeline and data parallelism"};
  app.require_subcommand(1);
  jumbo::cli::VerbRunner run;
  jumbo::cli::add_train_verb(app, run);
  jumbo::cli::add_info_verb(app, run);
  jumbo::cli::add_data_verb(app, run);
  jumbo::cli::add_bench_verb(app, run);
  jumbo::cli::add_ckpt_verb(app, run);
  jumbo::cli::add_plot_verb(app, run);
  jumbo::cli::add_plan_verb(app, run);
  jumbo::cli::add_doctor_verb(app, run);
  jumbo::cli::add_generate_verb(app, run);
  jumbo::cli::add_eval_verb(app, run);
  jumbo::cli::add_serve_verb(app, run);
  // After the verbs: a subcommand copies its parent's footer when it is added.
  app.footer("`jumbo VERB --help` gives a verb's flags. New here: scripts/demo.sh trains the "
             "demo model and prints how to try it (README.md).");
  int code = 0;
  bool failed = false;  // an exception on this rank: the others may be waiting for it
  bool agreed = false;  // an exception every rank threw at the same point (AgreedError)
  try {
    // `jumbo` alone: the verbs and what each does, as --help (stdout, exit 0), not an error.
    if (argc == 1) {
      app.name(argv[0]);  // parse() would have set it: "Usage: build/jumbo ..."
      throw CLI::CallForHelp();
    }
    app.parse(argc, argv);
    code = run ? run() : 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      code = app.exit(e);  // --help, --version
    } else {
      // One line, exit 2, like every other user mistake (CLI11's own: two lines, its code).
      if (jumbo::mpi_world()->rank() == 0) {
        if (app.get_subcommands().empty()) {
          // No verb parsed (`jumbo frob`): CLI11 would say only "A subcommand is required".
          std::fprintf(stderr,
                       "jumbo: error: '%s' is not a verb; the verbs: %s (see jumbo --help)\n",
                       argv[1], verb_names(app).c_str());
        } else {
          std::fprintf(stderr, "jumbo: error: %s (see jumbo %s--help)\n", e.what(),
                       verb_path(app).c_str());
        }
      }
      code = 2;
    }
  } catch (const jumbo::AgreedError& e) {
    if (!e.quiet) {
      std::fprintf(stderr, "jumbo: %serror: %s\n", rank_prefix(world_size).c_str(), e.what());
    }
    code = 2;
    agreed = true;
  } catch (const jumbo::UserError& e) {
    std::fprintf(stderr, "jumbo: %serror: %s\n", rank_prefix(world_size).c_str(), e.what());
    code = 2;
    failed = true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "jumbo: %sinternal error: %s\n", rank_prefix(world_size).c_str(), e.what());
    code = 3;
    failed = true;
  }
  // A verb's own non-zero result (a graceful stop: 75) is the same on every rank. So is an
  // AgreedError: every rank has unwound (and so waited for its non-blocking operations), they
  // meet here (a barrier the watchdog guards, should one rank not have thrown after all) and
  // leave through MPI_Finalize, none killed while a peer still touches its buffers.
  if (agreed && world_size > 1) {
    std::fflush(stderr);
    jumbo::mpi_world()->barrier();
  }
  if (failed && world_size > 1) {
    std::fflush(stderr);
    jumbo::mpi_abort(code);  // the other ranks must not wait for this one
  }
  jumbo::mpi_finalize();
  return code;
}
