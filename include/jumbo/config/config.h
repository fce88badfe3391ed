#pragma once
// Run configuration: one struct per TOML section, validated in one place (validate.cpp).
// Defaults are GPT-3's published values (Brown et al. 2020, table 2.1 and appendix B).
#include <cstdint>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "jumbo/config/layout.h"

namespace jumbo {

// A user mistake: one line naming the file/key/rank, the value and what was expected.
// The CLI prints what() and exits non-zero; never a stack trace.
struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Precision { fp32, bf16 };
const char* to_string(Precision p);

// What a run does with an anomalous step (train.on_anomaly, docs/config.md "Anomalies"): end
// the run before the update, skip the update (the batch's samples are skipped), or go back to
// the newest checkpoint before it and skip the batches from there (PaLM's remedy).
enum class AnomalyAction { stop, skip, rewind };
const char* to_string(AnomalyAction a);
// A non-finite loss or grad norm, or a loss above train.spike_ratio x the running mean.
enum class AnomalyKind { nonfinite, spike };
const char* to_string(AnomalyKind k);

// A range of the data order the run did not train on (train.on_anomaly): the batch of an
// anomalous step (skip), or the batches from the checkpoint a rewind went back to. The
// checkpoint manifest records them and the metrics report them, so they live here.
struct SkippedSamples {
  int64_t step = 0;  // the anomalous step
  int64_t first_sample = 0, end_sample = 0;  // [first, end) of the data order
  AnomalyKind kind = AnomalyKind::nonfinite;
  AnomalyAction action = AnomalyAction::skip;
  double loss = 0;              // the anomalous step's loss (NaN when not finite)
  int64_t rewound_to_step = 0;  // rewind: the checkpoint's step
  bool operator==(const SkippedSamples&) const = default;
};

// Fine-tuning (docs/finetune.md): none (pre-training), every weight trained (full), or LoRA
// adapters (Hu et al. 2021) on a frozen base.
enum class FineTune : uint8_t { none, full, lora };
const char* to_string(FineTune f);

// The linear maps of a layer that can carry a LoRA adapter x -> x A^T B^T (A [r x in], B
// [out x r]), and a set of them. qkv is the whole q/k/v map (one adapter over the three); q,
// k and v each part alone (PEFT's q_proj, k_proj, v_proj); proj the attention's output
// (o_proj); fc1 a GELU MLP's up map; gate and up SwiGLU's two (gate_proj, up_proj); fc2 the
// MLP's down map (down_proj).
enum class LoraTarget : uint8_t { qkv, proj, fc1, fc2, q, k, v, gate, up };
inline constexpr LoraTarget kLoraTargets[] = {LoraTarget::qkv, LoraTarget::proj, LoraTarget::fc1,
                                              LoraTarget::fc2, LoraTarget::q,    LoraTarget::k,
                                              LoraTarget::v,   LoraTarget::gate, LoraTarget::up};
inline constexpr size_t kLoraTargetCount = std::size(kLoraTargets);
const char* to_string(LoraTarget t);
struct LoraTargetSet {
  uint16_t bits = 0b1111;  // qkv, proj, fc1, fc2: every map of the GPT block
  static LoraTargetSet none() { return LoraTargetSet{.bits = 0}; }
  bool has(LoraTarget t) const { return (bits >> static_cast<int>(t)) & 1; }
  void add(LoraTarget t) { bits = static_cast<uint16_t>(bits | (1u << static_cast<int>(t))); }
  int64_t count() const;
  bool operator==(const LoraTargetSet&) const = default;
};
// "qkv,fc2": a comma-separated, non-empty list of the names of LoraTarget, each at most once.
// With a model, also "all": every map of its block (every_lora_target).
std::optional<LoraTargetSet> parse_lora_targets(std::string_view list);
struct ModelConfig;
std::optional<LoraTargetSet> parse_lora_targets(std::string_view list, const ModelConfig& model);
inline constexpr const char* kLoraTargetChoices =
    "\"all\" or a comma-separated list of qkv, q, k, v, proj, fc1, gate, up, fc2 (each at most "
    "once)";
// "qkv, proj, fc1, fc2", in kLoraTargets' order.
std::string describe(LoraTargetSet targets);

// A LoRA adapter's shape: rank r, scale alpha / r, on these maps of every layer.
struct LoraShape {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 0;
  LoraTargetSet targets;
  double scale() const { return alpha / static_cast<double>(rank); }
  bool operator==(const LoraShape&) const = default;
};

// The model's architecture, one component per key (Megatron-Core's and torchtitan's flags),
// each defaulting to the GPT-3 block: model/spec.h turns them into the shapes every floor
// reads. Llama-family models are rmsnorm + rope + swiglu, kv_heads < heads, untied, no biases.
enum class Norm : uint8_t { layernorm, rmsnorm };
const char* to_string(Norm n);
enum class PositionEncoding : uint8_t { learned, rope };
const char* to_string(PositionEncoding p);
// Llama 3's frequency scaling of RoPE (rope_scaling = llama3 in HF's config).
enum class RopeScaling : uint8_t { none, llama3 };
const char* to_string(RopeScaling r);
enum class Mlp : uint8_t { gelu, swiglu };
const char* to_string(Mlp m);

struct ModelConfig {
  std::string preset;        // path of the preset file the keys came from (informational)
  std::string name = "custom";
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t ffn = 0;           // 0 means 4 x d_model
  int64_t vocab = 0;         // tokenizer vocabulary; padded_vocab() rounds it up
  int64_t context = 0;       // sequence length (positions)
  int64_t vocab_multiple = 128;  // pad to a multiple of vocab_multiple x tp

  Norm norm = Norm::layernorm;
  double norm_eps = 1e-5;
  PositionEncoding position = PositionEncoding::learned;
  double rope_theta = 10000;
  RopeScaling rope_scaling = RopeScaling::none;
  double rope_factor = 8;             // llama3 scaling: the context's growth
  double rope_low_freq_factor = 1;    // wavelengths above original_context / this are scaled
  double rope_high_freq_factor = 4;   // below original_context / this are kept
  int64_t rope_original_context = 8192;
  Mlp mlp = Mlp::gelu;
  int64_t kv_heads = 0;          // key/value heads (grouped-query attention); 0 = heads
  bool tied_embeddings = true;   // the head is the token embedding
  bool linear_bias = true;       // every linear map has a bias
  bool qkv_bias = false;         // the q, k, v maps have biases even without linear_bias (Qwen 2)
  bool qk_norm = false;          // RMSNorm over each head's q and k (Qwen 3, OLMo 2)

  int64_t head_dim() const { return d_model / heads; }
  int64_t ffn_dim() const { return ffn > 0 ? ffn : 4 * d_model; }
  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t padded_vocab(int64_t tp = 1) const {
    const int64_t m = vocab_multiple * tp;
    return (vocab + m - 1) / m * m;
  }
};

// Every map of `model`'s block that can carry an adapter: GELU: qkv, proj, fc1, fc2; SwiGLU
// (the Llama family, PEFT's all-linear): q, k, v, proj, gate, up, fc2.
LoraTargetSet every_lora_target(const ModelConfig& model);
// Every map of `model`'s block an adapter can sit on, alone: every_lora_target's, and qkv or
// q, k, v (the whole q/k/v map or its parts). What the decoder's adapter pool holds.
LoraTargetSet adaptable_lora_targets(const ModelConfig& model);
// Why `targets` cannot adapt `model`'s maps ("" when they can): fc1 on SwiGLU, gate or up on
// GELU, qkv together with q, k or v.
std::string lora_targets_problem(LoraTargetSet targets, const ModelConfig& model);

// The [parallel] section: the layout (layout.h; dp and device are not keys of it: dp is what
// the world leaves, device is train.device) and the watchdog's timeout.
struct ParallelConfig : Layout {
  double comm_timeout_s = 300;  // watchdog: a blocking communication waiting longer aborts the job
};

struct TrainConfig {
  int64_t steps = 0;
  int64_t global_batch = 0;        // sequences per optimizer step (after ramp-up)
  double lr = 6e-4;
  double min_lr = 6e-5;            // cosine decays to this (GPT-3: 10% of peak)
  int64_t warmup_tokens = 375'000'000;   // GPT-3: 375M tokens
  int64_t decay_tokens = 0;        // cosine length in tokens; 0 = the whole run
  int64_t rampup_start_batch = 0;  // 0 = no batch ramp-up; else first global batch (sequences)
  int64_t rampup_tokens = 0;       // tokens over which the batch grows to global_batch
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;          // 0 disables clipping
  uint64_t seed = 1234;
  Precision precision = Precision::fp32;
  int64_t eval_every = 0;          // steps between validation evaluations; 0 = never
  int64_t eval_batches = 8;        // microbatches per evaluation
  int64_t threads = 0;             // OpenMP threads; 0 = what OMP_NUM_THREADS / cores say
  // train.device ("cpu": the CPU backend with MPI; "cuda": the CUDA backend with NCCL, one
  // rank per GPU) is stored as the layout's device, parallel.device.
  // The GPU this run is planned for (config/gpus.h): at start jumbo prints the layout's
  // estimated memory per GPU against its memory and refuses a layout that cannot fit; it
  // is also the peak for MFU unless log.peak_tflops is set. "" = none (a CPU run).
  std::string gpu;
  // Anomalies (src/train/anomaly.h): a step is anomalous when its loss or grad norm is not
  // finite, or (after spike_window accepted steps) its loss exceeds spike_ratio x the running
  // mean, an exponential moving average over about spike_window accepted steps; 0 = no spikes.
  AnomalyAction on_anomaly = AnomalyAction::stop;
  double spike_ratio = 1.5;
  int64_t spike_window = 100;
  // More than max_anomalies anomalies within anomaly_window steps ends the run.
  int64_t max_anomalies = 5;
  int64_t anomaly_window = 1000;
  // rewind: batches skipped from the checkpoint on; 0 = every batch from the checkpoint
  // through the anomalous one.
  int64_t rewind_skip_batches = 0;
  // Fine-tuning: the weights of this checkpoint (a step directory, a checkpoint root's
  // newest, or an s3:// URL; saved in any layout) start the run, with a fresh optimizer at
  // step 0 and this run's schedule; "" = initialise. Unlike checkpoint.resume, nothing but
  // the weights is taken. The model must have the checkpoint's shape.
  std::string init_from;
};

// One dataset of a mixture: the prefix of a prepared dataset (jumbo's PREFIX.idx/.bin or
// PREFIX.parts, or Megatron's MMIDIDX pair) and its weight (> 0; weights are normalised, so
// they need not sum to 1).
struct DatasetWeight {
  std::string prefix;
  double weight = 1.0;
  bool operator==(const DatasetWeight&) const = default;
};

// A weighted list of datasets, written as Megatron's --data-path: "0.6 data/web 0.4 data/books",
// "data/web" (one dataset), "data/a data/b" (equal weights), or a TOML array.
struct DataMixture {
  std::vector<DatasetWeight> datasets;
  bool empty() const { return datasets.empty(); }
  // Dataset i's name in metrics (val_loss.NAME): the last component of its prefix.
  std::string name(size_t i) const;
  // Megatron's form, canonical (one dataset of weight 1 is just its prefix): for messages and
  // the checkpoint manifest.
  std::string describe() const;
  bool operator==(const DataMixture&) const = default;
};

// Parses Megatron's form (see DataMixture). Throws UserError with a message that says what
// was expected, without a location (the caller names the key).
DataMixture parse_mixture(std::string_view text);

struct DataConfig {
  DataMixture train;       // the blend each training sample is drawn from
  DataMixture valid;       // held-out sets, one val_loss.NAME each; may be empty
  std::string tokenizer;   // SentencePiece .model; checked against every dataset's header
  // A chat template (data/chat_template.h) the data was formatted with: stored in every
  // checkpoint, so `jumbo serve` answers chat completions as the model learned. "" = none.
  std::string chat_template;
  // Prompt-completion datasets: several examples per sample (true; attention and positions
  // stay inside each), or one example per sample, padded (false). docs/data-format.md.
  bool packing = true;
};

struct CheckpointConfig {
  std::string dir;               // a directory (shared file system) or "s3://bucket/prefix"
  int64_t every = 0;             // steps between saves (and at the last step); 0 = never
  // "none", "auto" (the newest complete checkpoint under dir, else a fresh start), a step
  // number ("1200": dir/step_00001200), or the path/URL of one checkpoint directory.
  std::string resume = "none";
  bool async = false;            // write in a background thread while training continues
  int64_t keep_last = 0;         // keep the newest N checkpoints; 0 = keep every one
  int64_t keep_every = 0;        // and, for good, those whose step is a multiple of K; 0 = none
  std::string s3_region;         // empty: AWS_REGION / AWS_DEFAULT_REGION
  std::string s3_endpoint;       // empty: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / AWS itself
};

struct LogConfig {
  std::string metrics_file;   // JSON line per step; empty = none
  int64_t every = 1;          // human line every N steps on rank 0
  double peak_tflops = 0;     // per-device peak for MFU; 0 = measure this machine's fp32 peak
  bool comm = false;          // count bytes sent per group per step (JSON fields comm_*_bytes)
  // CloudWatch Embedded Metric Format, rank 0, one line per log interval (docs/metrics.md).
  std::string emf_file;       // a file the CloudWatch agent tails; "" = none
  std::string emf_address;    // the agent's EMF endpoint, "tcp://127.0.0.1:25888"; "" = none
  std::string emf_namespace = "jumbo";
  std::string run_name;       // the RunName dimension; "" = the config file's name
  // Stragglers (obs/stragglers.h), every log interval of a run of several ranks: a rank whose
  // compute time exceeds straggler_ratio x its pipeline stage's median for
  // straggler_intervals intervals in a row is flagged.
  double straggler_ratio = 1.25;
  int64_t straggler_intervals = 2;
};

// The network NCCL must have chosen on every rank ([comm] expect_network, docs/config.md):
// any (record it, refuse nothing), EFA through aws-ofi-nccl, NCCL's InfiniBand, its sockets.
enum class ExpectNetwork { any, efa, ib, socket };
const char* to_string(ExpectNetwork e);

// [comm] emulate: on CPU ranks, MPI held to NCCL's stricter rules (synchronous sends, tags
// ignored, a group completes as a whole, one communicator's operations run in issue order),
// so the GPU path's deadlocks show without a GPU (comm/nccl_rules.h, docs/config.md).
enum class CommEmulation { none, nccl };
const char* to_string(CommEmulation e);

struct CommConfig {
  ExpectNetwork expect_network = ExpectNetwork::any;
  CommEmulation emulate = CommEmulation::none;
};

// [finetune]: how a run from train.init_from trains. LoRA freezes the base (its weights only,
// in the compute dtype) and trains the adapters with AdamW; its checkpoints hold the adapters.
struct FinetuneConfig {
  FineTune method = FineTune::none;
  int64_t lora_rank = 16;
  double lora_alpha = 32;
  std::string lora_targets = "all";  // every map of the model's block
  double lora_dropout = 0;  // training drops each element of an adapter's input with this p
  // The adapters' shape on `model` (lora only; rank 0 otherwise); the targets checked by
  // validate.
  LoraShape lora(const ModelConfig& model) const;
};

struct RunConfig {
  std::string source = "<embedded demo>";  // file the config was read from, for messages
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;
  CommConfig comm;
  FinetuneConfig finetune;
};

// A config enum's value by name, from the one table its config key reads too (Precision,
// Recompute, Device, AnomalyAction, ExpectNetwork, CommEmulation): for the CLI's flags. choice_names<E>()
// lists them for an error: "fp32 or bf16".
template <typename E>
std::optional<E> parse_choice(std::string_view name);
template <typename E>
std::string choice_names();

// A TOML basic string of s, quoted and escaped (what a user would type).
// A whole file's bytes. Throws UserError "PATH: cannot open WHAT (paths are relative to the
// working directory ...)" when it cannot be read (missing, a directory).
std::string read_file(const std::string& path, std::string_view what);

// Every model key of `model` as a preset file's lines (`key = value`, the schema's order):
// `jumbo ckpt import` writes one beside an imported checkpoint for runs to name.
std::string model_preset_toml(const ModelConfig& model);
std::string toml_quoted(std::string_view s);

// Reads a run config TOML file, applies `section.key=value` overrides, validates.
// Throws UserError with one line on any mistake.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides);
// Same from TOML text (the embedded demo config); `source` names it in messages. Relative
// paths in the text are relative to `base_dir` ("": the working directory); those of the
// overrides always to the working directory.
RunConfig parse_run_config(const std::string& toml_text, const std::string& source,
                           const std::vector<std::string>& overrides,
                           const std::string& base_dir = "");
// Reads just a model preset file (keys of the [model] section, at top level or under [model]).
ModelConfig load_model_config(const std::string& path);
// All consistency checks in one place; `world_size` is the MPI world. world_size 0 (what
// load_run_config uses, before MPI is up) skips the world-size checks and takes dp = 1.
void validate(const RunConfig& cfg, int world_size);
// validate(cfg, world_size), then the config with its layout's dp set: world / (tp x pp).
RunConfig validated_for_world(const RunConfig& cfg, int world_size);
// The layout's own rules against a model (what validate checks of [parallel], without the
// world): each failure one line starting with `source`, naming the keys as config keys
// ("parallel.tp = 3") or as the command-line flags of a tool that takes a layout ("--tp 3").
enum class LayoutKeys { config, flags };
void validate_layout(const Layout& layout, const ModelConfig& model, const std::string& source,
                     LayoutKeys keys);
void validate_model(const ModelConfig& m, const std::string& source);
// The resolved config as TOML text: every key of every section, the preset already applied.
// Parsing it back gives the same config (for `jumbo info` and run logs).
std::string describe(const RunConfig& cfg);

}  // namespace jumbo
