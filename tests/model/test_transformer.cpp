// Whole-model checks: gradient against central finite differences, determinism, mixed
// precision against fp32, and that training reduces the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <vector>

#include "jumbo/backend/backend.h"
#include "jumbo/comm/comm.h"
#include "jumbo/model/transformer.h"
#include "jumbo/train/optimizer.h"

namespace jumbo {
namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.name = "fd";
  m.layers = 2;
  m.d_model = 16;
  m.heads = 2;
  m.ffn = 24;  // not 4 x d_model on purpose
  m.vocab = 50;  // padded to 128
  m.context = 8;
  return m;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  Batch b;
  for (int64_t i = 0; i < n; ++i) {
    b.tokens.push_back(d(rng));
    b.targets.push_back(d(rng));
  }
  return b;
}

struct Fixture {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::shared_ptr<Comm> world = mpi_world();
};

// Mean loss over the batch's tokens: a run of one microbatch whose LoRA dropout masks (when
// the model has them) are the same at every call.
double mean_loss(TransformerStage& m, const Batch& b) {
  m.begin_run(uint64_t{77});
  return m.forward(b.tokens.data(), b.targets.data()) / static_cast<double>(b.tokens.size());
}

// Per tensor of `store`: the `per_tensor` largest-gradient elements against central
// differences with eps (3e-3 unless told) on a loss accumulated in double. Tolerance: 2% of the element's
// gradient + 1e-4 absolute (fp32 forward noise / 2 eps ~ 1e-4). Each difference must exceed
// `min_fd` (a gradient worth checking). Returns the elements checked.
int check_largest_gradients(TransformerStage& model, const ParamStore& store, const std::vector<float>& grad,
                            const Batch& b, int64_t per_tensor, double min_fd, float eps = 3e-3f) {
  float* weights = store.all_weights().as<float>();
  int checked = 0;
  for (size_t p = 0; p < store.size(); ++p) {
    const ParamInfo& info = store.info(static_cast<int>(p));
    std::vector<int64_t> idx(info.numel());
    for (int64_t i = 0; i < info.numel(); ++i) idx[i] = info.flat_offset + i;
    const int64_t n = std::min<int64_t>(per_tensor, static_cast<int64_t>(idx.size()));
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                      [&](int64_t a, int64_t c) { return std::abs(grad[a]) > std::abs(grad[c]); });
    for (int64_t k = 0; k < n; ++k) {
      float& w = weights[idx[k]];
      const float saved = w;
      w = saved + eps;
      const double lp = mean_loss(model, b);
      w = saved - eps;
      const double lm = mean_loss(model, b);
      w = saved;
      const double fd = (lp - lm) / (2.0 * eps);
      EXPECT_NEAR(grad[idx[k]], fd, 0.02 * std::abs(fd) + 1e-4)
          << info.name << " element " << idx[k] - info.flat_offset;
      EXPECT_GT(std::abs(fd), min_fd) << info.name << ": a gradient worth checking";
      ++checked;
    }
  }
  return checked;
}

TEST(Gpt, GradientMatchesCentralFiniteDifferences) {
  Fixture f;
  const ModelConfig cfg = tiny_model();
  StageOptions o;
  o.micro_batch = 2;
  o.seq = 8;
  TransformerStage model(cfg, o, *f.backend, *f.world);
  model.initialize(42);
  // Larger weights than the 0.02 init make the loss surface less flat, so FD in fp32 resolves it.
  Tensor all = model.params().all_weights();  // fp32: the master
  for (int64_t i = 0; i < all.numel(); ++i) {
    all.as<float>()[i] += 0.15f * std::sin(0.37f * static_cast<float>(i));
  }
  const Batch b = random_batch(o.micro_batch * o.seq, cfg.vocab, 1);
  model.zero_grads();
  mean_loss(model, b);
  model.backward(1.0f / static_cast<float>(b.tokens.size()));
  std::vector<float> grad(all.numel());
  std::copy(model.params().all_grads().as<float>(),
            model.params().all_grads().as<float>() + all.numel(), grad.begin());

  EXPECT_GT(check_largest_gradients(model, model.params(), grad, b, 3, -1.0), 30);

  // All parameters at once along a random direction: the directional derivative.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> dir(all.numel());
  double analytic = 0;
  for (int64_t i = 0; i < all.numel(); ++i) {
    dir[i] = nd(rng);
    analytic += static_cast<double>(dir[i]) * grad[i];
  }
  std::vector<float> base(all.as<float>(), all.as<float>() + all.numel());
  // Small h: with all parameters moving at once, curvature dominates above ~1e-3.
  const float h = 1e-4f;
  for (int64_t i = 0; i < all.numel(); ++i) all.as<float>()[i] = base[i] + h * dir[i];
  const double lp = mean_loss(model, b);
  for (int64_t i = 0; i < all.numel(); ++i) all.as<float>()[i] = base[i] - h * dir[i];
  const double lm = mean_loss(model, b);
  const double fd = (lp - lm) / (2.0 * h);
  // Tolerance 1%: fp32 loss noise (~5e-7) / 2h is ~0.3% of this derivative.
  EXPECT_NEAR(analytic, fd, 1e-2 * std::abs(fd)) << "directional derivative";
}

std::vector<double> train_losses(DType dtype, int steps, uint64_t seed) {
  Fixture f;
  const ModelConfig cfg = tiny_model();
  StageOptions o;
  o.micro_batch = 2;
  o.seq = 8;
  o.compute_dtype = dtype;
  TransformerStage model(cfg, o, *f.backend, *f.world);
  model.initialize(seed);
  TrainConfig tc;
  tc.weight_decay = 0.1;
  AdamW opt(model.params(), *f.backend, tc);
  const Batch b = random_batch(o.micro_batch * o.seq, cfg.vocab, 9);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    model.zero_grads();
    losses.push_back(mean_loss(model, b));
    model.backward(1.0f / static_cast<float>(b.tokens.size()));
    opt.step(3e-3, 1.0f);
  }
  return losses;
}

TEST(Gpt, SameSeedReproducesBitForBit) {
  const auto a = train_losses(DType::f32, 5, 7);
  const auto b = train_losses(DType::f32, 5, 7);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  const auto c = train_losses(DType::f32, 1, 8);
  EXPECT_NE(a[0], c[0]) << "another seed gives other weights";
}

TEST(Gpt, TrainingOnOneBatchDrivesTheLossDown) {
  const auto l = train_losses(DType::f32, 60, 7);
  // The 78 padded vocabulary columns are masked: the initial loss is ~ln(vocab), not ln(128).
  EXPECT_NEAR(l.front(), std::log(50.0), 0.1) << "initial loss ~ ln(vocab)";
  EXPECT_LT(l.back(), 0.5 * l.front());
}

TEST(Gpt, Bf16TracksFp32) {
  const auto a = train_losses(DType::f32, 30, 7);
  const auto b = train_losses(DType::bf16, 30, 7);
  // bf16 storage keeps ~3 significant digits; over 30 steps the curves stay within 3%.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 0.03 * a[i]) << "step " << i;
  EXPECT_LT(b.back(), 0.7 * b.front());
}

TEST(Gpt, CounterInitGivesTheSameWeightsToAnySlice) {
  Slice full{{12, 10}, {0, 0}, {12, 10}};
  std::vector<float> all(120);
  init_normal_slice(all.data(), 5, "w", full, 0.02f);
  Slice part{{12, 10}, {4, 3}, {5, 6}};
  std::vector<float> sub(30);
  init_normal_slice(sub.data(), 5, "w", part, 0.02f);
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 6; ++c) EXPECT_EQ(sub[r * 6 + c], all[(r + 4) * 10 + c + 3]);
  }
  double sum = 0, sq = 0;
  for (float v : all) {
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / 120, 0.0, 0.006);
  EXPECT_NEAR(std::sqrt(sq / 120), 0.02, 0.004);
}

}  // namespace
}  // namespace jumbo

namespace jumbo {
namespace {

// The loss mask: a negative target (a prompt token, padding) leaves the loss and every
// gradient as if the position did not exist: the masked loss is the other positions' losses,
// and masked plus complement gradients are the unmasked ones. And a packed microbatch (two sequences per row, each
// with positions from 0) gives each sequence's per-token losses as it alone would.
TEST(Gpt, OnlyUnmaskedTargetsMoveTheLossAndPackedSequencesStayApart) {
  Fixture f;
  const ModelConfig cfg = tiny_model();
  StageOptions o;
  o.micro_batch = 1;
  o.seq = 8;
  TransformerStage model(cfg, o, *f.backend, *f.world);
  model.initialize(7);
  Batch b = random_batch(8, cfg.vocab, 3);
  const std::vector<int32_t> positions = {0, 1, 2, 0, 1, 2, 3, 4};  // sequences of 3 and 5
  auto run = [&](const std::vector<int32_t>& targets, std::vector<float>* losses) {
    model.zero_grads();
    model.forward(0, 0, b.tokens.data(), targets.data(), positions.data());
    double sum = 0;
    if (losses) {
      losses->clear();
      model.take_token_losses(*losses);
      for (float l : *losses) sum += l;
    } else {
      sum = model.take_loss_sum();
    }
    model.backward(0, 0, 1.0f);
    const Tensor g = model.params().all_grads();
    return std::pair{sum, std::vector<float>(g.as<float>(), g.as<float>() + g.numel())};
  };
  std::vector<int32_t> masked = b.targets, complement = b.targets;
  for (int i = 0; i < 8; ++i) {  // each sequence's "prompt" (0, 1 and 3, 4) masked, or the rest
    const bool prompt = i == 0 || i == 1 || i == 3 || i == 4;
    (prompt ? masked : complement)[static_cast<size_t>(i)] = -1;
  }
  std::vector<float> every;
  const auto [all_sum, all_grads] = run(b.targets, &every);
  const auto [m_sum, m_grads] = run(masked, nullptr);
  const auto [c_sum, c_grads] = run(complement, nullptr);
  double want = 0;
  for (int i : {2, 5, 6, 7}) want += every[static_cast<size_t>(i)];
  EXPECT_NEAR(m_sum, want, 1e-5 * std::abs(want)) << "the masked loss is the unmasked positions' losses";
  EXPECT_NEAR(m_sum + c_sum, all_sum, 1e-5 * std::abs(all_sum));
  EXPECT_GT(std::abs(all_sum - m_sum), 1.0) << "unmasking the prompts changes the loss";
  // Gradients are linear in the positions counted: masked + its complement = all.
  double worst = 0, largest = 0;
  for (size_t i = 0; i < all_grads.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(m_grads[i] + c_grads[i] - all_grads[i])));
    largest = std::max(largest, static_cast<double>(std::abs(all_grads[i])));
  }
  EXPECT_LE(worst, 1e-5 * largest);
  EXPECT_NE(all_grads, m_grads);

  // The second sequence alone (positions 0..4 at the start of a row) has the same losses.
  TransformerStage alone(cfg, {.micro_batch = 1, .seq = 5}, *f.backend, *f.world);
  alone.initialize(7);
  const std::vector<int32_t> tokens(b.tokens.begin() + 3, b.tokens.end());
  const std::vector<int32_t> targets(b.targets.begin() + 3, b.targets.end());
  alone.forward(0, 0, tokens.data(), targets.data(), nullptr);
  std::vector<float> alone_losses;
  alone.take_token_losses(alone_losses);
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(alone_losses[i], every[3 + i], 1e-5) << "position " << i;
}

}  // namespace
}  // namespace jumbo

namespace jumbo {
namespace {

// LoRA's backward against central finite differences: every adapter matrix (A and B of the
// four maps) on a base that is frozen (it has no gradient buffer at all). B is set non-zero
// first, so A's gradient is not trivially zero.
// LoRA rank 3 on every map of tiny_model (micro batch 2 x 8), its adapters moved off their
// start (B = 0 would hide A's gradient).
StageOptions lora_options(float dropout) {
  StageOptions o;
  o.micro_batch = 2;
  o.seq = 8;
  o.lora = {.rank = 3, .alpha = 6, .targets = LoraTargetSet{}};
  o.lora_dropout = dropout;
  return o;
}
void perturb_adapters(TransformerStage& model) {
  model.initialize(42);
  Tensor all = model.trained_params().all_weights();
  for (int64_t i = 0; i < all.numel(); ++i) {
    all.as<float>()[i] += 0.3f * std::sin(0.61f * static_cast<float>(i) + 1.0f);
  }
}

TEST(Gpt, LoraGradientMatchesCentralFiniteDifferences) {
  Fixture f;
  const ModelConfig cfg = tiny_model();
  const StageOptions o = lora_options(0);
  TransformerStage model(cfg, o, *f.backend, *f.world);
  perturb_adapters(model);
  ASSERT_TRUE(model.lora());
  EXPECT_TRUE(model.params().all_grads().empty()) << "the frozen base holds no gradients";
  const Batch b = random_batch(o.micro_batch * o.seq, cfg.vocab, 5);
  model.zero_grads();
  mean_loss(model, b);
  model.backward(1.0f / static_cast<float>(b.tokens.size()));
  const Tensor g = model.trained_params().all_grads();
  const std::vector<float> grad(g.as<float>(), g.as<float>() + g.numel());
  ASSERT_EQ(model.trained_params().size(), 2u * 4u * 2u);  // layers x maps x (A, B)
  EXPECT_EQ(check_largest_gradients(model, model.trained_params(), grad, b, 2, 1e-4), 32);
}

// LoRA dropout: the backward goes through the forward's masks (recomputed, not stored), on
// the adapters' inputs of every map; evaluation (no dropout seed) drops nothing.
TEST(Gpt, LoraDropoutGradientMatchesCentralFiniteDifferences) {
  Fixture f;
  const ModelConfig cfg = tiny_model();
  const StageOptions o = lora_options(0.3f);
  TransformerStage model(cfg, o, *f.backend, *f.world);
  perturb_adapters(model);
  const Batch b = random_batch(o.micro_batch * o.seq, cfg.vocab, 5);
  model.begin_run(std::nullopt);
  const double undropped = model.forward(b.tokens.data(), b.targets.data());
  TransformerStage reference(cfg, lora_options(0), *f.backend, *f.world);
  perturb_adapters(reference);
  EXPECT_EQ(undropped, reference.forward(b.tokens.data(), b.targets.data()))
      << "without a dropout seed (evaluation) nothing is dropped";
  model.zero_grads();
  const double dropped = mean_loss(model, b) * static_cast<double>(b.tokens.size());
  EXPECT_GT(std::abs(dropped - undropped), 1e-3) << "dropout changed nothing";
  model.backward(1.0f / static_cast<float>(b.tokens.size()));
  const Tensor g = model.trained_params().all_grads();
  const std::vector<float> grad(g.as<float>(), g.as<float>() + g.numel());
  // The kept inputs scaled by 1 / (1 - p) curve the loss more: at eps 3e-3 the differences'
  // own error is 2-10% on 4 of 32 elements, at 1e-3 under the tolerance (as it converges).
  EXPECT_EQ(check_largest_gradients(model, model.trained_params(), grad, b, 2, 1e-4, 1e-3f), 32);
}

}  // namespace
}  // namespace jumbo
