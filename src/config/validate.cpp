// Every consistency check of a run config, in one place (as Megatron-Core does it): each
// failure is one line that starts with the config's source and names the key(s), their
// values and what is allowed.
#include <cmath>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "jumbo/config/config.h"
#include "jumbo/config/gpus.h"

namespace jumbo {
namespace {

class Checks {
 public:
  explicit Checks(const std::string& source) : source_(source) {}

  template <typename... Args>
  void require(bool ok, fmt::format_string<Args...> message, Args&&... args) const {
    if (!ok)
      throw UserError(
          fmt::format("{}: {}", source_, fmt::format(message, std::forward<Args>(args)...)));
  }

  void positive(std::string_view key, int64_t v) const {
    require(v > 0, "{} = {}: expected > 0", key, v);
  }
  void at_least(std::string_view key, int64_t v, int64_t low) const {
    require(v >= low, "{} = {}: expected >= {}", key, v, low);
  }
  // Written as !(v < low) style comparisons so NaN fails every check.
  void positive(std::string_view key, double v) const {
    require(v > 0, "{} = {}: expected > 0", key, v);
  }
  void non_negative(std::string_view key, double v) const {
    require(v >= 0, "{} = {}: expected >= 0", key, v);
  }
  void unit_interval(std::string_view key, double v) const {
    require(v >= 0 && v < 1, "{} = {}: expected 0 <= {} < 1", key, v, key);
  }

 private:
  const std::string& source_;
};

// a * b, or -1 when it does not fit (operands are >= 1 by the time this is called).
int64_t product(int64_t a, int64_t b) {
  int64_t p = 0;
  return __builtin_mul_overflow(a, b, &p) ? -1 : p;
}

void check_model(const Checks& c, const ModelConfig& m) {
  c.positive("model.layers", m.layers);
  c.positive("model.d_model", m.d_model);
  c.positive("model.heads", m.heads);
  c.require(m.d_model % m.heads == 0, "model.heads = {} does not divide model.d_model = {}",
            m.heads, m.d_model);
  c.require(m.ffn >= 0, "model.ffn = {}: expected > 0, or 0 for 4 x d_model", m.ffn);
  c.require(m.ffn_dim() > 0, "model.ffn = {} gives an ffn width of {}: expected > 0", m.ffn,
            m.ffn_dim());
  c.positive("model.vocab", m.vocab);
  c.positive("model.context", m.context);
  c.positive("model.vocab_multiple", m.vocab_multiple);
  c.require(m.kv_heads >= 0 && (m.kv_heads == 0 || m.heads % m.kv_heads == 0),
            "model.kv_heads = {}: expected a divisor of model.heads = {} (0 for heads: "
            "multi-head attention)", m.kv_heads, m.heads);
  c.require(m.norm_eps > 0 && std::isfinite(m.norm_eps), "model.norm_eps = {}: expected > 0",
            m.norm_eps);
  if (m.position == PositionEncoding::learned) {
    // A rope key on a learned-position model is a mistake, not something to ignore.
    const ModelConfig defaults;
    const std::pair<std::string, bool> rope_keys[] = {
        {fmt::format("rope_theta = {}", m.rope_theta), m.rope_theta != defaults.rope_theta},
        {fmt::format("rope_scaling = \"{}\"", to_string(m.rope_scaling)),
         m.rope_scaling != defaults.rope_scaling},
        {fmt::format("rope_factor = {}", m.rope_factor), m.rope_factor != defaults.rope_factor},
        {fmt::format("rope_low_freq_factor = {}", m.rope_low_freq_factor),
         m.rope_low_freq_factor != defaults.rope_low_freq_factor},
        {fmt::format("rope_high_freq_factor = {}", m.rope_high_freq_factor),
         m.rope_high_freq_factor != defaults.rope_high_freq_factor},
        {fmt::format("rope_original_context = {}", m.rope_original_context),
         m.rope_original_context != defaults.rope_original_context}};
    for (const auto& [setting, set] : rope_keys) {
      c.require(!set, "model.{} on a model with model.position = \"learned\": expected "
                "model.position = \"rope\" for rotary position keys", setting);
    }
  } else {
    c.require(m.head_dim() % 2 == 0, "model.position = \"rope\" with a head size of {} "
              "(model.d_model / model.heads): expected an even head size (RoPE rotates pairs)",
              m.head_dim());
    c.require(m.rope_theta > 0 && std::isfinite(m.rope_theta),
              "model.rope_theta = {}: expected > 0", m.rope_theta);
  }
  if (m.rope_scaling == RopeScaling::llama3) {
    c.require(m.rope_factor >= 1 && std::isfinite(m.rope_factor),
              "model.rope_factor = {}: expected >= 1", m.rope_factor);
    c.require(m.rope_low_freq_factor > 0 && m.rope_high_freq_factor > m.rope_low_freq_factor,
              "model.rope_high_freq_factor = {} with model.rope_low_freq_factor = {}: expected "
              "0 < low < high", m.rope_high_freq_factor, m.rope_low_freq_factor);
    c.positive("model.rope_original_context", m.rope_original_context);
  }
}

// A layout key as the user wrote it: "parallel.virtual_stages = 2" or "--virtual-stages 2".
std::string key_of(LayoutKeys keys, std::string_view name) {
  if (keys == LayoutKeys::config) return fmt::format("parallel.{}", name);
  std::string flag = fmt::format("--{}", name);
  for (char& ch : flag)
    if (ch == '_') ch = '-';
  return flag;
}
template <typename T>
std::string setting(LayoutKeys keys, std::string_view name, const T& value) {
  return fmt::format("{}{}{}", key_of(keys, name), keys == LayoutKeys::config ? " = " : " ", value);
}

void check_layout(const Checks& c, const Layout& p, const ModelConfig& m, LayoutKeys keys) {
  auto set = [keys](std::string_view name, const auto& value) { return setting(keys, name, value); };
  for (const auto& [name, value] : {std::pair<std::string_view, int64_t>{"tp", p.tp},
                                    {"pp", p.pp}, {"dp", p.dp}, {"micro_batch", p.micro_batch},
                                    {"bucket_size", p.bucket_size},
                                    {"virtual_stages", p.virtual_stages}}) {
    c.require(value >= 1, "{}: expected >= 1", set(name, value));
  }
  if (p.virtual_stages > 1) {
    c.require(p.pp > 1 && m.layers % (p.pp * p.virtual_stages) == 0 && p.stage_layers.empty(),
              "{}: interleaving needs {} > 1 (now {}), model.layers = {} divisible by pp x "
              "virtual_stages, and no {}",
              set("virtual_stages", p.virtual_stages), key_of(keys, "pp"), p.pp, m.layers,
              key_of(keys, "stage_layers"));
  }
  c.require(!p.sequence_parallel || m.context % p.tp == 0,
            "{} with {}: model.context = {} must be divisible by tp (each tp rank holds "
            "context / tp positions)",
            set("sequence_parallel", "true"), set("tp", p.tp), m.context);
  if (!p.stage_layers.empty()) {
    int64_t sum = 0;
    bool positive = true;
    for (int64_t n : p.stage_layers) {
      sum += n;
      positive = positive && n >= 1;
    }
    c.require(static_cast<int64_t>(p.stage_layers.size()) == p.pp && positive && sum == m.layers,
              "{} has {} entries summing to {}: expected {} entries, each >= 1, summing to "
              "model.layers = {}",
              key_of(keys, "stage_layers"), p.stage_layers.size(), sum, set("pp", p.pp), m.layers);
  }
  c.require(m.heads % p.tp == 0, "{} does not divide model.heads = {}", set("tp", p.tp), m.heads);
  // Tensor parallelism splits whole key/value groups (Megatron's query groups).
  c.require(m.kv_head_count() % p.tp == 0,
            "{} does not divide model.kv_heads = {}: each tp rank holds whole key/value heads",
            set("tp", p.tp), m.kv_head_count());
  c.require(m.ffn_dim() % p.tp == 0, "{} does not divide the ffn width {}", set("tp", p.tp),
            m.ffn_dim());
  c.require(p.pp <= m.layers, "{} exceeds model.layers = {}: every pipeline stage needs a layer",
            set("pp", p.pp), m.layers);
}

// Returns dp (1 when the world size is not known yet).
int64_t check_parallel(const Checks& c, const RunConfig& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  check_layout(c, p, cfg.model, LayoutKeys::config);
  c.require(p.comm_timeout_s > 0 && std::isfinite(p.comm_timeout_s),
            "parallel.comm_timeout_s = {}: expected a positive number of seconds",
            p.comm_timeout_s);
  // NCCL's rules are emulated on MPI; on a GPU NCCL itself enforces them.
  c.require(cfg.comm.emulate == CommEmulation::none || p.device == Device::cpu,
            "comm.emulate = \"{}\" with train.device = \"{}\": expected \"none\" (the "
            "emulation holds MPI on CPU ranks to NCCL's rules; a GPU run uses NCCL itself)",
            to_string(cfg.comm.emulate), to_string(p.device));
  if (world_size == 0) return 1;
  c.require(world_size > 0, "world size {}: expected >= 1 process", world_size);
  const int64_t model_parallel = product(p.tp, p.pp);
  c.require(model_parallel > 0 && world_size % model_parallel == 0,
            "world size {} is not divisible by parallel.tp x parallel.pp = {} x {}: the world "
            "must be tp x pp x dp processes",
            world_size, p.tp, p.pp);
  return world_size / model_parallel;
}

void check_train(const Checks& c, const RunConfig& cfg, int64_t dp) {
  c.require(cfg.train.gpu.empty() || find_gpu(cfg.train.gpu) != nullptr,
            "train.gpu = \"{}\": expected one of {} (or \"\" for none)", cfg.train.gpu,
            known_gpu_names());
  const TrainConfig& t = cfg.train;
  const int64_t micro_batch = cfg.parallel.micro_batch;
  const int64_t per_step_unit = product(micro_batch, dp);  // sequences in one microbatch round
  c.positive("train.steps", t.steps);
  c.positive("train.global_batch", t.global_batch);
  c.require(per_step_unit > 0 && t.global_batch % per_step_unit == 0,
            "train.global_batch = {} is not a multiple of parallel.micro_batch x dp = {} x {} "
            "= {}",
            t.global_batch, micro_batch, dp, per_step_unit);
  c.positive("train.lr", t.lr);
  c.require(t.min_lr >= 0 && t.min_lr <= t.lr,
            "train.min_lr = {} with train.lr = {}: expected 0 <= min_lr <= lr", t.min_lr, t.lr);
  c.at_least("train.warmup_tokens", t.warmup_tokens, 0);
  c.at_least("train.decay_tokens", t.decay_tokens, 0);
  c.at_least("train.rampup_start_batch", t.rampup_start_batch, 0);
  c.at_least("train.rampup_tokens", t.rampup_tokens, 0);
  if (t.rampup_start_batch > 0) {
    c.require(t.rampup_start_batch % per_step_unit == 0,
              "train.rampup_start_batch = {} is not a multiple of parallel.micro_batch x dp = "
              "{} x {} = {}",
              t.rampup_start_batch, micro_batch, dp, per_step_unit);
    c.require(t.rampup_start_batch <= t.global_batch,
              "train.rampup_start_batch = {} exceeds train.global_batch = {}: the ramp grows "
              "the batch up to global_batch",
              t.rampup_start_batch, t.global_batch);
    c.require(t.rampup_tokens > 0,
              "train.rampup_tokens = {} with train.rampup_start_batch = {}: expected > 0 (or "
              "rampup_start_batch = 0 for no ramp-up)",
              t.rampup_tokens, t.rampup_start_batch);
  }
  c.non_negative("train.weight_decay", t.weight_decay);
  c.unit_interval("train.beta1", t.beta1);
  c.unit_interval("train.beta2", t.beta2);
  c.positive("train.eps", t.eps);
  c.require(t.grad_clip >= 0, "train.grad_clip = {}: expected >= 0 (0 disables clipping)",
            t.grad_clip);
  c.at_least("train.eval_every", t.eval_every, 0);
  c.at_least("train.eval_batches", t.eval_batches, 1);
  c.require(t.eval_every == 0 || t.eval_batches % dp == 0,
            "train.eval_batches = {} is not a multiple of the data-parallel size {}",
            t.eval_batches, dp);
  const int64_t pp = cfg.parallel.pp, v = cfg.parallel.virtual_stages;
  c.require(v <= 1 || per_step_unit <= 0 || (t.global_batch / per_step_unit) % pp == 0,
            "parallel.virtual_stages = {} needs the microbatches per step (train.global_batch / "
            "(micro_batch x dp) = {}) to be a multiple of parallel.pp = {}",
            v, per_step_unit > 0 ? t.global_batch / per_step_unit : 0, pp);
  c.require(t.threads >= 0, "train.threads = {}: expected >= 0 (0 = OMP_NUM_THREADS or cores)",
            t.threads);
  c.require(t.spike_ratio == 0 || t.spike_ratio > 1,
            "train.spike_ratio = {}: expected > 1 (a loss above spike_ratio x the running mean "
            "is a spike) or 0 (no spike detection)", t.spike_ratio);
  c.at_least("train.spike_window", t.spike_window, 1);
  c.at_least("train.max_anomalies", t.max_anomalies, 0);
  c.at_least("train.anomaly_window", t.anomaly_window, 1);
  c.at_least("train.rewind_skip_batches", t.rewind_skip_batches, 0);
  c.require(t.on_anomaly != AnomalyAction::rewind || !cfg.checkpoint.dir.empty(),
            "train.on_anomaly = \"rewind\" but checkpoint.dir is empty: a rewind goes back to "
            "the newest checkpoint; set checkpoint.dir and checkpoint.every");
}

void check_data(const Checks& c, const RunConfig& cfg) {
  const DataConfig& d = cfg.data;
  c.require(!d.train.empty(), "data.train is empty: expected the prefix of a prepared dataset "
            "(PREFIX.bin + PREFIX.idx) or a mixture \"0.6 data/web 0.4 data/books\"");
  using Keyed = std::pair<const char*, const DataMixture*>;
  for (const auto& [key, mix] : {Keyed{"data.train", &d.train}, Keyed{"data.valid", &d.valid}}) {
    for (size_t i = 0; i < mix->datasets.size(); ++i) {
      const DatasetWeight& w = mix->datasets[i];
      c.require(std::isfinite(w.weight) && w.weight > 0,
                "{} = \"{}\": dataset {} has weight {}, expected a number > 0", key,
                mix->describe(), w.prefix, w.weight);
    }
  }
  for (size_t i = 0; i < d.valid.datasets.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      c.require(d.valid.name(i) != d.valid.name(j),
                "data.valid = \"{}\": {} and {} are both named {} in the metrics "
                "(val_loss.{}); give the validation sets distinct file names",
                d.valid.describe(), d.valid.datasets[j].prefix, d.valid.datasets[i].prefix,
                d.valid.name(i), d.valid.name(i));
    }
  }
  c.require(!d.valid.empty() || cfg.train.eval_every == 0,
            "data.valid is empty but train.eval_every = {}: set data.valid or train.eval_every "
            "= 0",
            cfg.train.eval_every);
  c.require(!d.tokenizer.empty(),
            "data.tokenizer is empty: expected a SentencePiece .model or a tokenizer.json file");
}

void check_checkpoint(const Checks& c, const CheckpointConfig& k) {
  c.at_least("checkpoint.every", k.every, 0);
  c.at_least("checkpoint.keep_last", k.keep_last, 0);
  c.at_least("checkpoint.keep_every", k.keep_every, 0);
  c.require(!k.resume.empty(),
            "checkpoint.resume is empty: expected \"none\", \"auto\", a step number or the "
            "path of a checkpoint directory");
  c.require(k.every == 0 || !k.dir.empty(),
            "checkpoint.every = {} but checkpoint.dir is empty: expected a directory or "
            "s3://bucket/prefix to save into",
            k.every);
  const bool step_number =
      k.resume.find_first_not_of("0123456789") == std::string::npos && !k.resume.empty();
  c.require(!(k.resume == "auto" || step_number) || !k.dir.empty(),
            "checkpoint.resume = \"{}\" but checkpoint.dir is empty: expected the directory "
            "the checkpoints are in",
            k.resume);
  c.require(k.keep_every == 0 || k.every == 0 || k.keep_every % k.every == 0,
            "checkpoint.keep_every = {} is not a multiple of checkpoint.every = {}: no saved "
            "step would be kept for good",
            k.keep_every, k.every);
  c.require(k.dir.rfind("s3://", 0) != 0 || k.dir.size() > 5,
            "checkpoint.dir = \"{}\": expected s3://bucket or s3://bucket/prefix", k.dir);
}

void check_log(const Checks& c, const LogConfig& l) {
  c.at_least("log.every", l.every, 1);
  c.require(l.peak_tflops >= 0, "log.peak_tflops = {}: expected >= 0 (0 = measure this machine)",
            l.peak_tflops);
  // tcp://HOST:PORT or udp://HOST:PORT, as the CloudWatch agent's emf endpoint is written.
  const std::string& a = l.emf_address;
  const bool scheme = a.rfind("tcp://", 0) == 0 || a.rfind("udp://", 0) == 0;
  const size_t colon = a.rfind(':');
  const std::string port = colon == std::string::npos ? "" : a.substr(colon + 1);
  const bool port_ok = !port.empty() && port.size() <= 5 &&
                       port.find_first_not_of("0123456789") == std::string::npos &&
                       std::stoi(port) > 0 && std::stoi(port) < 65536;
  c.require(a.empty() || (scheme && colon > 6 && port_ok),
            "log.emf_address = \"{}\": expected tcp://HOST:PORT or udp://HOST:PORT "
            "(the CloudWatch agent listens on tcp://127.0.0.1:25888)", a);
  c.require(l.straggler_ratio > 1, "log.straggler_ratio = {}: expected > 1 (a rank slower "
            "than straggler_ratio x its stage's median is a straggler)", l.straggler_ratio);
  c.at_least("log.straggler_intervals", l.straggler_intervals, 1);
  c.require(!l.emf_namespace.empty() && l.emf_namespace.size() <= 255,
            "log.emf_namespace = \"{}\": expected 1 to 255 characters", l.emf_namespace);
}

}  // namespace

void validate_model(const ModelConfig& m, const std::string& source) {
  check_model(Checks(source), m);
}

namespace {
// dp: what the world leaves, or (world_size 0) 1.
void check_finetune(const Checks& c, const RunConfig& cfg) {
  const FinetuneConfig& f = cfg.finetune;
  c.require(f.lora_dropout >= 0 && f.lora_dropout < 1, "finetune.lora_dropout = {}: expected 0 <= p < 1",
            f.lora_dropout);
  c.require(f.lora_dropout == 0 || f.method == FineTune::lora,
            "finetune.lora_dropout = {}: only with finetune.method = \"lora\"", f.lora_dropout);
  if (f.method != FineTune::lora) return;
  c.require(f.lora_rank >= 1 && f.lora_rank <= cfg.model.d_model,
            "finetune.lora_rank = {}: expected 1 .. model.d_model = {}", f.lora_rank,
            cfg.model.d_model);
  c.require(f.lora_alpha > 0, "finetune.lora_alpha = {}: expected > 0", f.lora_alpha);
  const std::optional<LoraTargetSet> targets = parse_lora_targets(f.lora_targets, cfg.model);
  c.require(targets.has_value(), "finetune.lora_targets = \"{}\": expected {}",
            f.lora_targets, kLoraTargetChoices);
  const std::string problem = lora_targets_problem(*targets, cfg.model);
  c.require(problem.empty(), "finetune.lora_targets = \"{}\": {}", f.lora_targets, problem);
  c.require(!cfg.train.init_from.empty() || cfg.checkpoint.resume != "none",
            "finetune.method = \"lora\" but train.init_from is empty: LoRA trains adapters on "
            "a trained model's weights (set train.init_from to its checkpoint)");
}

int64_t check_run(const RunConfig& cfg, int world_size) {
  const Checks c(cfg.source);
  check_model(c, cfg.model);
  const int64_t dp = check_parallel(c, cfg, world_size);
  check_train(c, cfg, dp);
  check_data(c, cfg);
  check_checkpoint(c, cfg.checkpoint);
  check_log(c, cfg.log);
  check_finetune(c, cfg);
  return dp;
}
}  // namespace

void validate(const RunConfig& cfg, int world_size) { check_run(cfg, world_size); }

RunConfig validated_for_world(const RunConfig& cfg, int world_size) {
  RunConfig out = cfg;
  out.parallel.dp = 1;  // the dp of an earlier world does not count against this one
  out.parallel.dp = check_run(out, world_size);
  return out;
}

void validate_layout(const Layout& layout, const ModelConfig& model, const std::string& source,
                     LayoutKeys keys) {
  const Checks c(source);
  check_model(c, model);
  check_layout(c, layout, model, keys);
}

}  // namespace jumbo
