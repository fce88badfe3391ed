// `jumbo ckpt export --format hf` and `--format peft`: a Llama-family checkpoint (or a LoRA
// checkpoint, merged into its base tensor by tensor) as a Hugging Face directory, as
// save_pretrained writes it; or a LoRA checkpoint's adapters as a PEFT adapter directory.
// Streamed: each jumbo tensor is read whole from the checkpoint's pieces, its HF tensors
// written to their places in the output files, and dropped. docs/hf-export.md.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "jumbo/ckpt/safetensors_shards.h"
#include "jumbo/ckpt/tensor_reader.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/export_hf.h"
#include "jumbo/infer/hf_llama.h"
#include "jumbo/infer/merge_lora.h"
#include "jumbo/model/checkpoint_names.h"
#include "jumbo/model/lora.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

// -o: a local directory, created if missing. Returns whether it existed.
bool prepare_out_dir(const std::string& dir, const char* what) {
  if (dir.empty() || is_s3_url(dir)) {
    throw UserError(fmt::format("-o {}: expected a local directory ({} writes a directory of "
                                "files)", dir, what));
  }
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  if (existed && !fs::is_directory(dir, ec)) {
    throw UserError(fmt::format("-o {}: exists and is not a directory", dir));
  }
  fs::create_directories(dir, ec);
  if (ec) throw UserError(fmt::format("-o {}: cannot create the directory ({})", dir, ec.message()));
  return existed;
}

SafetensorsOutDtype out_dtype(const std::string& dtype) {
  if (dtype == "f32") return SafetensorsOutDtype::f32;
  if (dtype == "bf16") return SafetensorsOutDtype::bf16;
  throw UserError(fmt::format("--dtype {}: expected f32 or bf16", dtype));
}

// A LoRA checkpoint's adapters, read lazily, and its base.
struct Adapters {
  ResolvedCheckpoint base;
  std::unique_ptr<CheckpointTensorReader> reader;
  const Manifest* manifest = nullptr;
};

void write_text(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out.flush()) throw UserError(fmt::format("{}: cannot write", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw UserError(fmt::format("{}: cannot rename ({})", tmp, ec.message()));
}

// The tokenizer files beside the checkpoint's tokenizer (an import copied the model's there),
// or, for a SentencePiece model jumbo trained, that model and a LlamaTokenizer config.
int32_t write_tokenizer_files(const Manifest& m, const fs::path& out, int32_t& bos) {
  const fs::path tok_path = m.tokenizer;
  if (!fs::is_regular_file(tok_path)) {
    throw UserError(fmt::format("{}: the checkpoint's tokenizer (data.tokenizer) is missing",
                                tok_path.string()));
  }
  const Tokenizer tok(tok_path.string());
  bos = tok.bos_id();
  const bool json_tokenizer = tok_path.extension() == ".json";
  write_text(out / (json_tokenizer ? "tokenizer.json" : "tokenizer.model"),
             read_file(tok_path.string(), "the checkpoint's tokenizer"));
  bool has_config = false;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    const fs::path beside = tok_path.parent_path() / name;
    if (!fs::is_regular_file(beside)) continue;
    write_text(out / name, read_file(beside.string(), name));
    has_config = has_config || std::string(name) == "tokenizer_config.json";
  }
  if (!has_config) {  // SentencePiece trained by jumbo: transformers' plain Llama tokenizer
    const std::string eos = tok.piece(tok.eos_id());
    const ordered_json tc = {{"tokenizer_class", "LlamaTokenizer"}, {"add_bos_token", false},
                             {"add_eos_token", false},  {"legacy", true},
                             {"model_max_length", m.model.context},
                             {"bos_token", eos}, {"eos_token", eos}};
    write_text(out / "tokenizer_config.json", tc.dump(2) + "\n");
  }
  if (!fs::is_regular_file(out / "generation_config.json")) {
    ordered_json gc = {{"bos_token_id", bos >= 0 ? ordered_json(bos) : ordered_json(nullptr)},
                       {"eos_token_id", tok.eos_id()}, {"transformers_version", "4.46.0"}};
    write_text(out / "generation_config.json", gc.dump(2) + "\n");
  }
  return tok.eos_id();
}

}  // namespace

HfExportStats export_hf(const ResolvedCheckpoint& ckpt, const HfExportOptions& opts) {
  const SafetensorsOutDtype dtype = out_dtype(opts.dtype);
  const Manifest& m = ckpt.manifest;
  const std::string where = ckpt.storage->url(ckpt.dir);
  const HfArchitecture arch = hf_architecture_of(m.model, where);
  // A LoRA checkpoint holds adapters: the weights are its base's, merged as they are read.
  Adapters lora;
  const ResolvedCheckpoint* weights = &ckpt;
  if (m.lora.rank > 0) {
    if (m.init_from.from.empty()) check_adapter_base(m, where, Manifest{}, "");
    lora.base = resolve_checkpoint(m.init_from.from, S3Options{});
    check_adapter_base(m, where, lora.base.manifest, "the base " + m.init_from.from);
    lora.reader = std::make_unique<CheckpointTensorReader>(*ckpt.storage, ckpt.dir, m);
    lora.manifest = &m;
    weights = &lora.base;
  }
  const std::vector<HfTensor> table = hf_llama_table(m.model);
  std::map<std::string, std::vector<const HfTensor*>> by_jumbo;
  std::vector<std::string> jumbo_order;  // the table's order of first use
  for (const HfTensor& t : table) {
    if (!weights->manifest.tensors.count(t.jumbo_name)) {
      throw UserError(fmt::format("{}: no tensor {}, which {} needs", where, t.jumbo_name, t.hf_name));
    }
    if (!by_jumbo.count(t.jumbo_name)) jumbo_order.push_back(t.jumbo_name);
    by_jumbo[t.jumbo_name].push_back(&t);
  }
  for (const auto& [name, pieces] : weights->manifest.tensors) {
    if (!by_jumbo.count(name)) {
      throw UserError(fmt::format("{}: tensor {} has no Hugging Face counterpart", where, name));
    }
  }
  const bool existed = prepare_out_dir(opts.out_dir, "--format hf");
  HfExportStats stats;
  try {
    std::error_code ec;
    fs::remove(fs::path(opts.out_dir) / "config.json", ec);  // last written: a complete directory
    std::vector<SafetensorsOut> outs;
    for (const HfTensor& t : table) outs.push_back({t.hf_name, t.hf_shape});
    SafetensorsShardWriter writer(opts.out_dir, outs, dtype, opts.max_shard_bytes,
                                  {{"format", "pt"}, {"producer", "jumbo ckpt export"},
                                   {"source", where}});
    CheckpointTensorReader reader(*weights->storage, weights->dir, weights->manifest);
    std::vector<float> hf_values;
    for (const std::string& name : jumbo_order) {
      std::vector<int64_t> shape =
          model_tensor_real_shape(m.model, name,
                                  weights->manifest.tensors.at(name).front().piece.global_shape,
                                  where);
      std::vector<float> values = reader.read(name, shape);
      const int64_t cols = shape.size() == 2 ? shape[1] : 1;
      if (lora.reader) {
        const auto dot = name.find('.', 7);
        const int64_t layer = name.rfind("layers.", 0) == 0 ? std::stoll(name.substr(7, dot - 7)) : -1;
        for (LoraTarget t : kLoraTargets) {
          if (layer < 0 || !m.lora.targets.has(t) || lora_base_name(layer, t) != name) continue;
          const std::string a_name = lora_param_name(layer, t, false), b_name = lora_param_name(layer, t, true);
          const std::vector<int64_t> a_shape = m.tensors.at(a_name).front().piece.global_shape;
          const std::vector<int64_t> b_shape = m.tensors.at(b_name).front().piece.global_shape;
          const std::vector<float> a = lora.reader->read(a_name, a_shape);
          const std::vector<float> b = lora.reader->read(b_name, b_shape);
          add_lora_delta(values.data(), cols, a.data(), b.data(), b_shape[0], a_shape[0],
                         static_cast<float>(m.lora.scale()), lora_delta_rows(m.model, t));
          ++stats.merged_maps;
        }
      }
      for (const HfTensor* t : by_jumbo.at(name)) {
        const int64_t rows = t->hf_shape[0];
        hf_values.resize(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t from = t->jumbo_rows.empty() ? r : t->jumbo_rows[static_cast<size_t>(r)];
          std::copy_n(values.data() + from * cols, cols, hf_values.data() + r * cols);
        }
        writer.write(t->hf_name, hf_values.data());
        stats.parameters += rows * cols;
      }
    }
    stats.files = writer.commit();
    stats.bytes = writer.data_bytes();
    stats.tensors = static_cast<int64_t>(table.size());
    int32_t bos = -1;
    stats.eos_id = write_tokenizer_files(weights->manifest.tokenizer.empty() ? m : weights->manifest,
                                         opts.out_dir, bos);
    stats.architecture = arch;
    write_text(fs::path(opts.out_dir) / "config.json",
               hf_model_config_json(m.model, arch, bos, stats.eos_id,
                                    opts.dtype == "bf16" ? "bfloat16" : "float32").dump(2) + "\n");
  } catch (...) {
    std::error_code ec;
    if (!existed) fs::remove_all(opts.out_dir, ec);
    throw;
  }
  return stats;
}

HfExportStats export_peft(const ResolvedCheckpoint& ckpt, const HfExportOptions& opts) {
  const SafetensorsOutDtype dtype = out_dtype(opts.dtype);
  const Manifest& m = ckpt.manifest;
  const std::string where = ckpt.storage->url(ckpt.dir);
  if (m.lora.rank <= 0) {
    throw UserError(fmt::format("{}: not a LoRA checkpoint (finetune.method = lora): --format "
                                "peft writes a LoRA run's adapters", where));
  }
  hf_architecture_of(m.model, where);
  // PEFT's module names; the fused qkv adapter becomes q, k and v adapters sharing its A (the
  // same function: each gets A and its rows of B).
  struct Part {
    LoraTarget target;
    const char* module;
    std::vector<int64_t> rows;  // of B; empty: all
  };
  std::vector<Part> parts;
  std::set<std::string> modules;
  for (LoraTarget t : kLoraTargets) {
    if (!m.lora.targets.has(t)) continue;
    if (t == LoraTarget::qkv) {
      const char* names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"};
      for (int p = 0; p < 3; ++p) parts.push_back({t, names[p], hf_qkv_rows(m.model, p)});
    } else {
      parts.push_back({t, hf_module_of(t), {}});
    }
  }
  for (const Part& p : parts) modules.insert(std::string(p.module).substr(std::string(p.module).find('.') + 1));
  const bool existed = prepare_out_dir(opts.out_dir, "--format peft");
  HfExportStats stats;
  try {
    CheckpointTensorReader reader(*ckpt.storage, ckpt.dir, m);
    struct Planned {
      std::string name, source;
      std::vector<int64_t> shape;
      const std::vector<int64_t>* rows;
    };
    std::vector<Planned> planned;
    for (int64_t layer = 0; layer < m.model.layers; ++layer) {
      for (const Part& p : parts) {
        const std::string prefix = fmt::format("base_model.model.model.layers.{}.{}", layer, p.module);
        const std::string a = lora_param_name(layer, p.target, false);
        const std::string b = lora_param_name(layer, p.target, true);
        if (!m.tensors.count(a) || !m.tensors.count(b)) {
          throw UserError(fmt::format("{}: no tensor {} or {}", where, a, b));
        }
        std::vector<int64_t> b_shape = m.tensors.at(b).front().piece.global_shape;
        if (!p.rows.empty()) b_shape[0] = static_cast<int64_t>(p.rows.size());
        planned.push_back({prefix + ".lora_A.weight", a, m.tensors.at(a).front().piece.global_shape, nullptr});
        planned.push_back({prefix + ".lora_B.weight", b, b_shape, &p.rows});
      }
    }
    std::vector<SafetensorsOut> outs;
    for (const Planned& p : planned) outs.push_back({p.name, p.shape});
    // PEFT reads one adapter_model.safetensors: never sharded.
    std::error_code ec;
    fs::remove(fs::path(opts.out_dir) / "adapter_model.safetensors", ec);
    SafetensorsShardWriter writer(opts.out_dir, outs, dtype, int64_t{1} << 62, {{"format", "pt"}});
    std::vector<float> buffer;
    for (const Planned& p : planned) {
      const std::vector<float> v = reader.read(p.source, m.tensors.at(p.source).front().piece.global_shape);
      const int64_t cols = p.shape.size() == 2 ? p.shape[1] : 1;
      if (p.rows && !p.rows->empty()) {
        buffer.resize(static_cast<size_t>(p.shape[0] * cols));
        for (int64_t r = 0; r < p.shape[0]; ++r) {
          std::copy_n(v.data() + (*p.rows)[static_cast<size_t>(r)] * cols, cols, buffer.data() + r * cols);
        }
        writer.write(p.name, buffer.data());
      } else {
        writer.write(p.name, v.data());
      }
      stats.parameters += shape_numel(p.shape);
    }
    writer.commit();
    fs::rename(fs::path(opts.out_dir) / "model.safetensors",
               fs::path(opts.out_dir) / "adapter_model.safetensors", ec);
    if (ec) throw UserError(fmt::format("-o {}: cannot rename ({})", opts.out_dir, ec.message()));
    stats.files = {"adapter_model.safetensors"};
    stats.tensors = static_cast<int64_t>(planned.size());
    const ordered_json config = {
        {"base_model_name_or_path", m.init_from.from}, {"bias", "none"},
        {"fan_in_fanout", false}, {"inference_mode", true}, {"init_lora_weights", true},
        {"lora_alpha", m.lora.alpha}, {"lora_dropout", 0.0}, {"modules_to_save", nullptr},
        {"peft_type", "LORA"}, {"r", m.lora.rank}, {"target_modules", modules},
        {"task_type", "CAUSAL_LM"}, {"use_dora", false}, {"use_rslora", false}};
    write_text(fs::path(opts.out_dir) / "adapter_config.json", config.dump(2) + "\n");
  } catch (...) {
    std::error_code ec;
    if (!existed) fs::remove_all(opts.out_dir, ec);
    throw;
  }
  return stats;
}

}  // namespace jumbo
