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
      EXPECT_EQ(g.model_parallel().size(), tp * pp);
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
