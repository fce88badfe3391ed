#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/bench/bench.h"
#include "jumbo/bench/bench_comm.h"
#include "jumbo/bench/bench_machine.h"
#include "jumbo/bench/bench_generate.h"
#include "jumbo/bench/load_generator.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/config/gpus.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/runtime/device.h"
#include "jumbo/runtime/peak.h"
#include "flags.h"
#include "verbs.h"

namespace jumbo::cli {

// Writes `text` to PATH.partial, then renames it over PATH: a failed write leaves what was
// there. Throws UserError naming the path and the system's reason.
void write_text_file(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      const int err = errno;
      std::remove(partial.c_str());
      throw UserError(fmt::format("{}: cannot write: {}", path, std::strerror(err)));
    }
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(partial.c_str());
    throw UserError(fmt::format("{}: cannot write: {}", path, std::strerror(err)));
  }
}

void add_bench_verb(CLI::App& app, VerbRunner& run) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (kernels: build/benchmarks/bench_kernels)");
  bench->require_subcommand(1);

  struct Args {
    std::string model, config;
    std::vector<std::string> overrides;
    TrainBenchOptions opts;
    RunBenchOptions run;
  };
  auto args = std::make_shared<Args>();
  CLI::App* train = bench->add_subcommand(
      "train", "full training steps: tokens/s and MFU of a model preset on one rank, or "
               "(--config) a run's model and layout on every MPI rank against the plan");
  CLI::Option* model = train->add_option("-m,--model", args->model, "model preset TOML");
  CLI::Option* config = train->add_option(
      "-c,--config", args->config,
      "run config TOML: its model, layout, global batch and train.device on every rank "
      "(synthetic tokens; no data, no checkpoint), timed against jumbo plan's estimate");
  model->excludes(config);
  train->add_option("--set", args->overrides, "override a key of the run config (repeatable)")
      ->needs(config);
  const std::vector<CLI::Option*> preset_only = {
      add_min_flag<int64_t>(*train, "--micro-batch", args->opts.micro_batch, 1, "sequences"),
      add_min_flag<int64_t>(*train, "--seq", args->opts.seq, 1, "tokens per sequence"),
      add_min_flag<int64_t>(*train, "--micro-steps", args->opts.micro_steps, 1,
                            "microbatches per step"),
      add_choice_flag(*train, "--precision", args->opts.precision, "fp32 or bf16"),
      train->add_option("--peak-tflops", args->opts.peak_tflops,
                        "0 = the GPU's bf16 peak, or measure this machine's fp32 peak")
          ->capture_default_str(),
      add_choice_flag(*train, "--device", args->opts.device, "cpu or cuda")};
  for (CLI::Option* o : preset_only) o->excludes(config);
  add_min_flag<int64_t>(*train, "--steps", args->opts.steps, 1, "timed steps");
  add_min_flag<int64_t>(*train, "--warmup", args->opts.warmup_steps, 0, "untimed steps");
  train->add_option("--gpu", args->run.gpu,
                    "--config: the GPU type of the plan's estimate (default: train.gpu, else "
                    "a100-40gb): " + known_gpu_names())
      ->needs(config);
  train->add_option("--nodes", args->run.nodes, "--config: nodes of the plan (ranks = nodes x "
                                                "GPUs per node)")
      ->capture_default_str()
      ->needs(config);
  train->add_option("--machine", args->run.machine,
                    "--config: a machine description (jumbo bench comm --write-machine) for the "
                    "plan's estimate instead of --gpu's; on a CPU run too")
      ->needs(config);
  train->add_option("--gpus-per-node", args->run.gpus_per_node,
                    "--config: ranks per node of the plan (default: ranks / nodes)")
      ->needs(config);
  train->callback([&run, args] {
    run = [args] {
      if (args->model.empty() == args->config.empty()) {
        throw UserError("bench train: give --model PRESET (one rank) or --config RUN.toml (the "
                        "run's layout on every rank)");
      }
      if (!args->config.empty()) {
        const RunConfig cfg = load_run_config(args->config, args->overrides);
        // Before a device is opened, as `jumbo train` (rank 0's stage options).
        check_device_supports(cfg, plan_stage(cfg, GridCoords{}).model, cfg.parallel.device);
        args->run.steps = args->opts.steps;
        args->run.warmup_steps = args->opts.warmup_steps;
        auto backend = make_backend(cfg.parallel.device);
        auto world = make_world_comm(*backend, cfg.comm.emulate);
        const RunBenchResult r = bench_run(cfg, args->run, *backend, world);
        if (world->rank() == 0) fmt::print("{}\n", describe(r, cfg, args->run));
        return 0;
      }
      ModelConfig m = load_model_config(args->model);
      auto backend = make_backend(args->opts.device);
      const TrainBenchResult r = bench_train(m, args->opts, *backend);
      fmt::print("{}\n", describe(r, m, args->opts));
      return 0;
    };
  });

  struct GenArgs {
    std::string model;
    GenerateBenchOptions opts;
  };
  auto gen = std::make_shared<GenArgs>();
  CLI::App* generate = bench->add_subcommand(
      "generate", "generation: prefill and decode tokens/s, batch-1 decode against the measured "
                  "memory bandwidth");
  generate->add_option("-m,--model", gen->model, "model preset TOML")->required();
  generate->add_option("--batch", gen->opts.batches, "batch sizes")->capture_default_str();
  add_min_flag<int64_t>(*generate, "--prompt", gen->opts.prompt_tokens, 1,
                        "prompt tokens per sequence");
  add_min_flag<int64_t>(*generate, "--new-tokens", gen->opts.new_tokens, 2,
                        "tokens generated per sequence");
  add_min_flag<int64_t>(*generate, "--repeats", gen->opts.repeats, 1, "timed repeats (median)");
  add_min_flag<int64_t>(*generate, "--prefill-chunk", gen->opts.prefill_chunk, 0,
                        "prompt rows one step may add (0 = every prompt of the largest batch "
                        "at once)");
  add_choice_flag(*generate, "--precision", gen->opts.precision, "fp32 or bf16");
  add_min_flag<int64_t>(*generate, "--adapters", gen->opts.adapters, 0,
                        "also run each batch over this many random LoRA adapters, round-robin "
                        "in one decode batch (serve --adapter)");
  add_min_flag<int64_t>(*generate, "--lora-rank", gen->opts.lora_rank, 1,
                        "the adapters' rank (on every map)");
  generate->callback([&run, gen] {
    run = [gen] {
      for (int64_t b : gen->opts.batches) {
        if (b < 1) throw UserError(fmt::format("--batch {}: expected >= 1", b));
      }
      const ModelConfig m = load_model_config(gen->model);
      auto backend = make_cpu_backend();
      const GenerateBenchResult r = bench_generate(m, gen->opts, *backend, mpi_world());
      fmt::print("{}\n", describe(r, m, gen->opts));
      return 0;
    };
  });

  auto ck = std::make_shared<std::pair<std::string, CkptBenchOptions>>();
  CLI::App* ckpt = bench->add_subcommand("ckpt", "checkpoint save and load: MiB/s against a plain "
                                                 "write of the same bytes");
  ckpt->add_option("-m,--model", ck->first, "model preset TOML")->required();
  ckpt->add_option("--dir", ck->second.dir, "directory (or s3:// prefix) to write into")
      ->required();
  ckpt->add_option("--tp", ck->second.layout.tp)->capture_default_str();
  ckpt->add_option("--pp", ck->second.layout.pp)->capture_default_str();
  ckpt->add_flag("--zero1", ck->second.layout.zero1, "every dp rank saves its optimizer slice");
  ckpt->add_flag("--async", ck->second.async, "write from a background thread");
  ckpt->add_option("--repeats", ck->second.repeats)->capture_default_str();
  ckpt->callback([&run, ck] {
    run = [ck] {
      auto world = mpi_world();
      const CkptBenchResult r =
          bench_checkpoint(load_model_config(ck->first), ck->second, *world);
      if (world->rank() == 0) fmt::print("{}\n", describe(r, ck->second, world->size()));
      return 0;
    };
  });

  struct CommArgs {
    CommBenchOptions opts;
    Device device = Device::cpu;
    std::string write_machine;
  };
  auto cm = std::make_shared<CommArgs>();
  CLI::App* comm = bench->add_subcommand(
      "comm", "collectives over a layout's tp, dp and pp groups and the world (under mpirun or "
              "srun): time, algorithm and bus bandwidth by size, as nccl-tests reports them");
  add_min_flag<int64_t>(*comm, "--tp", cm->opts.tp, 1, "tensor-parallel ranks of the layout");
  add_min_flag<int64_t>(*comm, "--pp", cm->opts.pp, 1, "pipeline stages of the layout");
  add_min_flag<int64_t>(*comm, "--min-bytes", cm->opts.min_bytes, 4, "the smallest size");
  add_min_flag<int64_t>(*comm, "--max-bytes", cm->opts.max_bytes, 4,
                        "the largest size (sizes double from the smallest)");
  add_min_flag<int64_t>(*comm, "--iters", cm->opts.iters, 1, "timed operations per size (at most)");
  add_min_flag<int64_t>(*comm, "--warmup", cm->opts.warmup, 0, "untimed operations per size");
  comm->add_option("--seconds-per-size", cm->opts.seconds_per_size,
                   "fewer iterations once a size's take longer than this")->capture_default_str();
  add_choice_flag(*comm, "--device", cm->device, "cpu (MPI) or cuda (NCCL)");
  comm->add_option("--write-machine", cm->write_machine,
                   "also time the ranks of each host and one rank per host (both levels, "
                   "whatever the layout), measure every rank's FMA peak, GEMM rate and memory "
                   "bandwidth, and write a machine description for jumbo plan --machine "
                   "(docs/plan.md)");
  comm->callback([&run, cm] {
    run = [cm] {
      auto backend = make_backend(cm->device);
      auto world = make_world_comm(*backend, CommEmulation::none);
      cm->opts.levels = !cm->write_machine.empty();
      const std::vector<CommBenchRow> rows = bench_comm(cm->opts, *backend, world);
      if (world->rank() == 0) {
        fmt::print("{}\n", describe(rows, cm->opts, world->size(), to_string(cm->device)));
      }
      if (!cm->write_machine.empty()) {
        const CommBenchOptions& o = cm->opts;
        const std::string command = fmt::format(
            "jumbo bench comm --tp {} --pp {} --min-bytes {} --max-bytes {} on {} ranks", o.tp,
            o.pp, o.min_bytes, o.max_bytes, world->size());
        const Machine m = measure_machine(rows, *backend, *world, command);
        if (world->rank() == 0) {
          write_text_file(cm->write_machine, machine_toml(m));
          fmt::print("wrote {}: {}\n", cm->write_machine, m.source);
        }
      }
      return 0;
    };
  });

  auto sv = std::make_shared<std::pair<ServeBenchOptions, bool>>();  // options, --json
  CLI::App* serve = bench->add_subcommand(
      "serve", "jumbo serve under load on loopback: tokens/s, TTFT and inter-token latency per "
               "concurrency; batch decode against the engine alone (docs/serve.md)");
  serve->add_option("--checkpoint", sv->first.checkpoint, "checkpoint the server loads")
      ->required();
  serve->add_option("--concurrency", sv->first.concurrency, "client threads, one level each")
      ->delimiter(',')->capture_default_str();
  serve->add_option("--requests", sv->first.requests, "requests per level")->capture_default_str();
  CLI::Option* rate = serve->add_option(
      "--rate", sv->first.rate, "Poisson arrivals per second (default: closed loop)");
  serve->add_option("--prompt-tokens", sv->first.prompt_tokens,
                    "prompt lengths; each request draws one")
      ->delimiter(',')
      ->capture_default_str();
  serve->add_option("--output-tokens", sv->first.output_tokens,
                    "max_tokens values; each request draws one")
      ->delimiter(',')
      ->capture_default_str();
  serve->add_option("--seed", sv->first.seed)->capture_default_str();
  serve->add_option("--max-batch", sv->first.max_batch,
                    "the server's --max-batch, and the batch of the overhead run")
      ->capture_default_str();
  serve->add_flag("--json", sv->second, "one JSON line at the end");
  serve->callback([&run, sv, rate] {
    run = [sv, rate] {
      ServeBenchOptions& o = sv->first;
      auto at_least = [](const char* flag, const std::vector<int64_t>& v, int64_t low) {
        if (v.empty()) throw UserError(fmt::format("{}: expected at least one value", flag));
        for (int64_t x : v) {
          if (x < low) throw UserError(fmt::format("{} {}: expected integers >= {}", flag, x, low));
        }
      };
      at_least("--concurrency", o.concurrency, 1);
      at_least("--requests", {o.requests}, 1);
      at_least("--prompt-tokens", o.prompt_tokens, 1);
      at_least("--output-tokens", o.output_tokens, 1);
      at_least("--max-batch", {o.max_batch}, 1);
      if (*std::max_element(o.output_tokens.begin(), o.output_tokens.end()) < 2) {
        throw UserError("--output-tokens: expected one value >= 2 (the decode comparison)");
      }
      if (rate->count() > 0 && !(o.rate > 0 && std::isfinite(o.rate))) {
        throw UserError(fmt::format("--rate {}: expected requests per second > 0", o.rate));
      }
      if (mpi_world()->size() > 1) {
        throw UserError("bench serve: run it as one process (it starts jumbo serve itself)");
      }
      const ServeBenchResult r = bench_serve(o);
      fmt::print("{}", describe(r, o));
      if (sv->second) fmt::print("{}\n", to_json_line(r, o));
      return r.errors() > 0 ? 1 : 0;
    };
  });

  auto seconds = std::make_shared<double>(1.0);
  CLI::App* peak = bench->add_subcommand("peak", "this machine's fp32 FMA peak");
  peak->add_option("--seconds", *seconds)->capture_default_str();
  peak->callback([&run, seconds] {
    run = [seconds] {
      fmt::print("fp32 peak: {:.1f} GFLOP/s ({} FMA loop on every OpenMP thread)\n",
                 measure_fp32_peak_gflops(*seconds), fp32_peak_kernel());
      return 0;
    };
  });
}

}  // namespace jumbo::cli
