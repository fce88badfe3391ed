// Reading run configs and model presets from TOML, applying `--set section.key=value`
// overrides, and writing the resolved config back out (describe).
//
// One table (the schema below) lists every section and key with the struct field it fills,
// so loading, the "known keys" in error messages and describe() can never disagree.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "jumbo/config/config.h"

namespace jumbo {
namespace {

enum class Kind { integer, seed, number, string, choice, boolean, integer_list, mixture };

// A key whose value is one of a few names, stored as an enum: the names in enum order (the
// enum's values are 0, 1, ...) and how to read and write the field.
struct Choice {
  std::vector<std::string_view> names;
  size_t (*get)(const void* field);
  void (*set)(void* field, size_t index);
  std::optional<size_t> index_of(std::string_view name) const {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return i;
    return std::nullopt;
  }
  // The names joined for an error, each as `item` formats it: "\"{}\"" (a TOML string, the
  // config's errors) gives "\"fp32\" or \"bf16\"", "{}" (a flag's) "fp32 or bf16".
  std::string listed(std::string_view item) const {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) {
      out += i == 0 ? "" : (i + 1 == names.size() ? " or " : ", ");
      out += fmt::format(fmt::runtime(item), names[i]);
    }
    return out;
  }
};

template <typename E, size_t N>
const Choice* choice_of() {
  static const Choice c = [] {
    Choice out;
    for (size_t i = 0; i < N; ++i) out.names.emplace_back(to_string(static_cast<E>(i)));
    out.get = [](const void* f) { return static_cast<size_t>(*static_cast<const E*>(f)); };
    out.set = [](void* f, size_t i) { *static_cast<E*>(f) = static_cast<E>(i); };
    return out;
  }();
  return &c;
}

template <typename T>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<T, int64_t>) return Kind::integer;
  else if constexpr (std::is_same_v<T, uint64_t>) return Kind::seed;
  else if constexpr (std::is_same_v<T, double>) return Kind::number;
  else if constexpr (std::is_same_v<T, std::string>) return Kind::string;
  else if constexpr (std::is_same_v<T, bool>) return Kind::boolean;
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return Kind::integer_list;
  else if constexpr (std::is_same_v<T, DataMixture>) return Kind::mixture;
  else {
    static_assert(std::is_enum_v<T>, "config field of an unsupported type");
    return Kind::choice;
  }
}

template <typename T>
const Choice* choice_for() {
  if constexpr (std::is_same_v<T, Precision>) return choice_of<Precision, 2>();
  else if constexpr (std::is_same_v<T, Recompute>) return choice_of<Recompute, 3>();
  else if constexpr (std::is_same_v<T, Device>) return choice_of<Device, 2>();
  else if constexpr (std::is_same_v<T, AnomalyAction>) return choice_of<AnomalyAction, 3>();
  else if constexpr (std::is_same_v<T, ExpectNetwork>) return choice_of<ExpectNetwork, 4>();
  else if constexpr (std::is_same_v<T, FineTune>) return choice_of<FineTune, 3>();
  else if constexpr (std::is_same_v<T, CommEmulation>) return choice_of<CommEmulation, 2>();
  else if constexpr (std::is_same_v<T, Norm>) return choice_of<Norm, 2>();
  else if constexpr (std::is_same_v<T, PositionEncoding>) return choice_of<PositionEncoding, 2>();
  else if constexpr (std::is_same_v<T, RopeScaling>) return choice_of<RopeScaling, 2>();
  else if constexpr (std::is_same_v<T, Mlp>) return choice_of<Mlp, 2>();
  else return nullptr;
}

struct Field {
  std::string_view key;
  Kind kind;
  void* (*address)(RunConfig&);
  const Choice* choice = nullptr;  // Kind::choice
};

struct Section {
  std::string_view name;
  std::vector<Field> fields;
};

// A key named like the struct member it fills, typed from that member; JUMBO_KEY for a key
// whose member lives elsewhere.
#define JUMBO_KEY(key, member)                                                           \
  Field {                                                                                \
    key, kind_of<std::remove_cvref_t<decltype(std::declval<RunConfig&>().member)>>(),     \
        [](RunConfig& c) -> void* { return &c.member; },                                 \
        choice_for<std::remove_cvref_t<decltype(std::declval<RunConfig&>().member)>>()   \
  }
#define JUMBO_FIELD(section, member) JUMBO_KEY(#member, section.member)

const std::vector<Section>& schema() {
  static const std::vector<Section> sections = {
      {"model",
       {JUMBO_FIELD(model, preset), JUMBO_FIELD(model, name), JUMBO_FIELD(model, layers),
        JUMBO_FIELD(model, d_model), JUMBO_FIELD(model, heads), JUMBO_FIELD(model, ffn),
        JUMBO_FIELD(model, vocab), JUMBO_FIELD(model, context),
        JUMBO_FIELD(model, vocab_multiple), JUMBO_FIELD(model, norm),
        JUMBO_FIELD(model, norm_eps), JUMBO_FIELD(model, position), JUMBO_FIELD(model, rope_theta),
        JUMBO_FIELD(model, rope_scaling), JUMBO_FIELD(model, rope_factor),
        JUMBO_FIELD(model, rope_low_freq_factor), JUMBO_FIELD(model, rope_high_freq_factor),
        JUMBO_FIELD(model, rope_original_context), JUMBO_FIELD(model, mlp),
        JUMBO_FIELD(model, kv_heads), JUMBO_FIELD(model, tied_embeddings),
        JUMBO_FIELD(model, linear_bias), JUMBO_FIELD(model, qkv_bias),
        JUMBO_FIELD(model, qk_norm)}},
      {"parallel",
       {JUMBO_FIELD(parallel, tp), JUMBO_FIELD(parallel, pp),
        JUMBO_FIELD(parallel, micro_batch), JUMBO_FIELD(parallel, zero1),
        JUMBO_FIELD(parallel, bucket_size), JUMBO_FIELD(parallel, recompute),
        JUMBO_FIELD(parallel, stage_layers), JUMBO_FIELD(parallel, sequence_parallel),
        JUMBO_FIELD(parallel, virtual_stages),
        JUMBO_FIELD(parallel, comm_timeout_s)}},
      {"train",
       {JUMBO_FIELD(train, steps), JUMBO_FIELD(train, global_batch), JUMBO_FIELD(train, lr),
        JUMBO_FIELD(train, min_lr), JUMBO_FIELD(train, warmup_tokens),
        JUMBO_FIELD(train, decay_tokens), JUMBO_FIELD(train, rampup_start_batch),
        JUMBO_FIELD(train, rampup_tokens), JUMBO_FIELD(train, weight_decay),
        JUMBO_FIELD(train, beta1), JUMBO_FIELD(train, beta2), JUMBO_FIELD(train, eps),
        JUMBO_FIELD(train, grad_clip), JUMBO_FIELD(train, seed), JUMBO_FIELD(train, precision),
        JUMBO_FIELD(train, eval_every), JUMBO_FIELD(train, eval_batches),
        JUMBO_FIELD(train, threads), JUMBO_FIELD(train, on_anomaly),
        JUMBO_FIELD(train, spike_ratio), JUMBO_FIELD(train, spike_window),
        JUMBO_FIELD(train, max_anomalies), JUMBO_FIELD(train, anomaly_window),
        JUMBO_FIELD(train, rewind_skip_batches),
        // The device is part of the layout; users have always set it with the run's training.
        JUMBO_KEY("device", parallel.device), JUMBO_FIELD(train, gpu),
        JUMBO_FIELD(train, init_from)}},
      {"data", {JUMBO_FIELD(data, train), JUMBO_FIELD(data, valid), JUMBO_FIELD(data, tokenizer),
                JUMBO_FIELD(data, chat_template), JUMBO_FIELD(data, packing)}},
      {"checkpoint",
       {JUMBO_FIELD(checkpoint, dir), JUMBO_FIELD(checkpoint, every),
        JUMBO_FIELD(checkpoint, resume), JUMBO_FIELD(checkpoint, async),
        JUMBO_FIELD(checkpoint, keep_last), JUMBO_FIELD(checkpoint, keep_every),
        JUMBO_FIELD(checkpoint, s3_region), JUMBO_FIELD(checkpoint, s3_endpoint)}},
      {"log",
       {JUMBO_FIELD(log, metrics_file), JUMBO_FIELD(log, every), JUMBO_FIELD(log, peak_tflops),
        JUMBO_FIELD(log, comm), JUMBO_FIELD(log, emf_file), JUMBO_FIELD(log, emf_address),
        JUMBO_FIELD(log, emf_namespace), JUMBO_FIELD(log, run_name),
        JUMBO_FIELD(log, straggler_ratio), JUMBO_FIELD(log, straggler_intervals)}},
      {"comm", {JUMBO_FIELD(comm, expect_network), JUMBO_FIELD(comm, emulate)}},
      {"finetune",
       {JUMBO_FIELD(finetune, method), JUMBO_FIELD(finetune, lora_rank),
        JUMBO_FIELD(finetune, lora_alpha), JUMBO_FIELD(finetune, lora_targets),
        JUMBO_FIELD(finetune, lora_dropout)}},
  };
  return sections;
}
#undef JUMBO_FIELD
#undef JUMBO_KEY

const Section& model_section() { return schema().front(); }

const Section* find_section(std::string_view name) {
  for (const Section& s : schema())
    if (s.name == name) return &s;
  return nullptr;
}

// `skip` leaves a key out of a preset file's allowed keys (a preset cannot name a preset).
const Field* find_field(const Section& s, std::string_view key, std::string_view skip = {}) {
  for (const Field& f : s.fields)
    if (f.key == key && f.key != skip) return &f;
  return nullptr;
}

std::string known_keys(const Section& s, std::string_view skip = {}) {
  std::string out;
  for (const Field& f : s.fields) {
    if (f.key == skip) continue;
    if (!out.empty()) out += ", ";
    out += f.key;
  }
  return out;
}

std::string known_sections() {
  std::string out;
  for (const Section& s : schema()) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

}  // namespace

// A TOML basic string: what the user would type, and valid TOML for describe().
std::string toml_quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
  return out + "\"";
}

namespace {

// Shortest text that reads back as the same double, always with a '.', 'e', "inf" or "nan".
std::string number_text(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_not_of("-0123456789") == std::string::npos) s += ".0";
  return s;
}

// A value as the user wrote it, on one line, for messages.
std::string show(const toml::node& node) {
  if (auto s = node.as_string()) return toml_quoted(s->get());
  if (auto i = node.as_integer()) return fmt::format("{}", i->get());
  if (auto d = node.as_floating_point()) return number_text(d->get());
  if (auto b = node.as_boolean()) return b->get() ? "true" : "false";
  std::ostringstream os;
  node.visit([&](auto&& v) { os << v; });
  std::string text = os.str();
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

// Where a value came from, for the front of a message: a file (with the value's line) or
// one --set override.
struct Origin {
  std::string where;   // "inputs/runs/demo.toml" or "--set 'train.lr=1'"
  bool from_file = true;
  std::string base_dir;  // relative paths written here are relative to it ("": the cwd)

  std::string line_note(const toml::node& node) const {
    if (!from_file || node.source().begin.line == 0) return "";
    return fmt::format(" (line {})", node.source().begin.line);
  }
};

[[noreturn]] void bad_value(const Origin& at, const Section& s, const Field& f,
                            const toml::node& value, std::string_view expected) {
  throw UserError(fmt::format("{}: {}.{} = {}: expected {}{}", at.where, s.name, f.key,
                              show(value), expected, at.line_note(value)));
}

// 1e6 is a fine way to write an integer; 1.5 is not.
int64_t integer_value(const Origin& at, const Section& s, const Field& f, const toml::node& v) {
  if (auto i = v.as_integer()) return i->get();
  if (auto d = v.as_floating_point()) {
    const double x = d->get();
    // 2^63 is exactly representable; every double below it in magnitude fits in int64.
    if (std::isfinite(x) && x == std::trunc(x) && std::fabs(x) < 9223372036854775808.0)
      return static_cast<int64_t>(x);
  }
  bad_value(at, s, f, v, "an integer");
}

// The keys whose values are paths of files or directories.
bool is_path(const Section& s, const Field& f) {
  const std::string key = fmt::format("{}.{}", s.name, f.key);
  for (const char* p : {"model.preset", "data.train", "data.valid", "data.tokenizer", "data.chat_template",
                        "checkpoint.dir", "log.metrics_file", "log.emf_file", "train.init_from"}) {
    if (key == p) return true;
  }
  return false;
}

// A path as written, or relative to the origin's base directory.
std::string resolved(const Origin& at, const Section& s, const Field& f, const std::string& value) {
  if (at.base_dir.empty() || value.empty() || !is_path(s, f) || value.front() == '/' ||
      value.rfind("s3://", 0) == 0) {
    return value;
  }
  return (std::filesystem::path(at.base_dir) / value).string();
}

constexpr std::string_view kMixtureForms =
    "a dataset prefix, Megatron's form \"0.6 data/web 0.4 data/books\", or an array "
    "[0.6, \"data/web\", 0.4, \"data/books\"]";

// A string in Megatron's form, or an array of alternating weights and prefixes, or of
// prefixes alone (equal weights); each prefix resolved like any path.
DataMixture mixture_value(const Origin& at, const Section& s, const Field& f, const toml::node& v) {
  DataMixture m;
  if (auto str = v.as_string()) {
    try {
      m = parse_mixture(str->get());
    } catch (const UserError& e) {
      throw UserError(fmt::format("{}: {}.{} = {}{}", at.where, s.name, f.key, e.what(),
                                  at.line_note(v)));
    }
  } else if (const toml::array* arr = v.as_array()) {
    const bool weighted = !arr->empty() && (*arr)[0].is_number();
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::node& item = (*arr)[i];
      if (weighted && i % 2 == 0) {
        if (!item.is_number()) bad_value(at, s, f, v, kMixtureForms);
        m.datasets.push_back({"", item.value<double>().value_or(0)});
      } else {
        auto prefix = item.as_string();
        if (!prefix) bad_value(at, s, f, v, kMixtureForms);
        if (weighted) m.datasets.back().prefix = prefix->get();
        else m.datasets.push_back({prefix->get(), 1.0});
      }
    }
    if (weighted && arr->size() % 2 != 0) bad_value(at, s, f, v, kMixtureForms);
  } else {
    bad_value(at, s, f, v, kMixtureForms);
  }
  for (DatasetWeight& d : m.datasets) d.prefix = resolved(at, s, f, d.prefix);
  return m;
}

// The TOML text of a mixture: Megatron's form, or an array when a prefix holds whitespace.
std::string mixture_text(const DataMixture& m) {
  bool spaced = false;
  for (const DatasetWeight& d : m.datasets)
    spaced = spaced || d.prefix.find_first_of(" \t") != std::string::npos;
  if (!spaced) return toml_quoted(m.describe());
  std::string out = "[";
  for (size_t i = 0; i < m.datasets.size(); ++i) {
    out += fmt::format("{}{}, {}", i ? ", " : "", number_text(m.datasets[i].weight),
                       toml_quoted(m.datasets[i].prefix));
  }
  return out + "]";
}

void assign(RunConfig& cfg, const Origin& at, const Section& s, const Field& f,
            const toml::node& v) {
  void* target = f.address(cfg);
  switch (f.kind) {
    case Kind::integer:
      *static_cast<int64_t*>(target) = integer_value(at, s, f, v);
      return;
    case Kind::seed: {
      const int64_t x = integer_value(at, s, f, v);
      if (x < 0) bad_value(at, s, f, v, "a non-negative integer");
      *static_cast<uint64_t*>(target) = static_cast<uint64_t>(x);
      return;
    }
    case Kind::number:
      if (auto d = v.as_floating_point()) *static_cast<double*>(target) = d->get();
      else if (auto i = v.as_integer()) *static_cast<double*>(target) = static_cast<double>(i->get());
      else bad_value(at, s, f, v, "a number");
      return;
    case Kind::string:
      if (auto str = v.as_string()) *static_cast<std::string*>(target) = resolved(at, s, f, str->get());
      else bad_value(at, s, f, v, "a string");
      return;
    case Kind::boolean:
      if (auto b = v.as_boolean()) *static_cast<bool*>(target) = b->get();
      else bad_value(at, s, f, v, "true or false");
      return;
    case Kind::integer_list: {
      auto* list = static_cast<std::vector<int64_t>*>(target);
      list->clear();
      const toml::array* arr = v.as_array();
      if (!arr) bad_value(at, s, f, v, "an array of integers, e.g. [10, 10, 9]");
      for (const toml::node& item : *arr) {
        const auto i = item.as_integer();
        if (!i) bad_value(at, s, f, v, "an array of integers, e.g. [10, 10, 9]");
        list->push_back(i->get());
      }
      return;
    }
    case Kind::mixture:
      *static_cast<DataMixture*>(target) = mixture_value(at, s, f, v);
      return;
    case Kind::choice: {
      auto str = v.as_string();
      if (const std::optional<size_t> i = str ? f.choice->index_of(str->get()) : std::nullopt) {
        return f.choice->set(target, *i);
      }
      bad_value(at, s, f, v, f.choice->listed("\"{}\""));
    }
  }
}

toml::table parse_toml(std::string_view text, const std::string& source) {
  try {
    return toml::parse(text, std::string_view(source));
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    for (char& c : what)
      if (c == '\n' || c == '\r') c = ' ';
    throw UserError(fmt::format("{}:{}:{}: TOML syntax error: {}", source, e.source().begin.line,
                                e.source().begin.column, what));
  }
}

// Applies one key of a section; an unknown key is an error that lists the known ones.
void apply_key(RunConfig& cfg, const Origin& at, const Section& s, std::string_view key,
               const toml::node& value, std::string_view skip = {}) {
  const Field* f = find_field(s, key, skip);
  if (!f)
    throw UserError(fmt::format("{}: unknown key {}.{}{}; known keys of [{}]: {}", at.where,
                                s.name, key, at.line_note(value), s.name, known_keys(s, skip)));
  assign(cfg, at, s, *f, value);
}

void apply_section(RunConfig& cfg, const Origin& at, const Section& s, const toml::table& table,
                   std::string_view skip = {}) {
  for (auto&& [key, value] : table) apply_key(cfg, at, s, key.str(), value, skip);
}

// The run file: sections only, each a table of known keys.
void apply_run_file(RunConfig& cfg, const Origin& at, const toml::table& root) {
  for (auto&& [name, node] : root) {
    const Section* s = find_section(name.str());
    const toml::table* table = node.as_table();
    if (s && !table)
      throw UserError(fmt::format("{}: {} = {}: expected a section [{}]{}", at.where, name.str(),
                                  show(node), name.str(), at.line_note(node)));
    if (!s && table)
      throw UserError(fmt::format("{}: unknown section [{}]{}; known sections: {}", at.where,
                                  name.str(), at.line_note(node), known_sections()));
    if (!s)
      throw UserError(fmt::format("{}: key {} = {} is outside any section{}; known sections: {}",
                                  at.where, name.str(), show(node), at.line_note(node),
                                  known_sections()));
    apply_section(cfg, at, *s, *table);
  }
}

// A preset: model keys at top level, or under [model].
ModelConfig read_preset(const std::string& path) {
  const toml::table root = parse_toml(read_file(path, "the model preset file"), path);
  RunConfig holder;
  const Origin at{path, true, ""};
  const Section& model = model_section();
  for (auto&& [key, value] : root) {
    if (key.str() == "model" && value.is_table()) {
      apply_section(holder, at, model, *value.as_table(), "preset");
    } else {
      apply_key(holder, at, model, key.str(), value, "preset");
    }
  }
  holder.model.preset = path;
  return holder.model;
}

struct Override {
  Origin at;
  const Section* section = nullptr;
  const Field* field = nullptr;
  toml::table holder;  // holds the value under key "v"
  const toml::node& value() const { return *holder.get("v"); }
};

// `section.key=value`; the value is TOML if it parses as one, else a bare string, so
// `--set train.precision=bf16` and `--set data.train=build/x` both work.
Override parse_override(const std::string& text) {
  Override o;
  o.at = Origin{fmt::format("--set '{}'", text), false, ""};
  const size_t eq = text.find('=');
  const std::string name = text.substr(0, eq);
  const size_t dot = name.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == name.size() ||
      name.find('.', dot + 1) != std::string::npos ||
      name.find_first_of(" \t") != std::string::npos)
    throw UserError(fmt::format("{}: expected section.key=value", o.at.where));
  const std::string section = name.substr(0, dot), key = name.substr(dot + 1);
  const std::string raw = text.substr(eq + 1);

  o.section = find_section(section);
  if (!o.section)
    throw UserError(fmt::format("{}: unknown section [{}]; known sections: {}", o.at.where,
                                section, known_sections()));
  o.field = find_field(*o.section, key);
  if (!o.field)
    throw UserError(fmt::format("{}: unknown key {}.{}; known keys of [{}]: {}", o.at.where,
                                section, key, section, known_keys(*o.section)));

  bool parsed = false;
  if (raw.find_first_of("\n\r") == std::string::npos) {
    auto doc = toml::parse_result{};
    try {
      doc = toml::parse("v = " + raw, std::string_view("--set"));
      parsed = doc.size() == 1 && doc.contains("v");
    } catch (const toml::parse_error&) {
    }
    const bool textual = o.field->kind == Kind::string || o.field->kind == Kind::choice ||
                         o.field->kind == Kind::mixture;
    // A path like 2024 or true is still a path when the key wants text.
    if (parsed && textual && !doc.get("v")->is_string() &&
        !(o.field->kind == Kind::mixture && doc.get("v")->is_array()))
      parsed = false;
    if (parsed) o.holder.insert("v", *doc.get("v"));
  }
  if (!parsed) o.holder.insert("v", raw);
  return o;
}

}  // namespace

std::string read_file(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path))
    throw UserError(fmt::format("{}: cannot open {} (paths are relative to the working directory {})",
                                path, what, std::filesystem::current_path().string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

RunConfig parse_run_config(const std::string& toml_text, const std::string& source,
                           const std::vector<std::string>& overrides, const std::string& base_dir) {
  const toml::table root = parse_toml(toml_text, source);
  std::vector<Override> sets;
  for (const std::string& text : overrides) sets.push_back(parse_override(text));

  // Precedence, lowest first: preset < the run file < --set. Read everything once to find
  // which preset wins, load it, then apply the file and the overrides over it.
  RunConfig cfg;
  cfg.source = source;
  const Origin file{source, true, base_dir};
  apply_run_file(cfg, file, root);
  std::string preset_origin = file.where;
  for (const Override& o : sets) {
    assign(cfg, o.at, *o.section, *o.field, o.value());
    if (o.field->key == "preset") preset_origin = o.at.where;
  }
  if (!cfg.model.preset.empty()) {
    const std::string path = cfg.model.preset;
    if (!std::filesystem::is_regular_file(path))
      throw UserError(fmt::format(
          "{}: model.preset = {}: no such preset file (paths are relative to the working "
          "directory {})",
          preset_origin, toml_quoted(path), std::filesystem::current_path().string()));
    cfg = RunConfig{};
    cfg.source = source;
    cfg.model = read_preset(path);
    apply_run_file(cfg, file, root);
    for (const Override& o : sets) assign(cfg, o.at, *o.section, *o.field, o.value());
  }
  validate(cfg, 0);
  return cfg;
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_run_config(read_file(path, "the run config file"), path, overrides);
}

ModelConfig load_model_config(const std::string& path) {
  ModelConfig m = read_preset(path);
  validate_model(m, path);
  return m;
}

namespace {

// A field's value as TOML, as `describe` and model presets write it.
std::string field_text(const Field& f, const void* p) {
  switch (f.kind) {
    case Kind::integer: return fmt::format("{}", *static_cast<const int64_t*>(p));
    case Kind::seed: return fmt::format("{}", *static_cast<const uint64_t*>(p));
    case Kind::number: return number_text(*static_cast<const double*>(p));
    case Kind::string: return toml_quoted(*static_cast<const std::string*>(p));
    case Kind::choice: return toml_quoted(f.choice->names[f.choice->get(p)]);
    case Kind::boolean: return *static_cast<const bool*>(p) ? "true" : "false";
    case Kind::mixture: return mixture_text(*static_cast<const DataMixture*>(p));
    case Kind::integer_list: {
      const auto& list = *static_cast<const std::vector<int64_t>*>(p);
      std::string value = "[";
      for (size_t i = 0; i < list.size(); ++i) value += fmt::format("{}{}", i ? ", " : "", list[i]);
      return value + "]";
    }
  }
  return "";
}

}  // namespace

std::string describe(const RunConfig& cfg_in) {
  RunConfig cfg = cfg_in;  // addresses come from a mutable config; nothing is changed
  std::string out = fmt::format("# resolved run config, read from {}\n", cfg.source);
  for (const Section& s : schema()) {
    out += fmt::format("\n[{}]\n", s.name);
    for (const Field& f : s.fields) out += fmt::format("{} = {}\n", f.key, field_text(f, f.address(cfg)));
  }
  return out;
}

std::string model_preset_toml(const ModelConfig& model) {
  RunConfig cfg;
  cfg.model = model;
  std::string out;
  for (const Section& s : schema()) {
    if (s.name != "model") continue;
    for (const Field& f : s.fields) {
      if (f.key == "preset") continue;  // a preset cannot name a preset
      out += fmt::format("{} = {}\n", f.key, field_text(f, f.address(cfg)));
    }
  }
  return out;
}

template <typename E>
std::optional<E> parse_choice(std::string_view name) {
  const std::optional<size_t> i = choice_for<E>()->index_of(name);
  return i ? std::optional<E>(static_cast<E>(*i)) : std::nullopt;
}

template <typename E>
std::string choice_names() {
  return choice_for<E>()->listed("{}");
}

#define JUMBO_CHOICE(E)                                              \
  template std::optional<E> parse_choice<E>(std::string_view name); \
  template std::string choice_names<E>();
JUMBO_CHOICE(Precision)
JUMBO_CHOICE(Recompute)
JUMBO_CHOICE(Device)
JUMBO_CHOICE(AnomalyAction)
JUMBO_CHOICE(ExpectNetwork)
JUMBO_CHOICE(FineTune)
JUMBO_CHOICE(CommEmulation)
#undef JUMBO_CHOICE

}  // namespace jumbo
