#include "jumbo/ckpt/manifest.h"

#include <fmt/format.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "jumbo/config/hashing.h"

namespace jumbo {
namespace {

using nlohmann::json;

// The architecture keys (config.h's model components), in the manifest's "model": always
// written; a manifest without them (before model families) is the GPT block, their defaults.
void write_architecture(json& j, const ModelConfig& mc) {
  j["norm"] = to_string(mc.norm);
  j["norm_eps"] = mc.norm_eps;
  j["position"] = to_string(mc.position);
  j["rope_theta"] = mc.rope_theta;
  j["rope_scaling"] = to_string(mc.rope_scaling);
  j["rope_factor"] = mc.rope_factor;
  j["rope_low_freq_factor"] = mc.rope_low_freq_factor;
  j["rope_high_freq_factor"] = mc.rope_high_freq_factor;
  j["rope_original_context"] = mc.rope_original_context;
  j["mlp"] = to_string(mc.mlp);
  j["kv_heads"] = mc.kv_head_count();
  j["tied_embeddings"] = mc.tied_embeddings;
  j["linear_bias"] = mc.linear_bias;
  j["qkv_bias"] = mc.qkv_bias;
  j["qk_norm"] = mc.qk_norm;
}

template <typename E, size_t N>
void read_choice(const json& mc, const char* key, E& out, const std::string& where) {
  if (!mc.contains(key)) return;
  const std::string name = mc.at(key).get<std::string>();
  for (size_t i = 0; i < N; ++i) {
    if (name == to_string(static_cast<E>(i))) {
      out = static_cast<E>(i);
      return;
    }
  }
  throw UserError(fmt::format("{}: model.{} = \"{}\": not a value this build knows", where, key, name));
}

template <typename T>
void read_optional(const json& mc, const char* key, T& out) {
  if (mc.contains(key)) out = mc.at(key).get<T>();
}

void read_architecture(const json& mc, ModelConfig& m, const std::string& where) {
  read_choice<Norm, 2>(mc, "norm", m.norm, where);
  read_optional(mc, "norm_eps", m.norm_eps);
  read_choice<PositionEncoding, 2>(mc, "position", m.position, where);
  read_optional(mc, "rope_theta", m.rope_theta);
  read_choice<RopeScaling, 2>(mc, "rope_scaling", m.rope_scaling, where);
  read_optional(mc, "rope_factor", m.rope_factor);
  read_optional(mc, "rope_low_freq_factor", m.rope_low_freq_factor);
  read_optional(mc, "rope_high_freq_factor", m.rope_high_freq_factor);
  read_optional(mc, "rope_original_context", m.rope_original_context);
  read_choice<Mlp, 2>(mc, "mlp", m.mlp, where);
  read_optional(mc, "kv_heads", m.kv_heads);
  read_optional(mc, "tied_embeddings", m.tied_embeddings);
  read_optional(mc, "linear_bias", m.linear_bias);
  read_optional(mc, "qkv_bias", m.qkv_bias);
  read_optional(mc, "qk_norm", m.qk_norm);
}

// The architecture keys as one line ("norm rmsnorm, position rope, ..."), for a mismatch.
std::string architecture_line(const ModelConfig& m) {
  return fmt::format("norm {} (eps {}), position {} (theta {}, scaling {}), mlp {}, kv_heads {}, "
                     "tied_embeddings {}, linear_bias {}, qkv_bias {}, qk_norm {}",
                     to_string(m.norm), m.norm_eps, to_string(m.position), m.rope_theta,
                     to_string(m.rope_scaling), to_string(m.mlp), m.kv_head_count(),
                     m.tied_embeddings, m.linear_bias, m.qkv_bias, m.qk_norm);
}

using nlohmann::json;

json piece_json(const TensorPiece& p) {
  json j = {{"offset", p.offset}, {"shape", p.shape}, {"flat_range", {p.flat_begin, p.flat_end}}};
  return j;
}

template <typename E, size_t N>
E enum_named(const std::string& name, const char* key, const std::string& where) {
  for (size_t i = 0; i < N; ++i)
    if (name == to_string(static_cast<E>(i))) return static_cast<E>(i);
  throw UserError(fmt::format("{}: anomalies.skipped {} = \"{}\" is not one this build knows",
                              where, key, name));
}

// Manifests before train.on_anomaly have no "anomalies": the defaults (nothing skipped).
void parse_anomalies(const json& a, AnomalyProgress& out, const std::string& where) {
  out.loss_mean = a.at("loss_mean").get<double>();
  out.losses_seen = a.at("losses_seen").get<int64_t>();
  for (const json& e : a.at("skipped")) {
    SkippedSamples k;
    k.step = e.at("step").get<int64_t>();
    const auto samples = e.at("samples").get<std::vector<int64_t>>();
    if (samples.size() != 2 || samples[0] > samples[1]) {
      throw UserError(fmt::format("{}: anomalies.skipped of step {}: samples = {}: expected "
                                  "[first, end) with first <= end", where, k.step,
                                  e.at("samples").dump()));
    }
    k.first_sample = samples[0];
    k.end_sample = samples[1];
    k.kind = enum_named<AnomalyKind, 2>(e.at("kind").get<std::string>(), "kind", where);
    k.action = enum_named<AnomalyAction, 3>(e.at("action").get<std::string>(), "action", where);
    k.loss = e.at("loss").is_null() ? NAN : e.at("loss").get<double>();
    k.rewound_to_step = e.value("rewound_to_step", int64_t{0});
    out.skipped.push_back(k);
  }
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

int64_t checkpoint_step_of(const std::string& name) {
  if (name.size() < 6 || name.rfind("step_", 0) != 0) return -1;
  const std::string digits = name.substr(5);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) return -1;
  return std::stoll(digits);
}

std::string weights_fingerprint(const Manifest& m) {
  uint64_t h = fnv1a64("");
  for (const ShardFileInfo& f : m.files) h = fnv1a64(fmt::format("{}:{:08x};", f.name, f.crc32), h);
  return fmt::format("{:#018x}", h);
}

std::string manifest_to_json(const Manifest& m) {
  const CheckpointProgress& p = m.progress;
  json j;
  j["format"] = "jumbo-checkpoint";
  j["format_version"] = m.format_version;
  j["step"] = p.step;
  j["consumed_samples"] = p.consumed_samples;
  j["consumed_tokens"] = p.consumed_tokens;
  j["optimizer"] = {{"name", "adamw"}, {"steps", p.optimizer_steps},
                    {"states", json::array({"master", "exp_avg", "exp_avg_sq"})}};
  j["rng"] = {{"seed", p.seed},
              {"generator", "philox4x32-10, counter-based: no state beyond the seed"}};
  j["sampler"] = {{"seed", p.seed}, {"consumed_samples", p.consumed_samples}};
  j["schedule"] = {{"consumed_tokens", p.consumed_tokens}, {"lr", p.lr},
                   {"global_batch", p.global_batch}};
  json skipped = json::array();
  for (const SkippedSamples& k : p.anomalies.skipped) {
    json e = {{"step", k.step}, {"samples", {k.first_sample, k.end_sample}},
              {"kind", to_string(k.kind)}, {"action", to_string(k.action)},
              {"loss", std::isfinite(k.loss) ? json(k.loss) : json(nullptr)}};
    if (k.action == AnomalyAction::rewind) e["rewound_to_step"] = k.rewound_to_step;
    skipped.push_back(e);
  }
  j["anomalies"] = {{"loss_mean", p.anomalies.loss_mean},
                    {"losses_seen", p.anomalies.losses_seen},
                    {"skipped", skipped}};
  const ModelConfig& mc = m.model;
  j["model"] = {{"name", mc.name},       {"layers", mc.layers}, {"d_model", mc.d_model},
                {"heads", mc.heads},     {"ffn", mc.ffn_dim()}, {"vocab", mc.vocab},
                {"context", mc.context}, {"vocab_multiple", mc.vocab_multiple}};
  write_architecture(j["model"], mc);
  const Layout& l = m.layout;
  j["layout"] = {{"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"zero1", l.zero1_active()},
                 {"virtual_stages", l.virtual_stages}, {"stage_layers", l.stage_layers},
                 {"precision", to_string(m.precision)}};
  json mixture = json::array();
  for (const DatasetWeight& d : m.data_train.datasets)
    mixture.push_back({{"prefix", d.prefix}, {"weight", d.weight}});
  j["data"] = {{"train", m.data_train.describe()}, {"mixture", mixture}, {"tokenizer", m.tokenizer}};
  if (!m.chat_template.empty()) j["data"]["chat_template"] = m.chat_template;
  if (!m.init_from.from.empty()) {
    j["init_from"] = {{"from", m.init_from.from}, {"step", m.init_from.step},
                      {"fingerprint", m.init_from.fingerprint}};
  }
  if (m.lora.rank > 0) {
    std::string targets;
    for (LoraTarget t : kLoraTargets)
      if (m.lora.targets.has(t)) targets += (targets.empty() ? "" : ",") + std::string(to_string(t));
    j["lora"] = {{"rank", m.lora.rank}, {"alpha", m.lora.alpha}, {"targets", targets}};
  }
  json files = json::array();
  for (const ShardFileInfo& f : m.files) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc32}});
  }
  j["files"] = files;
  json tensors = json::object();
  for (const auto& [name, pieces] : m.tensors) {
    json shards = json::array();
    for (const StoredPiece& s : pieces) {
      json e = piece_json(s.piece);
      e["file"] = s.file;
      shards.push_back(e);
    }
    tensors[name] = {{"global_shape", pieces.front().piece.global_shape},
                     {"dtype", "float32"},
                     {"shards", shards}};
  }
  j["tensors"] = tensors;
  return j.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  Manifest m;
  try {
    const json j = json::parse(text);
    if (j.value("format", "") != "jumbo-checkpoint") {
      throw UserError(fmt::format("{}: not a jumbo checkpoint manifest (no \"format\": "
                                  "\"jumbo-checkpoint\")", where));
    }
    m.format_version = j.at("format_version").get<int>();
    if (m.format_version != kCheckpointFormatVersion) {
      throw UserError(fmt::format("{}: format_version = {}: this build reads version {}", where,
                                  m.format_version, kCheckpointFormatVersion));
    }
    CheckpointProgress& p = m.progress;
    p.step = j.at("step").get<int64_t>();
    p.consumed_samples = j.at("consumed_samples").get<int64_t>();
    p.consumed_tokens = j.at("consumed_tokens").get<int64_t>();
    p.optimizer_steps = j.at("optimizer").at("steps").get<int64_t>();
    p.seed = j.at("rng").at("seed").get<uint64_t>();
    p.lr = j.at("schedule").at("lr").get<double>();
    p.global_batch = j.at("schedule").at("global_batch").get<int64_t>();
    if (j.contains("anomalies")) parse_anomalies(j.at("anomalies"), p.anomalies, where);
    const json& mc = j.at("model");
    m.model.name = mc.at("name").get<std::string>();
    m.model.layers = mc.at("layers").get<int64_t>();
    m.model.d_model = mc.at("d_model").get<int64_t>();
    m.model.heads = mc.at("heads").get<int64_t>();
    m.model.ffn = mc.at("ffn").get<int64_t>();
    m.model.vocab = mc.at("vocab").get<int64_t>();
    m.model.context = mc.at("context").get<int64_t>();
    m.model.vocab_multiple = mc.at("vocab_multiple").get<int64_t>();
    read_architecture(mc, m.model, where);
    const json& l = j.at("layout");
    m.layout.tp = l.at("tp").get<int64_t>();
    m.layout.pp = l.at("pp").get<int64_t>();
    m.layout.dp = l.at("dp").get<int64_t>();
    m.layout.zero1 = l.at("zero1").get<bool>();
    m.layout.virtual_stages = l.at("virtual_stages").get<int64_t>();
    m.layout.stage_layers = l.at("stage_layers").get<std::vector<int64_t>>();
    const std::string precision = l.at("precision").get<std::string>();
    if (precision != "fp32" && precision != "bf16") {
      throw UserError(fmt::format("{}: layout.precision = \"{}\": expected \"fp32\" or \"bf16\"",
                                  where, precision));
    }
    m.precision = precision == "bf16" ? Precision::bf16 : Precision::fp32;
    // Manifests before mixtures record one prefix under "train".
    const json& data = j.at("data");
    if (data.contains("mixture")) {
      for (const json& d : data.at("mixture"))
        m.data_train.datasets.push_back({d.at("prefix").get<std::string>(), d.at("weight").get<double>()});
    } else if (!data.value("train", "").empty()) {
      m.data_train.datasets.push_back({data.at("train").get<std::string>(), 1.0});
    }
    m.tokenizer = j.at("data").value("tokenizer", "");
    m.chat_template = j.at("data").value("chat_template", "");
    if (j.contains("lora")) {
      const json& l = j.at("lora");
      const std::optional<LoraTargetSet> targets = parse_lora_targets(l.at("targets").get<std::string>());
      if (!targets) throw UserError(fmt::format("{}: lora.targets = {}: expected {}", where, l.at("targets").dump(), kLoraTargetChoices));
      m.lora = {l.at("rank").get<int64_t>(), l.at("alpha").get<double>(), *targets};
    }
    if (j.contains("init_from")) {
      const json& i = j.at("init_from");
      m.init_from = {i.at("from").get<std::string>(), i.at("step").get<int64_t>(),
                     i.at("fingerprint").get<std::string>()};
    }
    for (const json& f : j.at("files")) {
      m.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<int64_t>(),
                         f.at("crc32").get<uint32_t>()});
    }
    for (const auto& [name, t] : j.at("tensors").items()) {
      const auto global = t.at("global_shape").get<std::vector<int64_t>>();
      for (const json& s : t.at("shards")) {
        StoredPiece sp;
        sp.file = s.at("file").get<int>();
        if (sp.file < 0 || sp.file >= static_cast<int>(m.files.size())) {
          throw UserError(fmt::format("{}: tensor {} names file {}, but the manifest lists {} "
                                      "files", where, name, sp.file, m.files.size()));
        }
        sp.piece.name = name;
        sp.piece.global_shape = global;
        sp.piece.offset = s.at("offset").get<std::vector<int64_t>>();
        sp.piece.shape = s.at("shape").get<std::vector<int64_t>>();
        const auto range = s.at("flat_range").get<std::vector<int64_t>>();
        if (range.size() != 2 || sp.piece.offset.size() != global.size() ||
            sp.piece.shape.size() != global.size() || range[0] < 0 || range[0] > range[1] ||
            range[1] > sp.piece.rect_numel()) {
          throw UserError(fmt::format("{}: tensor {}: a shard's offset/shape/flat_range do not "
                                      "fit its global shape", where, name));
        }
        sp.piece.flat_begin = range[0];
        sp.piece.flat_end = range[1];
        m.tensors[name].push_back(std::move(sp));
      }
    }
  } catch (const json::exception& e) {
    throw UserError(fmt::format("{}: malformed manifest ({})", where, e.what()));
  }
  return m;
}

void check_manifest_model(const Manifest& m, const ModelConfig& run, const std::string& where,
                          const std::string& run_source) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> keys[] = {
      {"layers", {m.model.layers, run.layers}},   {"d_model", {m.model.d_model, run.d_model}},
      {"heads", {m.model.heads, run.heads}},      {"ffn", {m.model.ffn_dim(), run.ffn_dim()}},
      {"vocab", {m.model.vocab, run.vocab}},      {"context", {m.model.context, run.context}}};
  for (const auto& [key, values] : keys) {
    if (values.first != values.second) {
      throw UserError(fmt::format("{}: model.{} = {} in the checkpoint, but {} says {}: a "
                                  "checkpoint loads only into the model it was saved from",
                                  where, key, values.first, run_source, values.second));
    }
  }
  const std::string saved = architecture_line(m.model), wanted = architecture_line(run);
  if (saved != wanted) {
    throw UserError(fmt::format("{}: the checkpoint's block is {}, but {} says {}: a checkpoint "
                                "loads only into the model it was saved from",
                                where, saved, run_source, wanted));
  }
}

void check_adapter_base(const Manifest& adapter, const std::string& adapter_where,
                        const Manifest& base, const std::string& base_where) {
  if (adapter.lora.rank <= 0) {
    throw UserError(fmt::format("{}: not a LoRA checkpoint (its manifest has no \"lora\"): "
                                "adapters come from a finetune.method = \"lora\" run",
                                adapter_where));
  }
  if (adapter.init_from.from.empty()) {
    throw UserError(fmt::format("{}: records no base (init_from)", adapter_where));
  }
  const std::string found = weights_fingerprint(base);
  if (found != adapter.init_from.fingerprint) {
    throw UserError(fmt::format("{}: trained on the base {} (fingerprint {}), but {} has "
                                "fingerprint {}: adapters run only on their own base",
                                adapter_where, adapter.init_from.from,
                                adapter.init_from.fingerprint, base_where, found));
  }
  check_manifest_model(base, adapter.model, base_where, adapter_where);
}

std::string shard_record_to_json(const ShardFileInfo& file, const std::vector<TensorPiece>& pieces) {
  json j = {{"name", file.name}, {"bytes", file.bytes}, {"crc32", file.crc32}};
  json ps = json::array();
  for (const TensorPiece& p : pieces) {
    json e = piece_json(p);
    e["name"] = p.name;
    e["global_shape"] = p.global_shape;
    ps.push_back(e);
  }
  j["pieces"] = ps;
  return j.dump();
}

void add_shard_record(Manifest& m, const std::string& record_json) {
  const json j = json::parse(record_json);
  const int file = static_cast<int>(m.files.size());
  m.files.push_back({j.at("name").get<std::string>(), j.at("bytes").get<int64_t>(),
                     j.at("crc32").get<uint32_t>()});
  for (const json& e : j.at("pieces")) {
    StoredPiece sp;
    sp.file = file;
    sp.piece.name = e.at("name").get<std::string>();
    sp.piece.global_shape = e.at("global_shape").get<std::vector<int64_t>>();
    sp.piece.offset = e.at("offset").get<std::vector<int64_t>>();
    sp.piece.shape = e.at("shape").get<std::vector<int64_t>>();
    const auto range = e.at("flat_range").get<std::vector<int64_t>>();
    sp.piece.flat_begin = range[0];
    sp.piece.flat_end = range[1];
    m.tensors[sp.piece.name].push_back(std::move(sp));
  }
}

std::optional<std::vector<char>> read_verified_shard_file(Storage& storage, const std::string& dir,
                                                          const ShardFileInfo& f,
                                                          std::string& why) {
  const std::string url = storage.url(join_dir(dir, f.name));
  std::optional<std::vector<char>> bytes = storage.read(join_dir(dir, f.name));
  if (!bytes) {
    why = fmt::format("{}: shard file is missing", url);
  } else if (static_cast<int64_t>(bytes->size()) != f.bytes) {
    why = fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced)", url,
                      bytes->size(), f.bytes);
  } else if (const uint32_t crc = file_crc32(*bytes); crc != f.crc32) {
    why = fmt::format("{}: CRC-32 {:08x}, the manifest says {:08x} (the file is corrupt)", url,
                      crc, f.crc32);
  } else {
    return bytes;
  }
  return std::nullopt;
}

}  // namespace jumbo
