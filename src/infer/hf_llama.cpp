// The Llama family's config.json and tensor table (infer/hf_llama.h).
#include "jumbo/infer/hf_llama.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "jumbo/model/checkpoint_names.h"
#include "jumbo/model/spec.h"

namespace jumbo {
namespace {

using nlohmann::json;

// Keys that change nothing jumbo computes (bookkeeping, generation defaults, the token ids
// the tokenizer also holds, dropout that is zero, initialisation of weights that are given).
const std::set<std::string> kHarmlessKeys = {
    "_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "pretraining_tp",
    "output_attentions", "output_hidden_states", "return_dict", "tokenizer_class",
    "id2label", "label2id", "problem_type", "architectures", "model_type", "max_window_layers",
    "use_sliding_window", "sliding_window", "attention_dropout", "mlp_bias", "attention_bias",
    "head_dim", "rope_scaling", "tie_word_embeddings", "hidden_act", "rms_norm_eps",
    "rope_theta", "num_key_value_heads", "max_position_embeddings", "vocab_size",
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "torchscript", "chunk_size_feed_forward", "is_encoder_decoder", "task_specific_params",
    "finetuning_task", "prefix", "decoder_start_token_id", "sep_token_id", "use_return_dict",
    "tf_legacy_loss", "pruned_heads", "add_cross_attention", "tie_encoder_decoder",
    "cross_attention_hidden_size", "bad_words_ids", "num_beams", "temperature", "top_p",
    "top_k", "do_sample", "max_length", "min_length", "repetition_penalty",
    "length_penalty", "num_return_sequences", "early_stopping", "no_repeat_ngram_size"};
// Keys the mapping reads: not listed as ignored.
const std::set<std::string> kMappedKeys = {
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
    "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias", "mlp_bias",
    "max_position_embeddings", "vocab_size", "sliding_window", "use_sliding_window",
    "attention_dropout", "max_window_layers", "torch_dtype"};

class ConfigReader {
 public:
  ConfigReader(const json& c, std::string where) : c_(c), where_(std::move(where)) {}
  bool has(const char* key) const { return c_.contains(key) && !c_.at(key).is_null(); }
  const json& at(const char* key) const { return c_.at(key); }
  [[noreturn]] void refuse(const std::string& key, const json& value, const std::string& why) const {
    throw UserError(fmt::format("{}: {} = {}: {}", where_, key, value.dump(), why));
  }
  int64_t positive(const char* key) const {
    if (!has(key)) throw UserError(fmt::format("{}: no {}: expected a positive integer", where_, key));
    const json& v = at(key);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0) refuse(key, v, "expected a positive integer");
    return v.get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_number()) refuse(key, at(key), "expected a number");
    return at(key).get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean()) refuse(key, at(key), "expected true or false");
    return at(key).get<bool>();
  }
  std::string text(const char* key) const {
    if (!has(key)) return "";
    if (!at(key).is_string()) refuse(key, at(key), "expected a string");
    return at(key).get<std::string>();
  }

 private:
  const json& c_;
  std::string where_;
};

void read_rope_scaling(const ConfigReader& r, ModelConfig& m, const std::string& where) {
  if (!r.has("rope_scaling")) return;
  const json& s = r.at("rope_scaling");
  if (!s.is_object()) r.refuse("rope_scaling", s, "expected null or an object");
  const std::string type = s.contains("rope_type") ? s.at("rope_type").get<std::string>()
                           : s.contains("type")    ? s.at("type").get<std::string>()
                                                   : "";
  if (type == "default") return;
  if (type != "llama3") {
    throw UserError(fmt::format("{}: rope_scaling.rope_type = \"{}\": jumbo implements RoPE "
                                "scaling \"llama3\" only (not yarn, dynamic, linear, longrope)",
                                where, type));
  }
  m.rope_scaling = RopeScaling::llama3;
  auto field = [&](const char* key, double& out) {
    if (!s.contains(key) || !s.at(key).is_number()) {
      throw UserError(fmt::format("{}: rope_scaling.{} = {}: expected a number (rope_type "
                                  "llama3)", where, key, s.contains(key) ? s.at(key).dump() : "missing"));
    }
    out = s.at(key).get<double>();
  };
  field("factor", m.rope_factor);
  field("low_freq_factor", m.rope_low_freq_factor);
  field("high_freq_factor", m.rope_high_freq_factor);
  double original = 0;
  field("original_max_position_embeddings", original);
  m.rope_original_context = static_cast<int64_t>(original);
}

}  // namespace

const char* hf_architecture_name(HfArchitecture a) {
  switch (a) {
    case HfArchitecture::llama: return "LlamaForCausalLM";
    case HfArchitecture::mistral: return "MistralForCausalLM";
    case HfArchitecture::qwen2: return "Qwen2ForCausalLM";
  }
  return "?";
}

HfModelConfig read_hf_model_config(const std::string& path, const std::string& name) {
  if (!std::filesystem::is_regular_file(path)) {
    throw UserError(fmt::format("{}: no such file; expected a Hugging Face model directory "
                                "(config.json, safetensors, a tokenizer)", path));
  }
  json c;
  try {
    std::ifstream in(path);
    c = json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  } catch (const json::exception& e) {
    throw UserError(fmt::format("{}: not JSON ({})", path, e.what()));
  }
  if (!c.is_object()) throw UserError(fmt::format("{}: expected a JSON object", path));
  const ConfigReader r(c, path);
  HfModelConfig out;
  std::string arch;
  if (r.has("architectures")) {
    const json& a = r.at("architectures");
    if (!a.is_array() || a.size() != 1 || !a[0].is_string()) {
      r.refuse("architectures", a, "expected one architecture");
    }
    arch = a[0].get<std::string>();
  }
  const std::string type = r.text("model_type");
  if (arch.empty()) {
    arch = type == "llama" ? "LlamaForCausalLM" : type == "mistral" ? "MistralForCausalLM"
           : type == "qwen2" ? "Qwen2ForCausalLM" : type;
  }
  if (arch == "LlamaForCausalLM") out.architecture = HfArchitecture::llama;
  else if (arch == "MistralForCausalLM") out.architecture = HfArchitecture::mistral;
  else if (arch == "Qwen2ForCausalLM") out.architecture = HfArchitecture::qwen2;
  else {
    throw UserError(fmt::format("{}: architectures = [\"{}\"]: expected LlamaForCausalLM, "
                                "MistralForCausalLM or Qwen2ForCausalLM", path, arch));
  }
  // Fields jumbo does not compute: refused by name, with their value.
  for (const auto& [key, value] : c.items()) {
    if (kHarmlessKeys.count(key)) continue;
    const bool moe = key.find("expert") != std::string::npos || key.rfind("moe", 0) == 0 ||
                     key.rfind("router", 0) == 0;
    throw UserError(fmt::format("{}: {} = {}: {}", path, key, value.dump(),
                                moe ? "mixture-of-experts fields are not implemented in jumbo"
                                    : "jumbo does not implement this field (it may change the "
                                      "computation)"));
  }
  ModelConfig& m = out.model;
  m.name = name;
  m.norm = Norm::rmsnorm;
  m.position = PositionEncoding::rope;
  m.mlp = Mlp::swiglu;
  m.d_model = r.positive("hidden_size");
  m.ffn = r.positive("intermediate_size");
  m.layers = r.positive("num_hidden_layers");
  m.heads = r.positive("num_attention_heads");
  m.kv_heads = r.has("num_key_value_heads") ? r.positive("num_key_value_heads") : m.heads;
  m.vocab = r.positive("vocab_size");
  m.context = r.positive("max_position_embeddings");
  if (m.d_model % m.heads != 0) {
    r.refuse("num_attention_heads", r.at("num_attention_heads"),
             fmt::format("does not divide hidden_size = {}", m.d_model));
  }
  if (r.has("head_dim") && r.at("head_dim") != json(m.d_model / m.heads)) {
    r.refuse("head_dim", r.at("head_dim"), fmt::format("jumbo's head size is hidden_size / "
                                                       "num_attention_heads = {}", m.d_model / m.heads));
  }
  if (const std::string act = r.text("hidden_act"); !act.empty() && act != "silu") {
    r.refuse("hidden_act", r.at("hidden_act"), "expected \"silu\" (SwiGLU)");
  }
  m.norm_eps = r.number("rms_norm_eps", 1e-6);
  m.rope_theta = r.number("rope_theta", 10000);
  read_rope_scaling(r, m, path);
  m.tied_embeddings = r.boolean("tie_word_embeddings", false);
  if (r.number("attention_dropout", 0) != 0) {
    r.refuse("attention_dropout", r.at("attention_dropout"), "jumbo has no dropout: expected 0");
  }
  if (out.architecture == HfArchitecture::qwen2) {
    m.linear_bias = false;
    m.qkv_bias = true;  // Qwen2Attention: q, k and v have biases, o does not
    if (r.boolean("use_sliding_window", false)) {
      r.refuse("use_sliding_window", r.at("use_sliding_window"),
               "sliding-window attention is not implemented in jumbo");
    }
  } else {
    const bool attention_bias = r.boolean("attention_bias", false);
    const bool mlp_bias = r.boolean("mlp_bias", false);
    if (attention_bias != mlp_bias) {
      r.refuse(attention_bias ? "attention_bias" : "mlp_bias", json(true),
               "jumbo puts biases on every linear map or none: expected attention_bias = "
               "mlp_bias");
    }
    m.linear_bias = attention_bias;
    m.qkv_bias = attention_bias;
    if (r.has("sliding_window") && (!r.at("sliding_window").is_number_integer() ||
                                    r.at("sliding_window").get<int64_t>() < m.context)) {
      r.refuse("sliding_window", r.at("sliding_window"),
               fmt::format("sliding-window attention is not implemented in jumbo (null, or at "
                           "least max_position_embeddings = {}, computes the same)", m.context));
    }
  }
  out.torch_dtype = r.text("torch_dtype");
  for (const auto& [key, value] : c.items()) {
    if (!kMappedKeys.count(key)) out.ignored.push_back(key);
  }
  validate_model(m, path);
  return out;
}

HfArchitecture hf_architecture_of(const ModelConfig& m, const std::string& where) {
  if (m.norm != Norm::rmsnorm || m.position != PositionEncoding::rope || m.mlp != Mlp::swiglu ||
      m.qk_norm) {
    throw UserError(fmt::format("{}: --format hf writes the Llama family (rmsnorm, rope, "
                                "swiglu, no qk-norm); this model has norm {}, position {}, mlp "
                                "{}, qk_norm {} (GPT-2's block: --format hf-gpt2)", where,
                                to_string(m.norm), to_string(m.position), to_string(m.mlp),
                                m.qk_norm));
  }
  return m.qkv_bias && !m.linear_bias ? HfArchitecture::qwen2 : HfArchitecture::llama;
}

nlohmann::ordered_json hf_model_config_json(const ModelConfig& m, HfArchitecture a,
                                            int64_t bos_id, int64_t eos_id,
                                            const std::string& torch_dtype) {
  const bool qwen = a == HfArchitecture::qwen2;
  nlohmann::ordered_json c;
  c["architectures"] = {hf_architecture_name(a)};
  if (!qwen) c["attention_bias"] = m.linear_bias;
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = bos_id >= 0 ? json(bos_id) : json(nullptr);
  c["eos_token_id"] = eos_id;
  if (!qwen) c["head_dim"] = m.head_dim();
  c["hidden_act"] = "silu";
  c["hidden_size"] = m.d_model;
  c["initializer_range"] = 0.02;
  c["intermediate_size"] = m.ffn_dim();
  c["max_position_embeddings"] = m.context;
  if (qwen) c["max_window_layers"] = m.layers;
  if (!qwen) c["mlp_bias"] = m.linear_bias;
  c["model_type"] = qwen ? "qwen2" : a == HfArchitecture::mistral ? "mistral" : "llama";
  c["num_attention_heads"] = m.heads;
  c["num_hidden_layers"] = m.layers;
  c["num_key_value_heads"] = m.kv_head_count();
  if (!qwen) c["pretraining_tp"] = 1;
  c["rms_norm_eps"] = m.norm_eps;
  if (m.rope_scaling == RopeScaling::llama3) {
    c["rope_scaling"] = {{"factor", m.rope_factor},
                         {"high_freq_factor", m.rope_high_freq_factor},
                         {"low_freq_factor", m.rope_low_freq_factor},
                         {"original_max_position_embeddings", m.rope_original_context},
                         {"rope_type", "llama3"}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  c["rope_theta"] = m.rope_theta;
  if (qwen) c["sliding_window"] = nullptr;
  c["tie_word_embeddings"] = m.tied_embeddings;
  c["torch_dtype"] = torch_dtype;
  c["transformers_version"] = "4.46.0";
  c["use_cache"] = true;
  if (qwen) c["use_sliding_window"] = false;
  c["vocab_size"] = m.vocab;
  return c;
}

std::vector<int64_t> hf_qkv_rows(const ModelConfig& model, int part) {
  const ModelSpec s = model_spec(model);
  const int64_t g_count = s.kv_heads, r = s.heads / s.kv_heads, d = s.head_dim;
  std::vector<int64_t> rows;
  if (part == 0) {  // query head h = g * R + j is slot j of group g
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < d; ++i) rows.push_back(((h / r) * (r + 2) + h % r) * d + i);
    }
  } else {  // the key (slot R) or value (slot R + 1) head of each group
    for (int64_t g = 0; g < g_count; ++g) {
      for (int64_t i = 0; i < d; ++i) rows.push_back((g * (r + 2) + r + (part - 1)) * d + i);
    }
  }
  return rows;
}

std::vector<HfTensor> hf_llama_table(const ModelConfig& model) {
  const ModelSpec s = model_spec(model);
  const int64_t c = s.d_model, d = s.head_dim, f = s.ffn;
  std::vector<HfTensor> t;
  t.push_back({"model.embed_tokens.weight", {model.vocab, c}, kWordEmbedding, {}});
  const char* qkv_names[] = {"q_proj", "k_proj", "v_proj"};
  std::vector<int64_t> qkv_rows[3];
  for (int part = 0; part < 3; ++part) qkv_rows[part] = hf_qkv_rows(model, part);
  for (int64_t i = 0; i < model.layers; ++i) {
    const std::string hf = fmt::format("model.layers.{}.", i), j = fmt::format("layers.{}.", i);
    for (int part = 0; part < 3; ++part) {
      const int64_t rows = (part == 0 ? s.heads : s.kv_heads) * d;
      t.push_back({fmt::format("{}self_attn.{}.weight", hf, qkv_names[part]), {rows, c},
                   j + "attn.qkv.weight", qkv_rows[part]});
      if (s.qkv_bias || s.linear_bias) {
        t.push_back({fmt::format("{}self_attn.{}.bias", hf, qkv_names[part]), {rows},
                     j + "attn.qkv.bias", qkv_rows[part]});
      }
    }
    t.push_back({hf + "self_attn.o_proj.weight", {c, s.attn_width()}, j + "attn.proj.weight", {}});
    if (s.linear_bias) t.push_back({hf + "self_attn.o_proj.bias", {c}, j + "attn.proj.bias", {}});
    for (const auto& [hf_map, jumbo_map, rows] :
         {std::tuple{"gate_proj", "gate", f}, std::tuple{"up_proj", "up", f},
          std::tuple{"down_proj", "fc2", c}}) {
      const int64_t cols = std::string(hf_map) == "down_proj" ? f : c;
      t.push_back({fmt::format("{}mlp.{}.weight", hf, hf_map), {rows, cols},
                   fmt::format("{}mlp.{}.weight", j, jumbo_map), {}});
      if (s.linear_bias) {
        t.push_back({fmt::format("{}mlp.{}.bias", hf, hf_map), {rows},
                     fmt::format("{}mlp.{}.bias", j, jumbo_map), {}});
      }
    }
    t.push_back({hf + "input_layernorm.weight", {c}, j + "ln1.weight", {}});
    t.push_back({hf + "post_attention_layernorm.weight", {c}, j + "ln2.weight", {}});
  }
  t.push_back({"model.norm.weight", {c}, "final_norm.weight", {}});
  if (!model.tied_embeddings) t.push_back({"lm_head.weight", {model.vocab, c}, kUntiedHead, {}});
  return t;
}

const char* hf_module_of(LoraTarget target) {
  switch (target) {
    case LoraTarget::q: return "self_attn.q_proj";
    case LoraTarget::k: return "self_attn.k_proj";
    case LoraTarget::v: return "self_attn.v_proj";
    case LoraTarget::proj: return "self_attn.o_proj";
    case LoraTarget::gate: return "mlp.gate_proj";
    case LoraTarget::up: return "mlp.up_proj";
    case LoraTarget::fc2: return "mlp.down_proj";
    case LoraTarget::qkv:
    case LoraTarget::fc1: return nullptr;  // no single HF module: qkv is split, fc1 is GELU's
  }
  return nullptr;
}

}  // namespace jumbo
