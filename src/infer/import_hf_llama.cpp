// `jumbo ckpt import --format hf`: a Hugging Face Llama-family directory (config.json, one
// or many safetensors files, tokenizer files) as a jumbo checkpoint, streamed: each jumbo
// tensor is gathered from its HF tensors and written to the shard file before the next is
// read, so memory holds a few tensors whatever the model's size. The names and row layouts
// are infer/hf_llama.h's one table. docs/hf-export.md, "Import".
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "jumbo/ckpt/safetensors_read.h"
#include "jumbo/data/chat_template.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/hf_llama.h"
#include "jumbo/infer/import_hf.h"
#include "jumbo/infer/whole_checkpoint.h"
#include "jumbo/model/checkpoint_names.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/plan/storage.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;

// The tensors of the table, found and checked (name, dtype, byte count, shape), and nothing
// left over but rotary buffers and a tied lm_head.
std::map<std::string, const SafetensorsEntry*> match(const SafetensorsSet& set,
                                                     const std::vector<HfTensor>& table,
                                                     const std::string& dir) {
  std::map<std::string, const SafetensorsEntry*> found;
  const std::string listed_in = set.index.empty() ? (fs::path(dir) / "model.safetensors").string()
                                                  : set.index;
  for (const HfTensor& t : table) {
    const auto it = set.tensors.find(t.hf_name);
    if (it == set.tensors.end()) {
      throw UserError(fmt::format("{}: no tensor {}, which jumbo's {} needs", listed_in,
                                  t.hf_name, t.jumbo_name));
    }
    const SafetensorsEntry& e = it->second;
    const std::string& file = set.file_of(e).path();
    check_float_tensor(e, file);
    if (e.shape != t.hf_shape) {
      throw UserError(fmt::format("{}: tensor {} is [{}]; config.json's model needs [{}]", file,
                                  t.hf_name, fmt::join(e.shape, ", "), fmt::join(t.hf_shape, ", ")));
    }
    found[t.hf_name] = &e;
  }
  for (const auto& [name, e] : set.tensors) {
    if (found.count(name)) continue;
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // a buffer, recomputed
    if (name == "lm_head.weight" && found.count("model.embed_tokens.weight")) {
      continue;  // tied: transformers may save the head too; it is the embedding
    }
    throw UserError(fmt::format("{}: tensor {} has no place in the model of config.json",
                                set.file_of(e).path(), name));
  }
  return found;
}

// DIR/tokenizer.model (SentencePiece: Mistral, Llama 2) or DIR/tokenizer.json (byte-level
// BPE: Llama 3, Qwen 2.5), checked to load and to fit the embedding.
std::string choose_tokenizer(const std::string& dir, int64_t vocab) {
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    const fs::path p = fs::path(dir) / name;
    if (!fs::is_regular_file(p)) continue;
    const int64_t size = Tokenizer(p.string()).vocab_size();
    if (size > vocab) {
      throw UserError(fmt::format("{}: {} tokens, more than config.json's vocab_size = {}",
                                  p.string(), size, vocab));
    }
    return name;
  }
  throw UserError(fmt::format("{}: no tokenizer.json or tokenizer.model; expected the model's "
                              "tokenizer beside its weights", dir));
}

}  // namespace

HfImportStats import_hf(const HfImportOptions& opts) {
  const bool root_existed = check_new_checkpoint_root(opts.out_root);
  std::error_code ec;
  if (!fs::is_directory(opts.source_dir, ec)) {
    throw UserError(fmt::format("{}: no such directory; expected a Hugging Face model directory "
                                "(config.json, safetensors, a tokenizer)", opts.source_dir));
  }
  fs::path named = fs::absolute(opts.source_dir).lexically_normal();
  if (named.filename().empty()) named = named.parent_path();
  HfImportStats stats;
  const HfModelConfig hf = read_hf_model_config((fs::path(opts.source_dir) / "config.json").string(),
                                                named.filename().string());
  const ModelConfig& model = hf.model;
  stats.model = model;
  stats.architecture = hf.architecture;
  stats.ignored = hf.ignored;
  const std::string tokenizer = choose_tokenizer(opts.source_dir, model.vocab);
  stats.tokenizer = tokenizer;
  const SafetensorsSet set = open_safetensors_dir(opts.source_dir);
  stats.files = static_cast<int64_t>(set.files.size());
  const std::vector<HfTensor> table = hf_llama_table(model);
  const std::map<std::string, const SafetensorsEntry*> found = match(set, table, opts.source_dir);
  std::set<std::string> dtypes;
  for (const auto& [name, e] : found) dtypes.insert(e->dtype_name);
  stats.dtypes = fmt::format("{}", fmt::join(dtypes, ", "));
  stats.tensors = static_cast<int64_t>(table.size());
  for (const HfTensor& t : table) stats.parameters += shape_numel(t.hf_shape);

  std::map<std::string, std::vector<const HfTensor*>> sources;  // by jumbo tensor
  for (const HfTensor& t : table) sources[t.jumbo_name].push_back(&t);
  const StagePlan plan = plan_stage(model, Layout{}, StepShape{}, GridCoords{});
  std::vector<TensorPiece> pieces;
  for (StatePiece& sp : state_pieces(plan.params, plan.optimizer_ranges, StateUse::save)) {
    if (!sources.count(sp.piece.name) || !sp.piece.whole()) {
      throw std::logic_error("import_hf: jumbo's tensor " + sp.piece.name + " is not in the table");
    }
    pieces.push_back(std::move(sp.piece));
  }
  std::vector<float> hf_values;  // one HF tensor at a time
  const MasterFill fill = [&](const TensorPiece& piece, float* master) {
    std::fill(master, master + piece.count(), 0.0f);  // padding rows of the vocabulary stay 0
    const int64_t cols = piece.shape.size() == 2 ? piece.shape[1] : 1;
    for (const HfTensor* t : sources.at(piece.name)) {
      const SafetensorsEntry& e = *found.at(t->hf_name);
      const int64_t n = shape_numel(e.shape), rows = e.shape[0];
      hf_values.resize(static_cast<size_t>(n));
      set.file_of(e).read_f32(e, 0, n, hf_values.data());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t to = t->jumbo_rows.empty() ? r : t->jumbo_rows[static_cast<size_t>(r)];
        std::copy_n(hf_values.data() + r * cols, cols, master + to * cols);
      }
    }
  };

  Manifest header;  // step 0, nothing consumed: a start, not a resume of the model's training
  header.model = model;
  header.precision = Precision::fp32;
  header.tokenizer = fs::absolute(fs::path(opts.out_root) / tokenizer).lexically_normal().string();
  // The tokenizer and its configs beside the checkpoints, as the model ships them; the chat
  // template (tokenizer_config.json's) is the checkpoint's, as a fine-tuning run's would be.
  std::vector<std::pair<std::string, std::vector<char>>> files;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                           "special_tokens_map.json", "generation_config.json"}) {
    const fs::path p = fs::path(opts.source_dir) / name;
    if (!fs::is_regular_file(p)) continue;
    const std::string bytes = read_file(p.string(), name);
    files.emplace_back(name, std::vector<char>(bytes.begin(), bytes.end()));
    stats.copied.push_back(name);
    if (std::string(name) == "tokenizer_config.json") {
      bool has_template = false;
      try {
        has_template = nlohmann::json::parse(bytes).contains("chat_template");
      } catch (const nlohmann::json::exception& e) {
        throw UserError(fmt::format("{}: not JSON ({})", p.string(), e.what()));
      }
      // Parsed now (a template jumbo cannot render is refused before anything is written) and
      // stored as every checkpoint stores a Jinja template.
      if (has_template) header.chat_template = parse_hf_chat_template(bytes, p.string()).text;
    }
  }
  stats.chat_template = !header.chat_template.empty();
  // The model keys as a preset, for the runs that start from this checkpoint
  // (model.preset = ROOT/model.toml; train.init_from checks the block against it).
  const std::string preset = fmt::format("# {}'s config.json ({}) as jumbo's model keys, written "
                                         "by jumbo ckpt import\n{}", opts.source_dir,
                                         hf_architecture_name(hf.architecture),
                                         model_preset_toml(model));
  files.emplace_back("model.toml", std::vector<char>(preset.begin(), preset.end()));
  stats.copied.push_back("model.toml");
  stats.checkpoint_dir = (fs::path(opts.out_root) / checkpoint_dir_name(0)).string();
  stats.bytes = write_whole_checkpoint(opts.out_root, root_existed, pieces, fill,
                                       std::move(header), files);
  return stats;
}

}  // namespace jumbo
