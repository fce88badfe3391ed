// jumbo ckpt: offline checkpoint tools, one function per subcommand. PATH is a checkpoint
// directory or a checkpoint root (its `latest`), local or s3:// (S3 settings from the AWS_*
// environment variables only). inspect, export and import run in one process, without mpirun.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "jumbo/ckpt/inspect.h"
#include "jumbo/ckpt/resolve.h"
#include "jumbo/ckpt/safetensors.h"
#include "jumbo/comm/comm.h"
#include "jumbo/infer/checkpoint_weights.h"
#include "jumbo/infer/export_hf.h"
#include "jumbo/infer/merge_lora.h"
#include "jumbo/infer/import_hf.h"
#include "jumbo/train/reshard.h"
#include "verbs.h"

namespace jumbo::cli {
namespace {

// Empty fields: the storage falls back to AWS_REGION, AWS_ENDPOINT_URL_S3 and the like.
S3Options s3_from_environment() { return S3Options{}; }

void add_inspect(CLI::App& ckpt, VerbRunner& run) {
  struct Args {
    std::string path;
    bool verify = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = ckpt.add_subcommand("inspect", "describe a checkpoint: progress, model, "
                                                 "layout, files, tensors");
  cmd->add_option("path", args->path, "checkpoint directory, or a root holding `latest`")
      ->required();
  cmd->add_flag("--verify", args->verify,
                "read every shard file and check its size, CRC-32 and pieces");
  cmd->callback([&run, args] {
    run = [args] {
      const ResolvedCheckpoint ckpt = resolve_checkpoint(args->path, s3_from_environment());
      try {
        fmt::print("{}", inspect_checkpoint(ckpt, args->verify, gpt_tensor_listing()));
      } catch (const CheckpointVerifyError& e) {
        fmt::print("{}", e.report);  // the report names each bad file; the error sums up
        std::fflush(stdout);
        throw;
      }
      return 0;
    };
  });
}

void add_export(CLI::App& ckpt, VerbRunner& run) {
  struct Args {
    std::string path, format, output, dtype = "f32", tokenizer, max_shard_size = "5GB";
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = ckpt.add_subcommand("export", "write the master weights of full tensors for "
                                                "use outside jumbo: one safetensors file, a "
                                                "Hugging Face directory (Llama family or GPT-2) "
                                                "or a PEFT adapter");
  cmd->add_option("path", args->path, "checkpoint directory, or a root holding `latest`")
      ->required();
  cmd->add_option("--format", args->format,
                  "safetensors (jumbo's names, one file), hf (a Hugging Face Llama, Mistral or "
                  "Qwen2 directory: config.json, sharded safetensors, tokenizer; a LoRA "
                  "checkpoint merged), peft (a LoRA checkpoint's adapters as PEFT's "
                  "adapter_config.json + adapter_model.safetensors) or hf-gpt2 (a Hugging Face "
                  "GPT-2 directory)")->required();
  cmd->add_option("-o,--output", args->output,
                  "the file (safetensors) or directory (hf, peft, hf-gpt2) to write")->required();
  cmd->add_option("--max-shard-size", args->max_shard_size,
                  "hf: the largest safetensors file, as transformers' max_shard_size (\"5GB\", "
                  "\"500MB\", or bytes)")->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "f32 or bf16 (rounded to nearest even)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "hf-gpt2: the SentencePiece model to copy (default: the checkpoint's "
                  "data.tokenizer)");
  cmd->callback([&run, args] {
    run = [args] {
      const bool hf = args->format == "hf-gpt2";
      const bool llama = args->format == "hf" || args->format == "peft";
      if (!hf && !llama && args->format != "safetensors") {
        // "the only format is safetensors" stays a prefix: tests/ckpt/tools.sh matches it.
        throw UserError(fmt::format("jumbo ckpt export: --format {}: the only format is "
                                    "safetensors, hf, peft or hf-gpt2", args->format));
      }
      const int64_t max_shard = parse_shard_size(args->max_shard_size);
      if (max_shard <= 0) {
        throw UserError(fmt::format("jumbo ckpt export: --max-shard-size {}: expected a size "
                                    "such as 5GB, 500MB or a number of bytes",
                                    args->max_shard_size));
      }
      if (args->dtype != "f32" && args->dtype != "bf16") {
        throw UserError(fmt::format("jumbo ckpt export: --dtype {}: expected f32 or bf16",
                                    args->dtype));
      }
      if (!hf && !args->tokenizer.empty()) {
        throw UserError("jumbo ckpt export: --tokenizer: only with --format hf-gpt2 (a "
                        "safetensors file holds weights only)");
      }
      const auto t0 = std::chrono::steady_clock::now();
      const ResolvedCheckpoint ckpt = resolve_checkpoint(args->path, s3_from_environment());
      auto secs = [&t0] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      if (llama) {
        const HfExportOptions o{args->output, args->dtype, max_shard};
        const HfExportStats s = args->format == "hf" ? export_hf(ckpt, o) : export_peft(ckpt, o);
        if (args->format == "hf") {
          fmt::print("wrote {}: Hugging Face {} (config.json, {} safetensors file{}: {} tensors, "
                     "{} parameters, {}; the tokenizer files; EOS id {}{}), from {} (step {}) "
                     "in {:.1f} s\n", args->output, hf_architecture_name(s.architecture),
                     s.files.size(), s.files.size() == 1 ? "" : "s", s.tensors, s.parameters,
                     args->dtype, s.eos_id,
                     s.merged_maps > 0 ? fmt::format("; {} LoRA maps merged", s.merged_maps) : "",
                     ckpt.storage->url(ckpt.dir), ckpt.manifest.progress.step, secs());
        } else {
          fmt::print("wrote {}: PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors:"
                     " {} tensors, {} parameters, r {}, alpha {}), from {} (step {}) in {:.1f} s\n",
                     args->output, s.tensors, s.parameters, ckpt.manifest.lora.rank,
                     ckpt.manifest.lora.alpha, ckpt.storage->url(ckpt.dir),
                     ckpt.manifest.progress.step, secs());
        }
        return 0;
      }
      if (hf) {
        const HfGpt2Stats s =
            export_hf_gpt2(ckpt, {args->output, args->dtype, args->tokenizer});
        fmt::print("wrote {}: Hugging Face GPT-2 (config.json, model.safetensors: {} tensors, "
                   "{} parameters, {}, {:.1f} MiB; tokenizer.model from {}, EOS id {}), from {} "
                   "(step {}) in {:.1f} s\n", args->output, s.weights.tensors,
                   s.weights.parameters, args->dtype,
                   static_cast<double>(s.weights.bytes) / (1 << 20), s.tokenizer, s.eos_id,
                   ckpt.storage->url(ckpt.dir), ckpt.manifest.progress.step, secs());
        return 0;
      }
      const ExportStats s = export_safetensors(*ckpt.storage, ckpt.dir, ckpt.manifest,
                                               args->output, args->dtype, gpt_tensor_listing());
      fmt::print("wrote {}: {} tensors, {} parameters, {}, {:.1f} MiB, from {} (step {}) in "
                 "{:.1f} s\n", args->output, s.tensors, s.parameters, args->dtype,
                 static_cast<double>(s.bytes) / (1 << 20), ckpt.storage->url(ckpt.dir),
                 ckpt.manifest.progress.step, secs());
      return 0;
    };
  });
}

// The inverse of `export --format hf-gpt2`: a Hugging Face GPT-2 directory as a checkpoint.
void add_import(CLI::App& ckpt, VerbRunner& run) {
  struct Args {
    std::string source, format, output, tokenizer;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = ckpt.add_subcommand("import", "write a checkpoint (step 0, tp 1 x pp 1 x dp 1) "
                                                "from a Hugging Face directory (Llama, Mistral, "
                                                "Qwen2 or GPT-2)");
  cmd->add_option("dir", args->source, "the Hugging Face directory: config.json, "
                                       "model.safetensors (or its index and shards), the "
                                       "tokenizer")->required();
  cmd->add_option("--format", args->format, "hf (LlamaForCausalLM, MistralForCausalLM, "
                                            "Qwen2ForCausalLM) or hf-gpt2 (GPT-2)")
      ->required();
  cmd->add_option("-o,--output", args->output,
                  "the checkpoint root to create (missing or empty): receives step_00000000/ "
                  "and tokenizer.model")->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "the SentencePiece model to record (default: DIR/tokenizer.model); needed "
                  "when DIR holds only GPT-2's BPE files; its vocabulary must be vocab_size");
  cmd->callback([&run, args] {
    run = [args] {
      if (args->format != "hf-gpt2" && args->format != "hf") {
        throw UserError(fmt::format("jumbo ckpt import: --format {}: expected hf or hf-gpt2",
                                    args->format));
      }
      const auto t0 = std::chrono::steady_clock::now();
      if (args->format == "hf") {
        if (!args->tokenizer.empty()) {
          throw UserError("jumbo ckpt import: --tokenizer: only with --format hf-gpt2 (--format "
                          "hf takes the model's own tokenizer.json or tokenizer.model)");
        }
        const HfImportStats s = import_hf({args->source, args->output});
        if (!s.ignored.empty()) {
          fmt::print("{}/config.json: ignored (they do not change the computation): {}\n",
                     args->source, fmt::join(s.ignored, ", "));
        }
        const ModelConfig& m = s.model;
        fmt::print("imported {}: {} of {} layers, d_model {}, {} heads ({} kv), ffn {}, vocab {} "
                   "(padded {}), context {} ({} tensors from {} file{}, {} parameters, {}) to {} "
                   "({:.1f} MiB; {}{}) in {:.1f} s\n", args->source,
                   hf_architecture_name(s.architecture), m.layers, m.d_model, m.heads,
                   m.kv_head_count(), m.ffn_dim(), m.vocab, m.padded_vocab(), m.context,
                   s.tensors, s.files, s.files == 1 ? "" : "s", s.parameters, s.dtypes,
                   s.checkpoint_dir, static_cast<double>(s.bytes) / (1 << 20),
                   fmt::join(s.copied, ", "), s.chat_template ? "; its chat template recorded" : "",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        return 0;
      }
      const HfGpt2ImportStats s = import_hf_gpt2({args->source, args->output, args->tokenizer});
      const ModelConfig& m = s.model;
      fmt::print("imported {}: GPT-2 of {} layers, d_model {}, {} heads, ffn {}, vocab {} (padded "
                 "{}), context {} ({} tensors, {} parameters, {}) to {} ({:.1f} MiB; "
                 "tokenizer.model from {}) in {:.1f} s\n", args->source, m.layers, m.d_model,
                 m.heads, m.ffn_dim(), m.vocab, m.padded_vocab(), m.context, s.tensors,
                 s.parameters, s.dtypes, s.checkpoint_dir,
                 static_cast<double>(s.bytes) / (1 << 20), s.tokenizer_from,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return 0;
    };
  });
}

void add_merge(CLI::App& ckpt, VerbRunner& run) {
  struct Args {
    std::string adapter, output;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = ckpt.add_subcommand("merge", "write a full checkpoint (step 0, tp 1 x pp 1 x "
                                               "dp 1) of a LoRA checkpoint merged into its base");
  cmd->add_option("--adapter", args->adapter, "the LoRA run's checkpoint (a step directory or a "
                                              "root's latest); its base is its init_from")
      ->required();
  cmd->add_option("-o,--output", args->output, "the checkpoint root to create (missing or empty)")
      ->required();
  cmd->callback([&run, args] {
    run = [args] {
      const auto t0 = std::chrono::steady_clock::now();
      const LoraMergeStats s = merge_lora(args->adapter, args->output, S3Options{});
      fmt::print("merged {} (LoRA rank {}, alpha {}, {} adapter parameters) into {}: {} weights "
                 "changed; wrote {} ({:.1f} MiB) in {:.1f} s\n", s.adapter, s.lora.rank,
                 s.lora.alpha, s.adapter_params, s.base, s.merged_maps, s.checkpoint_dir,
                 static_cast<double>(s.bytes) / (1 << 20),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return 0;
    };
  });
}

// Re-shards a checkpoint for another layout; runs alone or under mpirun (target files are
// dealt to the ranks).
void add_convert(CLI::App& ckpt, VerbRunner& run) {
  struct Args {
    std::string path, output;
    Layout layout;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = ckpt.add_subcommand("convert", "write a checkpoint for another layout (tp, pp, "
                                                 "dp, ZeRO-1), to a directory or s3:// prefix");
  cmd->add_option("path", args->path, "checkpoint directory, or a root holding `latest`")
      ->required();
  cmd->add_option("-o,--output", args->output, "checkpoint root that receives step_N/")
      ->required();
  cmd->add_option("--tp", args->layout.tp, "tensor-parallel size")->capture_default_str();
  cmd->add_option("--pp", args->layout.pp, "pipeline stages")->capture_default_str();
  cmd->add_option("--dp", args->layout.dp, "data-parallel size")->capture_default_str();
  cmd->add_flag("--zero1", args->layout.zero1, "each dp rank saves its optimizer slice");
  cmd->add_option("--virtual-stages", args->layout.virtual_stages,
                  "model chunks per pipeline rank")->capture_default_str();
  cmd->add_option("--bucket-size", args->layout.bucket_size,
                  "ZeRO-1 bucket size in elements")->capture_default_str();
  cmd->callback([&run, args] {
    run = [args] {
      const auto t0 = std::chrono::steady_clock::now();
      auto world = mpi_world();
      const ReshardStats s = reshard_checkpoint(args->path, args->output, args->layout, *world,
                                                s3_from_environment());
      const double total = world->all_reduce_scalar(static_cast<double>(s.bytes), ReduceOp::sum);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (world->rank() == 0) {
        fmt::print("converted {} to {} for tp {} x pp {} x dp {}{}: {:.1f} MiB in {:.1f} s\n",
                   args->path, args->output, args->layout.tp, args->layout.pp, args->layout.dp,
                   args->layout.zero1 ? ", ZeRO-1" : "", total / (1 << 20), secs);
      }
      return 0;
    };
  });
}

}  // namespace

void add_ckpt_verb(CLI::App& app, VerbRunner& run) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "inspect, verify, export and import checkpoints");
  ckpt->require_subcommand(1);
  add_inspect(*ckpt, run);
  add_export(*ckpt, run);
  add_merge(*ckpt, run);
  add_import(*ckpt, run);
  add_convert(*ckpt, run);
}

}  // namespace jumbo::cli
