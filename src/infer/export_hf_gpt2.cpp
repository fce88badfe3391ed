// `jumbo ckpt export --format hf-gpt2`: GPT-2's names and layouts for jumbo's tensors, its
// config.json, and the run's SentencePiece tokenizer with the configs transformers needs.
// The weights go through ckpt's one safetensors writer (write_safetensors); this file only
// says which tensor becomes which, and how its elements move. See docs/hf-export.md.
#include "jumbo/infer/export_hf.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "jumbo/data/tokenizer.h"
#include "jumbo/infer/checkpoint_weights.h"
#include "jumbo/model/transformer.h"

namespace jumbo {

// GPT-2's tensors, each with the real shape jumbo's tensor must have for the mapping to mean
// anything (a future jumbo layout, grouped-query attention say, must fail here, not export
// garbage): the word embedding by model.vocab rows. Export and import both read this table.
std::vector<HfGpt2Tensor> hf_gpt2_table(const ModelConfig& m) {
  const int64_t c = m.d_model, f = m.ffn_dim();
  std::vector<HfGpt2Tensor> out;
  auto add = [&out](std::string hf, std::string jumbo, std::vector<int64_t> shape,
                    HfGpt2Change change = {}) {
    out.push_back({std::move(jumbo), std::move(hf), std::move(shape), change});
  };
  // Conv1D (y = x W + b, W [in, out]) is the transpose of jumbo's Linear [out, in].
  constexpr HfGpt2Change conv1d{.transposed = true};
  add("transformer.wte.weight", "embedding.word", {m.vocab, c});  // padding rows dropped
  add("transformer.wpe.weight", "embedding.position", {m.context, c});
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string h = fmt::format("transformer.h.{}.", i), j = fmt::format("layers.{}.", i);
    add(h + "ln_1.weight", j + "ln1.weight", {c});
    add(h + "ln_1.bias", j + "ln1.bias", {c});
    add(h + "attn.c_attn.weight", j + "attn.qkv.weight", {3 * c, c},
        {.transposed = true, .qkv_regrouped = true});
    add(h + "attn.c_attn.bias", j + "attn.qkv.bias", {3 * c}, {.qkv_regrouped = true});
    add(h + "attn.c_proj.weight", j + "attn.proj.weight", {c, c}, conv1d);
    add(h + "attn.c_proj.bias", j + "attn.proj.bias", {c});
    add(h + "ln_2.weight", j + "ln2.weight", {c});
    add(h + "ln_2.bias", j + "ln2.bias", {c});
    add(h + "mlp.c_fc.weight", j + "mlp.fc1.weight", {f, c}, conv1d);
    add(h + "mlp.c_fc.bias", j + "mlp.fc1.bias", {f});
    add(h + "mlp.c_proj.weight", j + "mlp.fc2.weight", {c, f}, conv1d);
    add(h + "mlp.c_proj.bias", j + "mlp.fc2.bias", {c});
  }
  add("transformer.ln_f.weight", "final_norm.weight", {c});
  add("transformer.ln_f.bias", "final_norm.bias", {c});
  // No lm_head.weight: GPT2LMHeadModel ties it to wte (tie_word_embeddings), as jumbo does.
  return out;
}

std::vector<int64_t> HfGpt2Tensor::hf_shape() const {
  if (!change.transposed) return jumbo_shape;
  return {jumbo_shape.at(1), jumbo_shape.at(0)};
}

std::vector<SafetensorsTensor> hf_gpt2_tensors(const ModelConfig& m) {
  const std::vector<int64_t> qkv = hf_gpt2_qkv_order(m.d_model, m.heads);
  std::vector<SafetensorsTensor> out;
  for (const HfGpt2Tensor& t : hf_gpt2_table(m)) {
    out.push_back({t.hf_name, t.jumbo_name, t.jumbo_shape,
                   t.change.qkv_regrouped ? qkv : std::vector<int64_t>{}, t.change.transposed});
  }
  return out;
}

namespace {

// The shortest decimal that reads back as the float, so config.json says 1e-05 (what
// transformers' own GPT-2 configs say), not 9.99999974737875e-06.
double as_written(float x) { return std::stod(fmt::format("{}", x)); }

nlohmann::ordered_json gpt2_config(const ModelConfig& m, int32_t eos, const std::string& dtype) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = m.vocab;  // the real vocabulary: padding rows are not exported
  j["n_positions"] = m.context;
  j["n_ctx"] = m.context;
  j["n_embd"] = m.d_model;
  j["n_layer"] = m.layers;
  j["n_head"] = m.heads;
  // GPT-2 reads null as 4 x n_embd.
  j["n_inner"] = m.ffn_dim() == 4 * m.d_model ? nlohmann::ordered_json()
                                               : nlohmann::ordered_json(m.ffn_dim());
  j["activation_function"] = "gelu_new";  // GELU's tanh approximation, as jumbo's kernels
  j["layer_norm_epsilon"] = as_written(static_cast<float>(ModelConfig{}.norm_eps));
  j["resid_pdrop"] = 0.0;  // jumbo trains without dropout
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;  // 1 / sqrt(head size), as jumbo
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  // jumbo starts every document after EOS (no separate BOS), like GPT-2's <|endoftext|>.
  j["bos_token_id"] = eos;
  j["eos_token_id"] = eos;
  j["torch_dtype"] = dtype == "bf16" ? "bfloat16" : "float32";
  j["use_cache"] = true;
  return j;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct TokenizerFiles {
  std::string path, bytes;
  int32_t eos = 0;
  std::string eos_piece, unk_piece;
};

// The run's tokenizer, checked before anything is written: it exists, is a SentencePiece
// model with an EOS piece, and has no more pieces than the model has embedding rows.
TokenizerFiles load_tokenizer(const Manifest& manifest, const std::string& override_path) {
  TokenizerFiles t;
  t.path = override_path.empty() ? manifest.tokenizer : override_path;
  const std::string named_by = override_path.empty()
                                   ? "the checkpoint's data.tokenizer"
                                   : "--tokenizer";
  if (t.path.empty()) {
    throw UserError("the checkpoint records no tokenizer (data.tokenizer): pass --tokenizer "
                    "PATH, the SentencePiece model the run trained with");
  }
  if (!std::filesystem::is_regular_file(t.path)) {
    throw UserError(fmt::format("{}: no such tokenizer file (named by {}); pass --tokenizer "
                                "PATH, the SentencePiece model the run trained with", t.path,
                                named_by));
  }
  try {
    const Tokenizer tok(t.path);
    t.eos = tok.eos_id();
    t.eos_piece = tok.piece(t.eos);
    if (tok.vocab_size() > manifest.model.vocab) {
      throw UserError(fmt::format("{}: {} pieces, more than the model's vocabulary (model.vocab "
                                  "= {}): not the run's tokenizer", t.path, tok.vocab_size(),
                                  manifest.model.vocab));
    }
  } catch (const UserError& e) {
    throw UserError(fmt::format("{} (named by {}; pass --tokenizer PATH to choose another)",
                                e.what(), named_by));
  }
  t.bytes = read_file(t.path);
  // jumbo::Tokenizer does not expose the unknown piece; SentencePiece itself does.
  sentencepiece::SentencePieceProcessor sp;
  if (!sp.LoadFromSerializedProto(t.bytes).ok() || sp.unk_id() < 0) {
    throw UserError(fmt::format("{}: cannot read its unknown piece (named by {})", t.path,
                                named_by));
  }
  t.unk_piece = sp.IdToPiece(sp.unk_id());
  return t;
}

// Checks that the checkpoint holds exactly the tensors GPT-2 has, in the shapes it needs.
void check_tensors(const ResolvedCheckpoint& ckpt, const std::vector<SafetensorsTensor>& mappings) {
  const std::string where = ckpt.storage->url(join_dir(ckpt.dir, "manifest.json"));
  std::set<std::string> mapped;
  for (const SafetensorsTensor& mp : mappings) {
    mapped.insert(mp.source);
    if (!ckpt.manifest.tensors.count(mp.source)) {
      throw UserError(fmt::format("{}: no tensor {}, which GPT-2's {} needs", where, mp.source,
                                  mp.name));
    }
    const std::vector<int64_t> shape =
        checkpoint_tensor_shape(ckpt.manifest, mp.source, gpt_tensor_listing());
    if (shape != mp.shape) {
      throw UserError(fmt::format("{}: tensor {} is [{}], GPT-2's {} needs [{}] (--format "
                                  "hf-gpt2 cannot express this model)", where, mp.source,
                                  fmt::join(shape, ", "), mp.name, fmt::join(mp.shape, ", ")));
    }
  }
  for (const auto& [name, pieces] : ckpt.manifest.tensors) {
    if (!mapped.count(name)) {
      throw UserError(fmt::format("{}: tensor {} has no GPT-2 counterpart (--format hf-gpt2 "
                                  "cannot express this model)", where, name));
    }
  }
}

}  // namespace

std::vector<int64_t> hf_gpt2_qkv_order(int64_t d_model, int64_t heads) {
  // jumbo: per head h, q (D rows), k (D), v (D) -> GPT-2: [q all heads | k | v], head-major
  // inside each (GPT-2 splits each of q, k, v into heads of D consecutive columns).
  const int64_t d = d_model / heads;
  std::vector<int64_t> order(static_cast<size_t>(3 * d_model));
  for (int64_t r = 0; r < 3 * d_model; ++r) {
    const int64_t head = r / (3 * d), which = (r / d) % 3, i = r % d;
    order[static_cast<size_t>(r)] = which * d_model + head * d + i;
  }
  return order;
}

HfGpt2Stats export_hf_gpt2(const ResolvedCheckpoint& ckpt, const HfGpt2Options& opts) {
  if (opts.dtype != "f32" && opts.dtype != "bf16") {
    throw UserError(fmt::format("--dtype {}: expected f32 or bf16", opts.dtype));
  }
  namespace fs = std::filesystem;
  if (opts.out_dir.empty() || is_s3_url(opts.out_dir)) {
    throw UserError(fmt::format("-o {}: expected a local directory (hf-gpt2 writes a directory "
                                "of files)", opts.out_dir));
  }
  std::error_code ec;
  const bool existed = fs::exists(opts.out_dir, ec);
  if (existed && !fs::is_directory(opts.out_dir, ec)) {
    throw UserError(fmt::format("-o {}: exists and is not a directory; expected a directory "
                                "for the GPT-2 files", opts.out_dir));
  }
  const Manifest& m = ckpt.manifest;
  const ModelConfig gpt;  // GPT-2's block: the model keys' defaults
  if (m.model.norm != gpt.norm || m.model.position != gpt.position || m.model.mlp != gpt.mlp ||
      m.model.kv_head_count() != m.model.heads || !m.model.tied_embeddings ||
      !m.model.linear_bias || m.model.qk_norm) {
    throw UserError(fmt::format(
        "{}: --format hf-gpt2 writes GPT-2's block (layernorm, learned positions, gelu, tied, "
        "biases, kv_heads = heads); this checkpoint's model has norm {}, position {}, mlp {}, "
        "kv_heads {}, tied_embeddings {}",
        ckpt.storage->url(ckpt.dir), to_string(m.model.norm), to_string(m.model.position),
        to_string(m.model.mlp), m.model.kv_head_count(), m.model.tied_embeddings));
  }
  const std::vector<SafetensorsTensor> mappings = hf_gpt2_tensors(m.model);
  check_tensors(ckpt, mappings);
  const TokenizerFiles tok = load_tokenizer(m, opts.tokenizer);

  HfGpt2Stats stats;
  stats.tokenizer = tok.path;
  stats.eos_id = tok.eos;
  fs::create_directories(opts.out_dir, ec);
  if (ec) {
    throw UserError(fmt::format("-o {}: cannot create the directory ({})", opts.out_dir,
                                ec.message()));
  }
  try {
    // Atomic small files (temp, fsync, rename), as checkpoints write theirs.
    const std::unique_ptr<Storage> out = open_file_storage(opts.out_dir);
    // The weights first (the long part, the one that can find a corrupt shard); config.json
    // last, so a directory that transformers can load is a complete one. An earlier export's
    // config.json goes first, or a failure here would leave it over a mix of old and new.
    fs::remove(fs::path(opts.out_dir) / "config.json", ec);
    SafetensorsMetadata meta = checkpoint_metadata(*ckpt.storage, ckpt.dir, m, opts.dtype);
    meta.emplace_back("names", "hf-gpt2");  // GPT-2's names and Conv1D layout, not jumbo's
    stats.weights = write_safetensors(*ckpt.storage, ckpt.dir, m,
                                      (fs::path(opts.out_dir) / "model.safetensors").string(),
                                      opts.dtype, mappings, meta);
    auto write = [&out](const std::string& name, const std::string& text) {
      out->write(name, text.data(), text.size());
    };
    write("tokenizer.model", tok.bytes);
    // LlamaTokenizer is transformers' plain SentencePiece tokenizer: with legacy = true it
    // encodes as SentencePiece does (jumbo's Tokenizer::encode), adding no BOS or EOS. BOS is
    // the EOS piece, as config.json's bos_token_id: a text is prefixed by EOS, as in training.
    const nlohmann::ordered_json special = {
        {"bos_token", tok.eos_piece}, {"eos_token", tok.eos_piece}, {"unk_token", tok.unk_piece}};
    nlohmann::ordered_json tc = {{"tokenizer_class", "LlamaTokenizer"},
                                 {"add_bos_token", false},
                                 {"add_eos_token", false},
                                 {"legacy", true},
                                 {"model_max_length", m.model.context},
                                 {"clean_up_tokenization_spaces", false},
                                 {"sp_model_kwargs", nlohmann::ordered_json::object()}};
    tc.update(special);
    write("tokenizer_config.json", tc.dump(2) + "\n");
    write("special_tokens_map.json", special.dump(2) + "\n");
    write("config.json", gpt2_config(m.model, tok.eos, opts.dtype).dump(2) + "\n");
  } catch (...) {
    if (!existed) fs::remove(opts.out_dir, ec);  // only if still empty: never others' files
    throw;
  }
  return stats;
}

}  // namespace jumbo
