// Packed sequences and ignored targets in the CPU kernels: attention with positions equals
// attention over each sequence alone (forward and backward), the position embedding looks up
// and scatters by position, and a negative target has no loss and no gradient.
#include <gtest/gtest.h>

#include "backend_test_support.h"

namespace jumbo::test {
namespace {

constexpr int64_t kH = 2, kD = 4;

// Row b of a packed [B, T] batch holds sequences of these lengths, back to back.
const std::vector<std::vector<int64_t>> kLengths = {{5, 1, 6}, {12}};
constexpr int64_t kB = 2, kT = 12;

Ids positions_of(const std::vector<std::vector<int64_t>>& lengths) {
  Ids pos;
  for (const auto& row : lengths) {
    for (int64_t len : row) {
      for (int64_t j = 0; j < len; ++j) pos.push_back(static_cast<int32_t>(j));
    }
  }
  return pos;
}

// Rows [first, first + len) of a [B*T, width] buffer of row b.
Vec rows(const Vec& v, int64_t b, int64_t first, int64_t len, int64_t width) {
  const auto at = static_cast<ptrdiff_t>((b * kT + first) * width);
  return Vec(v.begin() + at, v.begin() + at + len * width);
}

TEST(PackedKernels, AttentionEqualsEachSequenceAlone) {
  KernelBench kb;
  Rng rng(5);
  const Vec qkv = rng.uniform(kB * kT * kH * 3 * kD);
  const Vec dout = rng.uniform(kB * kT * kH * kD);
  const Ids pos = positions_of(kLengths);
  Tensor t_qkv = kb.upload(DType::f32, {kB, kT, kH * 3 * kD}, qkv);
  Tensor t_pos = kb.upload_ids({kB * kT}, pos);
  Tensor out = kb.poisoned(DType::f32, {kB, kT, kH * kD});
  Tensor probs = kb.poisoned(DType::f32, {kB, kH, kT, kT});
  kb.be().attention_fwd(out, probs, t_qkv, kH, t_pos);
  Tensor dqkv = kb.poisoned(DType::f32, {kB, kT, kH * 3 * kD});
  Tensor dprobs = kb.poisoned(DType::f32, {kB, kH, kT, kT});
  kb.be().attention_bwd(dqkv, dprobs, kb.upload(DType::f32, {kB, kT, kH * kD}, dout), t_qkv, out,
                        probs, kH, t_pos);
  const Vec packed_out = kb.download(out), packed_dqkv = kb.download(dqkv);
  for (int64_t b = 0; b < kB; ++b) {
    int64_t first = 0;
    for (int64_t len : kLengths[static_cast<size_t>(b)]) {
      // The sequence alone, as a batch of one with plain causal attention.
      Tensor s_qkv = kb.upload(DType::f32, {1, len, kH * 3 * kD}, rows(qkv, b, first, len, kH * 3 * kD));
      Tensor s_out = kb.poisoned(DType::f32, {1, len, kH * kD});
      Tensor s_probs = kb.poisoned(DType::f32, {1, kH, len, len});
      kb.be().attention_fwd(s_out, s_probs, s_qkv, kH);
      Tensor s_dqkv = kb.poisoned(DType::f32, {1, len, kH * 3 * kD});
      Tensor s_dprobs = kb.poisoned(DType::f32, {1, kH, len, len});
      kb.be().attention_bwd(s_dqkv, s_dprobs,
                            kb.upload(DType::f32, {1, len, kH * kD}, rows(dout, b, first, len, kH * kD)),
                            s_qkv, s_out, s_probs, kH);
      const std::string what = "row " + std::to_string(b) + " sequence at " + std::to_string(first);
      EXPECT_TRUE(close(rows(packed_out, b, first, len, kH * kD), kb.download(s_out), 1e-6, what + " out"));
      EXPECT_TRUE(close(rows(packed_dqkv, b, first, len, kH * 3 * kD), kb.download(s_dqkv), 1e-6,
                        what + " dqkv"));
      first += len;
    }
  }
  // One sequence per row is plain causal attention, bit for bit.
  Tensor causal = kb.poisoned(DType::f32, {kB, kT, kH * kD});
  Tensor one_seq = kb.poisoned(DType::f32, {kB, kT, kH * kD});
  kb.be().attention_fwd(causal, probs, t_qkv, kH);
  kb.be().attention_fwd(one_seq, probs, t_qkv, kH,
                        kb.upload_ids({kB * kT}, positions_of({{kT}, {kT}})));
  EXPECT_EQ(kb.download(causal), kb.download(one_seq));
}

TEST(PackedKernels, PositionEmbeddingLooksUpAndScattersByPosition) {
  KernelBench kb;
  Rng rng(9);
  const int64_t c = 3, rows_wpe = kT;
  const Vec wpe = rng.uniform(rows_wpe * c), x = rng.uniform(kB * kT * c), dout = rng.uniform(kB * kT * c);
  const Ids pos = positions_of(kLengths);
  Tensor out = kb.upload(DType::f32, {kB, kT, c}, x);
  kb.be().position_embedding_fwd(out, kb.upload(DType::f32, {rows_wpe, c}, wpe), kb.upload_ids({kB * kT}, pos));
  Vec want = x, dwpe_want(static_cast<size_t>(rows_wpe * c), 0.0);
  for (int64_t n = 0; n < kB * kT; ++n) {
    for (int64_t i = 0; i < c; ++i) {
      want[static_cast<size_t>(n * c + i)] += wpe[static_cast<size_t>(pos[static_cast<size_t>(n)] * c + i)];
      dwpe_want[static_cast<size_t>(pos[static_cast<size_t>(n)] * c + i)] += dout[static_cast<size_t>(n * c + i)];
    }
  }
  EXPECT_TRUE(close(kb.download(out), want, 1e-6, "position_embedding_fwd by position"));
  Tensor dwpe = kb.upload(DType::f32, {rows_wpe, c}, Vec(static_cast<size_t>(rows_wpe * c), 0.0));
  kb.be().position_embedding_bwd(dwpe, kb.upload(DType::f32, {kB, kT, c}, dout), kb.upload_ids({kB * kT}, pos));
  EXPECT_TRUE(close(kb.download(dwpe), dwpe_want, 1e-6, "position_embedding_bwd by position"));
}

TEST(PackedKernels, AnIgnoredTargetHasNoLossAndNoGradient) {
  KernelBench kb;
  Rng rng(3);
  const int64_t n = 4, v = 6;
  const Vec logits = rng.uniform(n * v, -2, 2);
  const Ids targets = {1, -1, 5, -1};
  Tensor t_logits = kb.upload(DType::f32, {n, v}, logits);
  Tensor t_targets = kb.upload_ids({n}, targets);
  Tensor mx = kb.poisoned(DType::f32, {n}), se = kb.poisoned(DType::f32, {n});
  Tensor tl = kb.poisoned(DType::f32, {n}), losses = kb.poisoned(DType::f32, {n});
  kb.be().ce_local_max(mx, t_logits);
  kb.be().ce_local_sumexp(se, t_logits, mx);
  kb.be().ce_target_logit(tl, t_logits, t_targets, 0);
  kb.be().ce_loss(losses, mx, se, tl, t_targets);
  const Vec got = kb.download(losses);
  EXPECT_GT(got[0], 0.0);
  EXPECT_EQ(got[1], 0.0);
  EXPECT_GT(got[2], 0.0);
  EXPECT_EQ(got[3], 0.0);
  Tensor dlogits = kb.poisoned(DType::f32, {n, v});
  kb.be().ce_bwd(dlogits, t_logits, mx, se, t_targets, 0, 0.5f);
  const Vec d = kb.download(dlogits);
  for (int64_t r = 0; r < n; ++r) {
    double row_sum = 0, row_abs = 0;
    for (int64_t i = 0; i < v; ++i) {
      row_sum += d[static_cast<size_t>(r * v + i)];
      row_abs += std::abs(d[static_cast<size_t>(r * v + i)]);
    }
    if (targets[static_cast<size_t>(r)] < 0) EXPECT_EQ(row_abs, 0.0) << "row " << r;
    else EXPECT_NEAR(row_sum, 0.0, 1e-6) << "row " << r << ": softmax minus one-hot";
  }
}

}  // namespace
}  // namespace jumbo::test
