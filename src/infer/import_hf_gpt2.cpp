// `jumbo ckpt import --format hf-gpt2`: a Hugging Face GPT-2 directory as a jumbo checkpoint.
// What GPT-2 calls each tensor and how its elements lie comes from export_hf_gpt2.cpp's one
// table (hf_gpt2_table), read backwards; the checkpoint goes through ckpt's own writers (the
// HDF5 shard image, the manifest), as `jumbo ckpt convert` writes one. See docs/hf-export.md.
#include "jumbo/infer/import_hf.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "jumbo/ckpt/checkpointer.h"
#include "jumbo/ckpt/safetensors_read.h"
#include "jumbo/ckpt/manifest.h"
#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/export_hf.h"
#include "jumbo/infer/whole_checkpoint.h"
#include "jumbo/model/checkpoint_names.h"
#include "jumbo/model/transformer.h"
#include "jumbo/parallel/stage_plan.h"
#include "jumbo/plan/storage.h"

namespace jumbo {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- config.json -------------------------------------------------------------------------

// config.json's keys, each error one line naming the file and the key. Absent optional keys
// take transformers' GPT2Config defaults.
class Gpt2ConfigReader {
 public:
  Gpt2ConfigReader(const json& config, std::string where)
      : config_(config), where_(std::move(where)) {}

  int64_t positive(const char* key, const char* meaning) const {
    if (!config_.contains(key)) {
      throw UserError(fmt::format("{}: no {} ({}): expected a positive integer", where_, key,
                                  meaning));
    }
    const json& v = config_.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
      throw UserError(fmt::format("{}: {} = {}: expected a positive integer ({})", where_, key,
                                  v.dump(), meaning));
    }
    return v.get<int64_t>();
  }
  // The key must be `required` for jumbo's model to compute what GPT-2 does.
  void require_bool(const char* key, bool default_value, bool required, const char* why) const {
    bool value = default_value;
    if (config_.contains(key)) {
      const json& v = config_.at(key);
      if (!v.is_boolean()) {
        throw UserError(fmt::format("{}: {} = {}: expected true or false", where_, key, v.dump()));
      }
      value = v.get<bool>();
    }
    if (value != required) {
      throw UserError(fmt::format("{}: {} = {}: expected {} ({}: jumbo's model cannot compute "
                                  "this one)", where_, key, value, required, why));
    }
  }
  std::string text(const char* key, const char* default_value) const {
    if (!config_.contains(key)) return default_value;
    const json& v = config_.at(key);
    if (!v.is_string()) {
      throw UserError(fmt::format("{}: {} = {}: expected a string", where_, key, v.dump()));
    }
    return v.get<std::string>();
  }
  const json& at(const char* key) const { return config_.at(key); }
  bool has(const char* key) const { return config_.contains(key) && !config_.at(key).is_null(); }
  const std::string& where() const { return where_; }

 private:
  const json& config_;
  std::string where_;
};

// The model config.json describes, as a preset would (model.vocab the real vocabulary, padded
// by jumbo's vocab_multiple rule), refusing what jumbo's GPT-2 cannot compute.
ModelConfig read_gpt2_config(const std::string& dir) {
  const std::string where = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(where)) {
    throw UserError(fmt::format("{}: no such file; expected a Hugging Face GPT-2 directory "
                                "(config.json, model.safetensors)", where));
  }
  json config;
  try {
    config = json::parse(read_file(where, "config.json"));
  } catch (const json::exception& e) {
    throw UserError(fmt::format("{}: not JSON ({})", where, e.what()));
  }
  if (!config.is_object()) throw UserError(fmt::format("{}: expected a JSON object", where));
  const Gpt2ConfigReader r(config, where);
  if (const std::string type = r.text("model_type", "gpt2"); type != "gpt2") {
    throw UserError(fmt::format("{}: model_type = \"{}\": expected \"gpt2\"", where, type));
  }
  ModelConfig m;
  m.d_model = r.positive("n_embd", "the width");
  m.layers = r.positive("n_layer", "the number of blocks");
  m.heads = r.positive("n_head", "attention heads");
  m.context = r.positive("n_positions", "the positions of wpe");
  m.vocab = r.positive("vocab_size", "the rows of wte");
  if (m.d_model % m.heads != 0) {
    throw UserError(fmt::format("{}: n_head = {} does not divide n_embd = {}", where, m.heads,
                                m.d_model));
  }
  // GPT-2 reads a missing or null n_inner as 4 x n_embd.
  m.ffn = r.has("n_inner") ? r.positive("n_inner", "the MLP width") : 4 * m.d_model;
  const std::string activation = r.text("activation_function", "gelu_new");
  // gelu_pytorch_tanh is the same tanh approximation as gelu_new, computed by torch.
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    throw UserError(fmt::format("{}: activation_function = \"{}\": expected \"gelu_new\" "
                                "(jumbo's MLP uses GELU's tanh approximation)", where,
                                activation));
  }
  if (r.has("layer_norm_epsilon")) {
    const json& eps = r.at("layer_norm_epsilon");
    const float jumbo_eps = static_cast<float>(ModelConfig{}.norm_eps);
    if (!eps.is_number() || static_cast<float>(eps.get<double>()) != jumbo_eps) {
      throw UserError(fmt::format("{}: layer_norm_epsilon = {}: expected {} (jumbo's LayerNorm "
                                  "epsilon is fixed)", where, eps.dump(), jumbo_eps));
    }
  }
  r.require_bool("scale_attn_weights", true, true, "jumbo scales attention by 1/sqrt(head size)");
  r.require_bool("scale_attn_by_inverse_layer_idx", false, false,
                 "jumbo does not scale attention by the layer index");
  r.require_bool("tie_word_embeddings", true, true, "jumbo's output head is wte, tied");
  r.require_bool("add_cross_attention", false, false, "jumbo's blocks have no cross-attention");
  // Named after the directory ("gpt2" for a download of openai-community/gpt2).
  fs::path named = fs::absolute(dir).lexically_normal();
  if (named.filename().empty()) named = named.parent_path();  // "DIR/"
  m.name = named.filename().empty() ? "hf-gpt2" : named.filename().string();
  validate_model(m, where);  // the config rules' own checks, in case they grow
  return m;
}

// ---- model.safetensors ---------------------------------------------------------------------

// GPT2LMHeadModel saves "transformer.h.0...", GPT2Model (GPT-2's own checkpoint) "h.0...".
std::string without_prefix(const std::string& hf_name) {
  return hf_name.rfind("transformer.", 0) == 0 ? hf_name.substr(std::strlen("transformer."))
                                               : hf_name;
}

// model.safetensors (ckpt/safetensors_read.h), its tensors by the name without the
// "transformer." prefix.
struct Gpt2File {
  SafetensorsReader reader;
  std::map<std::string, const SafetensorsEntry*> tensors;
  explicit Gpt2File(const std::string& path) : reader(path) {
    for (const auto& [name, t] : reader.tensors()) {
      const std::string key = without_prefix(name);
      if (tensors.count(key)) {
        throw UserError(fmt::format("{}: tensor {} is stored twice (as {} and {})", path, key,
                                    tensors.at(key)->name, name));
      }
      tensors[key] = &t;
    }
  }
  const std::string& path() const { return reader.path(); }
  std::vector<float> values(const SafetensorsEntry& t) const {
    std::vector<float> v(static_cast<size_t>(shape_numel(t.shape)));
    reader.read_f32(t, 0, static_cast<int64_t>(v.size()), v.data());
    return v;
  }
};

// GPT-2's attention masks, saved as buffers by older transformers: "h.N.attn.bias" (the causal
// mask) and "h.N.attn.masked_bias". Not weights: jumbo's attention is causal by construction.
bool is_attention_buffer(const std::string& key) {
  if (key.rfind("h.", 0) != 0) return false;
  const size_t dot = key.find('.', 2);
  if (dot == std::string::npos || dot == 2) return false;
  if (key.substr(2, dot - 2).find_first_not_of("0123456789") != std::string::npos) return false;
  const std::string rest = key.substr(dot);
  return rest == ".attn.bias" || rest == ".attn.masked_bias";
}

// The tensors of the table, found and checked: names, dtypes, shapes, byte counts, and
// nothing left over but buffers and a tied lm_head.
std::map<std::string, const SafetensorsEntry*> match_tensors(const Gpt2File& file,
                                                             const std::vector<HfGpt2Tensor>& table,
                                                             int64_t layers) {
  const std::string& where = file.path();
  std::map<std::string, const SafetensorsEntry*> by_jumbo_name;
  std::set<std::string> used;
  for (const HfGpt2Tensor& t : table) {
    const std::string key = without_prefix(t.hf_name);
    const auto it = file.tensors.find(key);
    if (it == file.tensors.end()) {
      throw UserError(fmt::format("{}: no tensor {} (nor {}), which jumbo's {} needs", where,
                                  key, t.hf_name, t.jumbo_name));
    }
    const SafetensorsEntry& s = *it->second;
    check_float_tensor(s, where);
    if (s.shape != t.hf_shape()) {
      throw UserError(fmt::format("{}: tensor {} is [{}]; config.json's model needs [{}]", where,
                                  s.name, fmt::join(s.shape, ", "),
                                  fmt::join(t.hf_shape(), ", ")));
    }
    by_jumbo_name[t.jumbo_name] = &s;
    used.insert(key);
  }
  for (const auto& [key, s] : file.tensors) {
    if (used.count(key) || is_attention_buffer(key)) continue;
    if (key == "lm_head.weight") {
      // transformers saves the tied head too; jumbo's head is wte, so it must be wte.
      const SafetensorsEntry& wte = *by_jumbo_name.at(kWordEmbedding);
      bool tied = s->shape == wte.shape && s->dtype != SafetensorsDtype::other;
      if (tied) {
        check_float_tensor(*s, where);
        tied = file.values(*s) == file.values(wte);
      }
      if (!tied) {
        throw UserError(fmt::format("{}: tensor {} differs from {} (an untied output head): "
                                    "jumbo's head is the token embedding", where, s->name,
                                    wte.name));
      }
      continue;
    }
    throw UserError(fmt::format("{}: tensor {} has no place in jumbo's GPT-2 of config.json "
                                "(wte, wpe, h.0-{}.*, ln_f, a tied lm_head and attention "
                                "buffers)", where, s->name, layers - 1));
  }
  return by_jumbo_name;
}

// Fills a stored piece's master elements from GPT-2's tensor (`source`, its values as float32):
// the export's rearrangement run backwards. Padding rows of the word embedding (beyond
// model.vocab) are zero.
void fill_piece(const TensorPiece& piece, const HfGpt2Tensor& entry,
                const std::vector<float>& source, const std::vector<int64_t>& qkv_order,
                float* out) {
  const int64_t rows = entry.jumbo_shape[0];
  const int64_t cols = entry.jumbo_shape.size() == 2 ? entry.jumbo_shape[1] : 1;
  const int64_t rect_cols = piece.shape.size() == 2 ? piece.shape[1] : 1;
  const int64_t col0 = piece.offset.size() == 2 ? piece.offset[1] : 0;
  for (int64_t e = piece.flat_begin; e < piece.flat_end; ++e) {
    const int64_t r = piece.offset[0] + e / rect_cols, c = col0 + e % rect_cols;
    float value = 0;
    if (r < rows) {
      const int64_t hf_row = entry.change.qkv_regrouped ? qkv_order[static_cast<size_t>(r)] : r;
      value = source[static_cast<size_t>(entry.change.transposed ? c * rows + hf_row
                                                                 : hf_row * cols + c)];
    }
    out[e - piece.flat_begin] = value;
  }
}

// ---- the tokenizer -----------------------------------------------------------------------

struct ChosenTokenizer {
  std::string path, bytes;
};

// DIR/tokenizer.model (what the export writes), or --tokenizer: a SentencePiece model jumbo
// can tokenize with. GPT-2's byte-level BPE files (vocab.json, merges.txt) are not one.
ChosenTokenizer choose_tokenizer(const HfGpt2ImportOptions& o, int64_t vocab_size) {
  const std::string in_dir = (fs::path(o.source_dir) / "tokenizer.model").string();
  ChosenTokenizer t;
  if (!o.tokenizer.empty()) {
    t.path = o.tokenizer;
    if (!fs::is_regular_file(t.path)) {
      throw UserError(fmt::format("--tokenizer {}: no such file; expected a SentencePiece model "
                                  "of {} pieces", t.path, vocab_size));
    }
    const int64_t pieces = Tokenizer(t.path).vocab_size();
    if (pieces != vocab_size) {
      throw UserError(fmt::format("--tokenizer {}: {} pieces, but {}/config.json has vocab_size "
                                  "= {}: expected a SentencePiece model of {} pieces", t.path,
                                  pieces, o.source_dir, vocab_size, vocab_size));
    }
  } else if (fs::is_regular_file(in_dir)) {
    t.path = in_dir;
    const int64_t pieces = Tokenizer(t.path).vocab_size();
    if (pieces > vocab_size) {
      throw UserError(fmt::format("{}: {} pieces, more than config.json's vocab_size = {}",
                                  t.path, pieces, vocab_size));
    }
  } else {
    const fs::path vocab_json = fs::path(o.source_dir) / "vocab.json";
    if (fs::is_regular_file(vocab_json)) {
      std::string count = "unreadable";
      try {
        count = fmt::format("{} tokens", json::parse(read_file(vocab_json.string(), "vocab.json")).size());
      } catch (const json::exception&) {
      }
      throw UserError(fmt::format("{}: GPT-2 BPE vocabulary (vocab.json, {}) and no "
                                  "tokenizer.model; jumbo tokenizes with SentencePiece: pass "
                                  "--tokenizer MODEL (vocab {})", o.source_dir, count,
                                  vocab_size));
    }
    throw UserError(fmt::format("{}: no tokenizer.model (jumbo tokenizes with SentencePiece): "
                                "pass --tokenizer MODEL (vocab {})", o.source_dir, vocab_size));
  }
  t.bytes = read_file(t.path, "the tokenizer");
  return t;
}

// ---- -o ----------------------------------------------------------------------------------

std::string dtype_list(const std::map<std::string, const SafetensorsEntry*>& tensors) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) names.insert(t->dtype_name);
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

HfGpt2ImportStats import_hf_gpt2(const HfGpt2ImportOptions& opts) {
  const bool root_existed = check_new_checkpoint_root(opts.out_root);
  std::error_code ec;
  if (!fs::is_directory(opts.source_dir, ec)) {
    throw UserError(fmt::format("{}: no such directory; expected a Hugging Face GPT-2 directory "
                                "(config.json, model.safetensors)", opts.source_dir));
  }
  HfGpt2ImportStats stats;
  const ModelConfig model = read_gpt2_config(opts.source_dir);
  stats.model = model;
  const ChosenTokenizer tokenizer = choose_tokenizer(opts, model.vocab);
  stats.tokenizer_from = tokenizer.path;
  const Gpt2File file((fs::path(opts.source_dir) / "model.safetensors").string());
  const std::vector<HfGpt2Tensor> table = hf_gpt2_table(model);
  const std::map<std::string, const SafetensorsEntry*> sources =
      match_tensors(file, table, model.layers);
  stats.tensors = static_cast<int64_t>(table.size());
  stats.dtypes = dtype_list(sources);

  // What a tp 1 x pp 1 x dp 1 trainer saves: its one rank's pieces, from the same plan.
  Layout layout;
  const GridCoords at{};
  const StagePlan plan = plan_stage(model, layout, StepShape{}, at);
  std::vector<TensorPiece> pieces;
  std::map<std::string, const HfGpt2Tensor*> entries;
  for (const HfGpt2Tensor& t : table) entries[t.jumbo_name] = &t;
  for (StatePiece& sp : state_pieces(plan.params, plan.optimizer_ranges, StateUse::save)) {
    if (!entries.count(sp.piece.name)) {
      throw std::logic_error(fmt::format("jumbo's tensor {} is not in hf_gpt2_table",
                                         sp.piece.name));
    }
    pieces.push_back(std::move(sp.piece));
  }
  if (pieces.size() != entries.size()) {
    throw std::logic_error("hf_gpt2_table names a tensor that is not jumbo's model's");
  }
  const std::vector<int64_t> qkv_order = hf_gpt2_qkv_order(model.d_model, model.heads);
  for (const HfGpt2Tensor& t : table) stats.parameters += shape_numel(t.jumbo_shape);

  stats.checkpoint_dir = (fs::path(opts.out_root) / checkpoint_dir_name(0)).string();
  Manifest header;  // step 0, nothing consumed: a start, not a resume of GPT-2's training
  header.model = model;
  header.precision = Precision::fp32;
  // The tokenizer beside the checkpoints, named by the manifest (data.tokenizer) as a run's.
  header.tokenizer = fs::absolute(fs::path(opts.out_root) / "tokenizer.model").lexically_normal().string();
  stats.bytes = write_whole_checkpoint(opts.out_root, root_existed, pieces,
                                       [&](const TensorPiece& piece, float* master) {
                                         fill_piece(piece, *entries.at(piece.name),
                                                    file.values(*sources.at(piece.name)),
                                                    qkv_order, master);
                                       },
                                       std::move(header),
                                       {{"tokenizer.model", std::vector<char>(tokenizer.bytes.begin(), tokenizer.bytes.end())}});
  return stats;
}

}  // namespace jumbo
