// comm.emulate = nccl over real MPI ranks: NCCL's rules where they differ from MPI's (tags
// ignored, equal counts, one stream per communicator) and the same results as MPI, bit for bit,
// for every collective. The deadlock a program written against MPI's kinder rules meets is
// tests/comm/nccl_rules_deadlock.sh's.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "jumbo/comm/comm.h"

namespace jumbo {
namespace {

std::vector<float> ramp(int n, int rank, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * float(i + 1) / float(rank + 3);
  return v;
}

TEST(NcclRules, TagsAreIgnoredSendsMatchInPostingOrder) {
  auto w = mpi_world();
  if (w->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto nccl = make_nccl_rules_comm(w);
  const int peer = w->rank() ^ 1;
  if (peer >= w->size()) return;  // an odd world's last rank sits out
  // Each rank sends 1 (tag 1) then 2 (tag 2) and receives tag 2 first, then tag 1: MPI matches
  // by tag, NCCL's rules by order. Returns what the two receives got.
  auto exchange = [&](Comm& c) {
    float a = 1, b = 2, x = 0, y = 0;
    c.group_start();
    CommRequest q[] = {c.isend(Tensor(&a, DType::f32, {1}), peer, 1),
                       c.isend(Tensor(&b, DType::f32, {1}), peer, 2),
                       c.irecv(Tensor(&x, DType::f32, {1}), peer, 2),
                       c.irecv(Tensor(&y, DType::f32, {1}), peer, 1)};
    c.group_end();
    for (CommRequest& r : q) c.wait(r);
    return std::pair{x, y};
  };
  EXPECT_EQ(exchange(*nccl), std::pair(1.0f, 2.0f));  // NCCL's rules: by order
  EXPECT_EQ(exchange(*w), std::pair(2.0f, 1.0f));     // MPI: by tag
}

TEST(NcclRules, AReceiveMustGetTheCountItPosted) {
  auto w = mpi_world();
  if (w->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto nccl = make_nccl_rules_comm(w);
  const int peer = w->rank() ^ 1;
  if (peer >= w->size()) return;
  std::vector<float> out(2, 1.0f), in(3, 0.0f);
  nccl->group_start();
  CommRequest s = nccl->isend(Tensor(out.data(), DType::f32, {2}), peer, 0);
  CommRequest r = nccl->irecv(Tensor(in.data(), DType::f32, {3}), peer, 0);
  nccl->group_end();
  try {
    nccl->wait(s);
    nccl->wait(r);
    FAIL() << "a 12-byte receive took an 8-byte send";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("equal counts"), std::string::npos) << e.what();
  }
}

// Each collective, blocking and not, on a sub-group and the world, gives MPI's bits, and the
// non-blocking ones complete in issue order behind a queued point-to-point-free stream.
TEST(NcclRules, CollectivesGiveMpisBits) {
  auto w = mpi_world();
  auto nccl = make_nccl_rules_comm(w);
  auto half_mpi = w->split(w->rank() % 2, w->rank(), "half");
  auto half_nccl = nccl->split(w->rank() % 2, w->rank(), "half");
  for (auto [mpi, emulated] : {std::pair{w, nccl}, std::pair{half_mpi, half_nccl}}) {
    const int n = mpi->size(), r = mpi->rank(), block = 1000;
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> a = ramp(n * block, r, 0.37f), b = a;
      std::vector<float> out_a(static_cast<size_t>(block)), out_b = out_a;
      Tensor ta(a.data(), DType::f32, {n * block}), tb(b.data(), DType::f32, {n * block});
      Tensor mine_a = ta.rows(r * block, block), mine_b = tb.rows(r * block, block);
      CommRequest q;
      switch (kind) {
        case 0: mpi->all_reduce(ta, ReduceOp::sum); emulated->all_reduce(tb, ReduceOp::sum); break;
        case 1: q = mpi->iall_reduce(ta, ReduceOp::sum); mpi->wait(q);
                q = emulated->iall_reduce(tb, ReduceOp::sum); emulated->wait(q); break;
        case 2: mpi->reduce_scatter(ta, Tensor(out_a.data(), DType::f32, {block}));
                emulated->reduce_scatter(tb, Tensor(out_b.data(), DType::f32, {block})); break;
        case 3: q = mpi->ireduce_scatter(ta, mine_a); mpi->wait(q);
                q = emulated->ireduce_scatter(tb, mine_b); emulated->wait(q); break;
        case 4: q = mpi->iall_gather(mine_a, ta); mpi->wait(q);
                q = emulated->iall_gather(mine_b, tb); emulated->wait(q); break;
        case 5: mpi->broadcast(ta, n - 1); emulated->broadcast(tb, n - 1); break;
      }
      EXPECT_EQ(a, b) << "collective " << kind << " on " << mpi->name();
      EXPECT_EQ(out_a, out_b) << "collective " << kind << " on " << mpi->name();
    }
    // Two buckets in flight, waited out of order: the stream runs them in issue order.
    std::vector<float> x = ramp(n * 64, r, 1.0f), y = ramp(n * 64, r, 2.0f);
    std::vector<float> x2 = x, y2 = y;
    CommRequest qx = emulated->iall_reduce(Tensor(x.data(), DType::f32, {n * 64}), ReduceOp::sum);
    CommRequest qy = emulated->iall_reduce(Tensor(y.data(), DType::f32, {n * 64}), ReduceOp::sum);
    emulated->wait(qy);
    emulated->wait(qx);
    for (std::vector<float>* v : {&x2, &y2}) {
      CommRequest q = mpi->iall_reduce(Tensor(v->data(), DType::f32, {n * 64}), ReduceOp::sum);
      mpi->wait(q);
    }
    EXPECT_EQ(x, x2);
    EXPECT_EQ(y, y2);
    EXPECT_EQ(emulated->all_reduce_scalar(r + 0.5, ReduceOp::max), n - 0.5);
  }
}

}  // namespace
}  // namespace jumbo
