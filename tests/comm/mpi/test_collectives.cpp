// Collectives and point-to-point over real MPI ranks (run with mpirun -np 1, 3 and 8).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "jumbo/backend/bf16.h"
#include "jumbo/comm/comm.h"
#include "jumbo/comm/grid.h"
#include "jumbo/config/config.h"

namespace jumbo {
namespace {

std::shared_ptr<Comm> world() { return mpi_world(); }

TEST(Collectives, AllReduceSumAndMaxF32) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  std::vector<float> v = {float(r), float(2 * r + 1), -float(r)};
  w->all_reduce(Tensor(v.data(), DType::f32, {3}), ReduceOp::sum);
  EXPECT_EQ(v[0], float(n * (n - 1) / 2));
  EXPECT_EQ(v[1], float(n * n));
  std::vector<float> m = {float(r), -float(r)};
  w->all_reduce(Tensor(m.data(), DType::f32, {2}), ReduceOp::max);
  EXPECT_EQ(m[0], float(n - 1));
  EXPECT_EQ(m[1], 0.0f);
}

TEST(Collectives, AllReduceBf16AddsInFp32PerElement) {
  auto w = world();
  std::vector<bf16> v = {f32_to_bf16(0.5f), f32_to_bf16(float(w->rank()))};
  w->all_reduce(Tensor(v.data(), DType::bf16, {2}), ReduceOp::sum);
  const int n = w->size();
  EXPECT_EQ(bf16_to_f32(v[0]), 0.5f * n);
  EXPECT_EQ(bf16_to_f32(v[1]), float(n * (n - 1) / 2));
}

TEST(Collectives, ReduceScatterAndAllGatherAreInverseShapes) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  const int block = 5;
  std::vector<float> in(n * block), out(block);
  for (int i = 0; i < n * block; ++i) in[i] = float(i + r);
  w->reduce_scatter(Tensor(in.data(), DType::f32, {n * block}),
                    Tensor(out.data(), DType::f32, {block}));
  for (int j = 0; j < block; ++j) {
    EXPECT_EQ(out[j], float(n * (r * block + j) + n * (n - 1) / 2)) << j;
  }
  std::vector<float> all(n * block);
  w->all_gather(Tensor(out.data(), DType::f32, {block}), Tensor(all.data(), DType::f32, {n * block}));
  for (int i = 0; i < n * block; ++i) EXPECT_EQ(all[i], float(n * i + n * (n - 1) / 2)) << i;
  // In place: this rank's block already sits at its offset of the output.
  std::vector<float> place(n * block, -1);
  for (int j = 0; j < block; ++j) place[r * block + j] = float(r);
  w->all_gather(Tensor(place.data() + r * block, DType::f32, {block}),
                Tensor(place.data(), DType::f32, {n * block}));
  for (int i = 0; i < n * block; ++i) EXPECT_EQ(place[i], float(i / block));
}

TEST(Collectives, RingOfNonBlockingSendsCannotDeadlock) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  std::vector<int32_t> send = {r, r * 10}, recv = {-1, -1};
  CommRequest rr = w->irecv(Tensor(recv.data(), DType::i32, {2}), (r + n - 1) % n, 7);
  CommRequest sr = w->isend(Tensor(send.data(), DType::i32, {2}), (r + 1) % n, 7);
  w->wait(sr);
  w->wait(rr);
  EXPECT_EQ(recv[0], (r + n - 1) % n);
  EXPECT_EQ(recv[1], 10 * ((r + n - 1) % n));
  EXPECT_FALSE(rr.pending());
}

TEST(Collectives, NonBlockingAllReduceAndBytesSent) {
  auto w = world();
  std::vector<float> v(1000, 1.0f);
  w->reset_bytes();
  CommRequest q = w->iall_reduce(Tensor(v.data(), DType::f32, {1000}), ReduceOp::sum);
  w->wait(q);
  EXPECT_EQ(v[999], float(w->size()));
  EXPECT_EQ(w->bytes_sent(), w->size() > 1 ? 4000u : 0u) << "a group of one sends nothing";
}

// gather_bytes is a binomial tree (rank 0 talks to log2(size) peers, not to every rank): every
// root, lengths that differ by rank (empty included), a sub-group, and a receive with the
// caller's tag 0 left pending across it that the tree's messages must not match.
TEST(Collectives, GatherBytesToEveryRootInRankOrder) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  const auto payload = [](int rank) {
    std::vector<char> bytes(static_cast<size_t>(rank % 3 == 1 ? 0 : 5 + 7 * rank));
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>('a' + (rank + i) % 26);
    }
    return bytes;
  };
  std::vector<int32_t> pending = {-1};
  CommRequest rr = w->irecv(Tensor(pending.data(), DType::i32, {1}), (r + n - 1) % n, 0);
  for (int root = 0; root < n; ++root) {
    const std::vector<std::vector<char>> all = w->gather_bytes(payload(r), root);
    if (r != root) {
      EXPECT_TRUE(all.empty()) << "rank " << r << ", root " << root;
      continue;
    }
    ASSERT_EQ(all.size(), static_cast<size_t>(n)) << "root " << root;
    for (int from = 0; from < n; ++from) EXPECT_EQ(all[from], payload(from)) << "from " << from;
  }
  std::vector<int32_t> mine = {r};
  CommRequest sr = w->isend(Tensor(mine.data(), DType::i32, {1}), (r + 1) % n, 0);
  w->wait(sr);
  w->wait(rr);
  EXPECT_EQ(pending[0], (r + n - 1) % n);

  const auto half = w->split(r % 2, r, "half");
  const std::vector<std::vector<char>> some = half->gather_bytes(payload(r), half->size() - 1);
  if (half->rank() == half->size() - 1) {
    ASSERT_EQ(some.size(), static_cast<size_t>(half->size()));
    for (int i = 0; i < half->size(); ++i) EXPECT_EQ(some[i], payload(r % 2 + 2 * i));
  }
}

// The data-parallel rings (MpiComm's non-blocking collectives): in place, blocks larger than
// the staging piece (so several messages per ring step), several in flight at once (the
// buckets of a step), and exact integer-valued sums so any misplaced block shows.
TEST(RingCollectives, InPlaceReduceScatterAndAllGatherOfBuckets) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  const int64_t block = kMpiRingStagingBytes / 4 + 37;  // two pieces per ring step
  std::vector<float> grads(static_cast<size_t>(block * n)), weights(grads.size(), -1.0f);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = float((i % 1000) + r);
  // Two buckets in flight, as GradSync launches them.
  const int64_t half = block * n / 2 / n * n;
  Tensor all(grads.data(), DType::f32, {block * n});
  Tensor b0 = all.rows(0, half), b1 = all.rows(half, block * n - half);
  CommRequest q1 = w->ireduce_scatter(b1, b1.rows(r * (b1.numel() / n), b1.numel() / n));
  CommRequest q0 = w->ireduce_scatter(b0, b0.rows(r * (b0.numel() / n), b0.numel() / n));
  w->wait(q1);
  w->wait(q0);
  const float ranks = float(n * (n - 1) / 2);
  for (Tensor b : {b0, b1}) {
    const int64_t shard = b.numel() / n;
    const int64_t first = (b.as<float>() - grads.data()) + r * shard;
    for (int64_t k = 0; k < shard; k += 997) {
      const int64_t i = first + k;
      ASSERT_EQ(grads[i], float(n) * float(i % 1000) + ranks) << "element " << i;
    }
  }
  // All-gather in place: every rank's block r holds r + 0.5; afterwards every block does.
  for (int64_t k = 0; k < block; ++k) weights[r * block + k] = float(r) + 0.5f;
  Tensor wt(weights.data(), DType::f32, {block * n});
  CommRequest g = w->iall_gather(wt.rows(r * block, block), wt);
  w->wait(g);
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(weights[q * block], float(q) + 0.5f) << "block " << q;
    EXPECT_EQ(weights[q * block + block - 1], float(q) + 0.5f) << "block " << q;
  }
}

TEST(RingCollectives, Bf16GatherAndDistinctOutputs) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  // bf16 weights gathered from a separate input buffer.
  std::vector<bf16> mine(5, f32_to_bf16(float(r))), all(5 * n, f32_to_bf16(-1.0f));
  CommRequest g = w->iall_gather(Tensor(mine.data(), DType::bf16, {5}),
                                 Tensor(all.data(), DType::bf16, {5 * n}));
  w->wait(g);
  for (int q = 0; q < n; ++q) EXPECT_EQ(bf16_to_f32(all[q * 5 + 4]), float(q));
  // A reduce-scatter into a distinct output, bf16 sums added in fp32.
  std::vector<bf16> in(3 * n, f32_to_bf16(1.0f)), out(3, f32_to_bf16(0.0f));
  CommRequest q = w->ireduce_scatter(Tensor(in.data(), DType::bf16, {3 * n}),
                                     Tensor(out.data(), DType::bf16, {3}));
  w->wait(q);
  EXPECT_EQ(bf16_to_f32(out[2]), float(n));
  // An all-reduce whose length the world does not divide takes MPI's own path.
  std::vector<float> odd(7, 1.0f);
  CommRequest a = w->iall_reduce(Tensor(odd.data(), DType::f32, {7}), ReduceOp::sum);
  w->wait(a);
  EXPECT_EQ(odd[6], float(n));
}

TEST(Grid, CoordinatesAndGroupsFollowTpThenDpThenPp) {
  auto w = world();
  const int n = w->size();
  for (int tp : {1, 2, 4, 8}) {
    for (int pp : {1, 2, 3, 4, 8}) {
      if (n % (tp * pp) != 0) continue;
      Grid g(w, tp, pp);
      const int dp = n / (tp * pp);
      ASSERT_EQ(g.dp_size(), dp);
      EXPECT_EQ(g.world_rank_of(g.tp_rank(), g.dp_rank(), g.pp_rank()), w->rank());
      EXPECT_EQ(g.tp().size(), tp);
      EXPECT_EQ(g.dp().size(), dp);
      EXPECT_EQ(g.pp().size(), pp);
      EXPECT_EQ(g.tp().rank(), g.tp_rank());
      EXPECT_EQ(g.pp().rank(), g.pp_rank());
      // TP neighbours are consecutive world ranks: the sum of world ranks over the group.
      const double sum = g.tp().all_reduce_scalar(w->rank(), ReduceOp::sum);
      const int base = w->rank() - g.tp_rank();
      EXPECT_EQ(sum, tp * base + tp * (tp - 1) / 2.0);
      const bool ends = g.first_stage() || g.last_stage();
      EXPECT_EQ(g.embedding().size(), ends && pp > 1 ? 2 : 1);
      EXPECT_EQ(g.coords().pp_rank, g.pp_rank());
      EXPECT_EQ(g.coords().dp_rank, g.dp_rank());
      EXPECT_EQ(g.coords().tp_rank, g.tp_rank());
    }
  }
}

TEST(Grid, LayoutThatDoesNotDivideTheWorldIsAUserError) {
  auto w = world();
  if (w->size() % 5 == 0) GTEST_SKIP() << "world divisible by 5";
  try {
    Grid g(w, 5, 1);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp x parallel.pp = 5 x 1"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace jumbo
