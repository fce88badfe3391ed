// The pipeline's exchanges under NCCL's rules: every schedule's pairing completes and delivers
// each tensor where it is expected; the pairing it replaced (each op's send with the next op's
// receive) deadlocks the interleaved schedule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "jumbo/parallel/pipeline_exchange.h"
#include "jumbo/parallel/pipeline_schedule.h"

namespace jumbo {
namespace {

struct Pipeline {
  std::vector<std::vector<PipeOp>> ops;
  std::vector<std::vector<PipeExchange>> exchanges;
};

Pipeline plan(int p, int m, int v, PipelineMode mode) {
  Pipeline out;
  for (int r = 0; r < p; ++r) {
    out.ops.push_back(pipeline_schedule(p, r, m, v, mode));
    out.exchanges.push_back(pipeline_exchanges(out.ops.back(), p, r, v));
  }
  return out;
}

// The pairing before: op k's send and op k + 1's receive in one group.
std::vector<PipeExchange> send_with_next_receive(const std::vector<PipeOp>& ops, int p, int r,
                                                 int v) {
  std::vector<PipeExchange> out;
  auto receives = [&](int k) { return pipeline_op_comm(ops[k], p, r, v).recv_from_rank >= 0; };
  PipeExchange first{.after_op = -1};
  if (receives(0)) first.posts[first.count++] = {PipePost::recv, 0};
  if (first.count > 0) out.push_back(first);
  for (int k = 0; k < static_cast<int>(ops.size()); ++k) {
    PipeExchange x{.after_op = k};
    if (pipeline_op_comm(ops[k], p, r, v).send_to_rank >= 0) {
      x.posts[x.count++] = {PipePost::send, k};
    }
    if (k + 1 < static_cast<int>(ops.size()) && receives(k + 1)) {
      x.posts[x.count++] = {PipePost::recv, k + 1};
    }
    if (x.count > 0) out.push_back(x);
  }
  return out;
}

TEST(PipelineExchanges, EverySchedulesPairingCompletesUnderNcclRules) {
  int checked = 0;
  for (int p : {2, 3, 4, 5, 8}) {
    for (int v : {1, 2, 3, 4}) {
      for (int m = 1; m <= 16; ++m) {
        if (v > 1 && m % p != 0) continue;
        for (PipelineMode mode : {PipelineMode::train, PipelineMode::forward_only}) {
          const Pipeline pl = plan(p, m, v, mode);
          EXPECT_EQ(check_exchanges_under_nccl_rules(pl.ops, pl.exchanges, v), "")
              << "p " << p << " m " << m << " v " << v
              << (mode == PipelineMode::train ? " train" : " forward only");
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 292);
}

TEST(PipelineExchanges, SendWithNextReceiveDeadlocksInterleaved) {
  Pipeline pl = plan(2, 4, 2, PipelineMode::train);
  for (int r = 0; r < 2; ++r) pl.exchanges[r] = send_with_next_receive(pl.ops[r], 2, r, 2);
  // Each rank's group waits for a receive that sits in a later group of the other, behind its
  // own blocked send (groups counted as posted: those that move nothing are left out).
  EXPECT_EQ(check_exchanges_under_nccl_rules(pl.ops, pl.exchanges, 2),
            "deadlock: rank 0 in its group 6 (after B0.1) waits for rank 1's group 6; rank 1 in "
            "its group 5 (after B1.1) waits for rank 0's group 7");
  // Plain 1F1B and forward-only never deadlock with it.
  for (auto [m, mode] : {std::pair{4, PipelineMode::train}, {4, PipelineMode::forward_only}}) {
    Pipeline one = plan(4, m, 1, mode);
    for (int r = 0; r < 4; ++r) one.exchanges[r] = send_with_next_receive(one.ops[r], 4, r, 1);
    EXPECT_EQ(check_exchanges_under_nccl_rules(one.ops, one.exchanges, 1), "");
  }
}

TEST(PipelineExchanges, ASteadyForwardSharesItsBackwardsExchange) {
  // 1F1B, p 2, m 3, rank 0: F0 | F1 B0 | F2 B1 | B2 (one warm-up forward).
  const std::vector<PipeOp> ops = pipeline_schedule(2, 0, 3, 1);
  const std::vector<PipeExchange> xs = pipeline_exchanges(ops, 2, 0, 1);
  // Rank 0 receives nothing before its first forward, and B2 sends nothing: both left out.
  ASSERT_EQ(xs.size(), 3u);
  auto posts = [&](const PipeExchange& x) {
    std::string s;
    for (int i = 0; i < x.count; ++i) {
      const PipeOp& op = ops[x.posts[i].op];
      s += std::string(x.posts[i].kind == PipePost::send ? "send " : "recv ") +
           (op.kind == PipeOp::forward ? "F" : "B") + std::to_string(op.microbatch) + " ";
    }
    return std::to_string(x.after_op) + ": " + s;
  };
  EXPECT_EQ(posts(xs[0]), "0: send F0 recv B0 ");
  EXPECT_EQ(posts(xs[1]), "2: send F1 recv B1 ");
  EXPECT_EQ(posts(xs[2]), "4: send F2 recv B2 ");
}

TEST(PipelineExchanges, TransfersPostedOutOfOrderAreCaught) {
  // p 2, v 2: rank 0 sends rank 1 both activations and gradients; swapped in one exchange, the
  // tag-free matching hands each to the other's receive.
  Pipeline pl = plan(2, 4, 2, PipelineMode::train);
  bool swapped = false;
  for (PipeExchange& x : pl.exchanges[0]) {
    if (x.count >= 2 && x.posts[0].kind == PipePost::send && x.posts[1].kind == PipePost::send) {
      std::swap(x.posts[0], x.posts[1]);
      swapped = true;
      break;
    }
  }
  ASSERT_TRUE(swapped);
  const std::string problem = check_exchanges_under_nccl_rules(pl.ops, pl.exchanges, 2);
  EXPECT_NE(problem.find("is received as"), std::string::npos) << problem;
}

}  // namespace
}  // namespace jumbo
