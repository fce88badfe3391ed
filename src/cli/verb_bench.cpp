#include <fmt/format.h>

#include <string>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/config/config.h"
#include "jumbo/obs/peak.h"
#include "jumbo/infer/bench_generate.h"
#include "jumbo/train/bench.h"
#include "jumbo/train/device.h"
#include "verbs.h"

namespace jumbo::cli {

void add_bench_verb(CLI::App& app, VerbRunner& run) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (kernels: build/benchmarks/bench_kernels)");
  bench->require_subcommand(1);

  struct Args {
    std::string model;
    std::string precision = "fp32", device = "cpu";
    TrainBenchOptions opts;
  };
  auto args = std::make_shared<Args>();
  CLI::App* train = bench->add_subcommand("train", "full training steps: tokens/s and MFU");
  train->add_option("-m,--model", args->model, "model preset TOML")->required();
  train->add_option("--micro-batch", args->opts.micro_batch)->capture_default_str();
  train->add_option("--seq", args->opts.seq)->capture_default_str();
  train->add_option("--micro-steps", args->opts.micro_steps, "microbatches per step")
      ->capture_default_str();
  train->add_option("--steps", args->opts.steps, "timed steps")->capture_default_str();
  train->add_option("--warmup", args->opts.warmup_steps, "untimed steps")->capture_default_str();
  train->add_option("--precision", args->precision, "fp32 or bf16")->capture_default_str();
  train->add_option("--peak-tflops", args->opts.peak_tflops,
                    "0 = the GPU's bf16 peak, or measure this machine's fp32 peak")
      ->capture_default_str();
  train->add_option("--device", args->device, "cpu or cuda")->capture_default_str();
  train->callback([&run, args] {
    run = [args] {
      if (args->precision != "fp32" && args->precision != "bf16") {
        throw UserError(fmt::format("--precision {}: expected fp32 or bf16", args->precision));
      }
      if (args->opts.micro_batch < 1 || args->opts.seq < 1 || args->opts.steps < 1 ||
          args->opts.micro_steps < 1 || args->opts.warmup_steps < 0) {
        throw UserError("bench train: --micro-batch, --seq, --steps and --micro-steps must be "
                        ">= 1, --warmup >= 0");
      }
      if (args->device != "cpu" && args->device != "cuda") {
        throw UserError(fmt::format("--device {}: expected cpu or cuda", args->device));
      }
      args->opts.precision = args->precision == "bf16" ? Precision::bf16 : Precision::fp32;
      args->opts.device = args->device == "cuda" ? Device::cuda : Device::cpu;
      ModelConfig m = load_model_config(args->model);
      auto backend = make_backend(args->opts.device);
      const TrainBenchResult r = bench_train(m, args->opts, *backend);
      fmt::print("{}\n", describe(r, m, args->opts));
      return 0;
    };
  });

  struct GenArgs {
    std::string model, precision = "fp32";
    GenerateBenchOptions opts;
  };
  auto gen = std::make_shared<GenArgs>();
  CLI::App* generate = bench->add_subcommand(
      "generate", "generation: prefill and decode tokens/s, batch-1 decode against the measured "
                  "memory bandwidth");
  generate->add_option("-m,--model", gen->model, "model preset TOML")->required();
  generate->add_option("--batch", gen->opts.batches, "batch sizes")->capture_default_str();
  generate->add_option("--prompt", gen->opts.prompt_tokens, "prompt tokens per sequence")
      ->capture_default_str();
  generate->add_option("--new-tokens", gen->opts.new_tokens, "tokens generated per sequence")
      ->capture_default_str();
  generate->add_option("--repeats", gen->opts.repeats, "timed repeats (median)")->capture_default_str();
  generate->add_option("--precision", gen->precision, "fp32 or bf16")->capture_default_str();
  generate->callback([&run, gen] {
    run = [gen] {
      if (gen->precision != "fp32" && gen->precision != "bf16") {
        throw UserError(fmt::format("--precision {}: expected fp32 or bf16", gen->precision));
      }
      for (int64_t b : gen->opts.batches) {
        if (b < 1) throw UserError(fmt::format("--batch {}: expected >= 1", b));
      }
      if (gen->opts.prompt_tokens < 1 || gen->opts.new_tokens < 2 || gen->opts.repeats < 1) {
        throw UserError("bench generate: --prompt >= 1, --new-tokens >= 2, --repeats >= 1");
      }
      gen->opts.precision = gen->precision == "bf16" ? Precision::bf16 : Precision::fp32;
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
