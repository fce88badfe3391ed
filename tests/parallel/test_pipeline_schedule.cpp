#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "jumbo/parallel/pipeline_schedule.h"

namespace jumbo {
namespace {

struct Layout {
  int p, m, v;
};

// Every (p, m, v) the properties are checked on: plain 1F1B with any m, interleaved with m a
// multiple of p (Megatron's requirement).
std::vector<Layout> layouts() {
  std::vector<Layout> out;
  for (int p : {1, 2, 3, 4, 8}) {
    std::vector<int> ms = {1, 2, 3, p, 2 * p, 4 * p, 8, 9, 16};
    std::sort(ms.begin(), ms.end());
    ms.erase(std::unique(ms.begin(), ms.end()), ms.end());
    for (int m : ms) {
      out.push_back({p, m, 1});
      if (m % p == 0)
        for (int v : {2, 3, 4}) out.push_back({p, m, v});
    }
  }
  return out;
}

std::string name(const Layout& l) {
  return "p=" + std::to_string(l.p) + " m=" + std::to_string(l.m) + " v=" + std::to_string(l.v);
}

PipeOp F(int microbatch, int chunk = 0) { return {PipeOp::forward, microbatch, chunk}; }
PipeOp B(int microbatch, int chunk = 0) { return {PipeOp::backward, microbatch, chunk}; }

std::string show(const std::vector<PipeOp>& ops) {
  std::string s;
  for (const PipeOp& op : ops)
    s += std::string(op.kind == PipeOp::forward ? "F" : "B") + std::to_string(op.microbatch) +
         "." + std::to_string(op.chunk) + " ";
  return s;
}

TEST(PipelineSchedule, RunsEveryForwardAndBackwardOnceForwardFirst) {
  for (const Layout& l : layouts())
    for (int r = 0; r < l.p; ++r) {
      const auto ops = pipeline_schedule(l.p, r, l.m, l.v);
      ASSERT_EQ(ops.size(), 2u * l.m * l.v) << name(l) << " rank " << r;
      std::map<std::pair<int, int>, int> forward_at, backward_at;
      for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
        auto& seen = ops[i].kind == PipeOp::forward ? forward_at : backward_at;
        const auto key = std::make_pair(ops[i].microbatch, ops[i].chunk);
        ASSERT_TRUE(ops[i].microbatch >= 0 && ops[i].microbatch < l.m) << name(l);
        ASSERT_TRUE(ops[i].chunk >= 0 && ops[i].chunk < l.v) << name(l);
        ASSERT_EQ(seen.count(key), 0u) << name(l) << " rank " << r << " repeats " << show({ops[i]});
        seen[key] = i;
      }
      ASSERT_EQ(forward_at.size(), static_cast<size_t>(l.m * l.v)) << name(l);
      for (const auto& [key, i] : forward_at)
        EXPECT_LT(i, backward_at.at(key)) << name(l) << " rank " << r;
    }
}

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternatesThenCoolsDown) {
  // p = 4, m = 6, rank 1: two warm-up forwards.
  EXPECT_EQ(show(pipeline_schedule(4, 1, 6, 1)),
            show({F(0), F(1), F(2), B(0), F(3), B(1), F(4), B(2), F(5), B(3), B(4), B(5)}));
  // The last stage alternates from the start; the first runs p - 1 forwards first.
  EXPECT_EQ(show(pipeline_schedule(4, 3, 3, 1)), show({F(0), B(0), F(1), B(1), F(2), B(2)}));
  EXPECT_EQ(show(pipeline_schedule(4, 0, 2, 1)), show({F(0), F(1), B(0), B(1)}));
  for (const Layout& l : layouts()) {
    if (l.v != 1) continue;
    for (int r = 0; r < l.p; ++r)
      EXPECT_EQ(pipeline_warmup_forwards(l.p, r, l.m, 1), std::min(l.p - r - 1, l.m)) << name(l);
  }
}

TEST(PipelineSchedule, InterleavedFollowsMegatronGroupsOfPMicrobatchesPerChunk) {
  // p = 2, v = 2, m = 4 worked by hand from Megatron's get_model_chunk_id: forwards run
  // (0,c0) (1,c0) (0,c1) (1,c1) (2,c0) (3,c0) (2,c1) (3,c1); backwards the same with the
  // chunks reversed. Rank 0 warms up 2 (2 - 0 - 1) + (2 - 1) 2 = 4, rank 1 warms up 2.
  EXPECT_EQ(show(pipeline_schedule(2, 0, 4, 2)),
            show({F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(2, 0), B(0, 1), F(3, 0), B(1, 1),
                  F(2, 1), B(0, 0), F(3, 1), B(1, 0), B(2, 1), B(3, 1), B(2, 0), B(3, 0)}));
  EXPECT_EQ(show(pipeline_schedule(2, 1, 4, 2)),
            show({F(0, 0), F(1, 0), F(0, 1), B(0, 1), F(1, 1), B(1, 1), F(2, 0), B(0, 0),
                  F(3, 0), B(1, 0), F(2, 1), B(2, 1), F(3, 1), B(3, 1), B(2, 0), B(3, 0)}));
  EXPECT_EQ(pipeline_warmup_forwards(4, 0, 8, 3), 2 * 3 + 2 * 4);
  EXPECT_EQ(pipeline_warmup_forwards(4, 0, 4, 2), 8);  // capped at m v: all forwards first
}

TEST(PipelineSchedule, RejectsBadArgumentsWithOneLine) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  const std::string not_multiple = message([] { pipeline_schedule(4, 0, 6, 2); });
  EXPECT_NE(not_multiple.find("microbatches = 6"), std::string::npos) << not_multiple;
  EXPECT_NE(not_multiple.find("multiple of the pipeline stages (4)"), std::string::npos);
  EXPECT_EQ(not_multiple.find('\n'), std::string::npos);
  EXPECT_NE(message([] { pipeline_schedule(0, 0, 4, 1); }).find("stages = 0"), std::string::npos);
  EXPECT_NE(message([] { pipeline_schedule(4, 4, 4, 1); }).find("stage = 4"), std::string::npos);
  EXPECT_NE(message([] { pipeline_schedule(4, 0, 0, 1); }).find("microbatches = 0"),
            std::string::npos);
  EXPECT_NE(message([] { pipeline_schedule(4, 0, 4, 0); }).find("virtual_stages = 0"),
            std::string::npos);
  EXPECT_NO_THROW(pipeline_schedule(4, 0, 6, 1));  // plain 1F1B takes any m
}

TEST(PipelineSchedule, InFlightActivationsAreBoundedByTheWarmUp) {
  for (const Layout& l : layouts())
    for (int r = 0; r < l.p; ++r) {
      const int held = max_in_flight(pipeline_schedule(l.p, r, l.m, l.v));
      if (l.v == 1) {
        EXPECT_EQ(held, std::min(l.p - r, l.m)) << name(l) << " rank " << r;
      } else {
        // Megatron's warm-up plus the one forward of the first steady pair.
        const int warmup = 2 * (l.p - r - 1) + (l.v - 1) * l.p;
        EXPECT_EQ(held, std::min(warmup + 1, l.m * l.v)) << name(l) << " rank " << r;
      }
    }
  EXPECT_EQ(max_in_flight({F(0), F(1), B(0), F(2), F(3), B(1), B(2), B(3)}), 3);
  EXPECT_EQ(max_in_flight({}), 0);
}

TEST(PipelineSchedule, VirtualStagesFollowMegatronsAssignment) {
  // p = 4, v = 2: rank 1 holds virtual stages 1 and 5.
  EXPECT_EQ(virtual_stage(1, 0, 4), 1);
  EXPECT_EQ(virtual_stage(1, 1, 4), 5);
  for (int p : {1, 2, 3, 4, 8})
    for (int s = 0; s < 3 * p; ++s) EXPECT_EQ(virtual_stage(owner_of(s, p), s / p, p), s);
}

TEST(PipelineSchedule, OpsNameTheirTransfers) {
  const int p = 4, v = 2;  // virtual stages 0..7
  const PipeOpComm first = pipeline_op_comm(F(0, 0), p, 0, v);
  EXPECT_TRUE(first.reads_tokens);
  EXPECT_EQ(first.recv_from_rank, -1);
  EXPECT_EQ(first.send_to_rank, 1);
  const PipeOpComm wrap = pipeline_op_comm(F(0, 0), p, 3, v);  // stage 3 -> stage 4 on rank 0
  EXPECT_EQ(wrap.virtual_stage, 3);
  EXPECT_EQ(wrap.recv_from_rank, 2);
  EXPECT_EQ(wrap.send_to_rank, 0);
  EXPECT_FALSE(wrap.computes_loss);
  const PipeOpComm last = pipeline_op_comm(F(2, 1), p, 3, v);
  EXPECT_TRUE(last.computes_loss);
  EXPECT_EQ(last.send_to_rank, -1);
  EXPECT_EQ(last.recv_from_rank, 2);
  const PipeOpComm last_back = pipeline_op_comm(B(2, 1), p, 3, v);
  EXPECT_EQ(last_back.recv_from_rank, -1);  // starts from the loss
  EXPECT_EQ(last_back.send_to_rank, 2);
  const PipeOpComm back_wrap = pipeline_op_comm(B(1, 1), p, 0, v);  // stage 4 -> stage 3
  EXPECT_EQ(back_wrap.virtual_stage, 4);
  EXPECT_EQ(back_wrap.recv_from_rank, 1);
  EXPECT_EQ(back_wrap.send_to_rank, 3);
  EXPECT_FALSE(back_wrap.reads_tokens);
  const PipeOpComm first_back = pipeline_op_comm(B(1, 0), p, 0, v);
  EXPECT_EQ(first_back.send_to_rank, -1);
  EXPECT_EQ(first_back.recv_from_rank, 1);
}

// The trainer can match messages without per-microbatch tags: between any two ranks, in each
// direction (activations, gradients), messages are received in the order they are sent.
TEST(PipelineSchedule, MessagesBetweenTwoRanksArriveInSendOrder) {
  for (const Layout& l : layouts()) {
    using Message = std::tuple<int, int>;  // microbatch, sending virtual stage
    std::map<std::tuple<int, int, int>, std::vector<Message>> sent, received;  // src, dst, kind
    for (int r = 0; r < l.p; ++r)
      for (const PipeOp& op : pipeline_schedule(l.p, r, l.m, l.v)) {
        const PipeOpComm c = pipeline_op_comm(op, l.p, r, l.v);
        const int step = op.kind == PipeOp::forward ? 1 : -1;  // direction of the data
        if (c.send_to_rank >= 0)
          sent[{r, c.send_to_rank, op.kind}].push_back({op.microbatch, c.virtual_stage});
        if (c.recv_from_rank >= 0)
          received[{c.recv_from_rank, r, op.kind}].push_back(
              {op.microbatch, c.virtual_stage - step});
      }
    EXPECT_EQ(sent, received) << name(l);
  }
}

TEST(PipelineTimeline, NeverDeadlocksAndRespectsDependencies) {
  for (const Layout& l : layouts()) {
    Timeline tl;
    ASSERT_NO_THROW(tl = simulate_pipeline(l.p, l.m, l.v, 1.0, 2.0)) << name(l);
    const int last = l.p * l.v - 1;
    std::map<std::tuple<int, int, int>, PipeInterval> at;  // kind, virtual stage, microbatch
    for (int r = 0; r < l.p; ++r) {
      const auto ops = pipeline_schedule(l.p, r, l.m, l.v);
      ASSERT_EQ(tl.busy[r].size(), ops.size());
      for (size_t i = 0; i < ops.size(); ++i) {
        const PipeInterval& iv = tl.busy[r][i];
        EXPECT_EQ(iv.op, ops[i]);  // in schedule order
        if (i > 0) {
          EXPECT_GE(iv.start, tl.busy[r][i - 1].end);  // one at a time
        }
        EXPECT_NEAR(iv.end - iv.start, (iv.op.kind == PipeOp::forward ? 1.0 : 2.0) / l.v, 1e-12);
        at[{iv.op.kind, virtual_stage(r, iv.op.chunk, l.p), iv.op.microbatch}] = iv;
      }
    }
    for (const auto& [key, iv] : at) {
      const auto [kind, s, k] = key;
      if (kind == PipeOp::forward && s > 0) {
        EXPECT_GE(iv.start, at.at({kind, s - 1, k}).end);
      }
      if (kind == PipeOp::backward) {
        EXPECT_GE(iv.start, at.at({PipeOp::forward, s, k}).end);
        if (s < last) {
          EXPECT_GE(iv.start, at.at({kind, s + 1, k}).end);
        }
      }
    }
  }
}

// Evaluation and inference run the training schedule's forwards alone, in its order: every
// rank's list is a chain that cannot deadlock either.
TEST(PipelineSchedule, ForwardOnlyIsTheTrainingForwardsInOrder) {
  for (int p : {1, 2, 4}) {
    for (int v : {1, 2}) {
      if (v > 1 && p == 1) continue;
      const int m = 2 * p;
      std::vector<std::vector<PipeOp>> ranks;
      for (int r = 0; r < p; ++r) {
        std::vector<PipeOp> forwards;
        for (const PipeOp& op : pipeline_schedule(p, r, m, v))
          if (op.kind == PipeOp::forward) forwards.push_back(op);
        EXPECT_EQ(pipeline_schedule(p, r, m, v, PipelineMode::forward_only), forwards);
        ranks.push_back(forwards);
      }
      const Timeline tl = simulate_pipeline(ranks, v, 1.0, 2.0);
      for (const auto& busy : tl.busy) EXPECT_EQ(busy.size(), static_cast<size_t>(m * v));
    }
  }
}

TEST(PipelineTimeline, DetectsADeadlockAndNamesTheStuckRanks) {
  // Rank 1 runs two forwards before its first backward, but rank 0 will not send the second
  // activation until it has the first gradient: a cycle.
  const std::vector<std::vector<PipeOp>> ops = {{F(0), B(0), F(1), B(1)},
                                                {F(0), F(1), B(0), B(1)}};
  try {
    simulate_pipeline(ops, 1, 1.0, 2.0);
    FAIL() << "no deadlock reported";
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0 waits to run the backward of microbatch 0"), std::string::npos)
        << what;
    EXPECT_NE(what.find("rank 1 waits to run the forward of microbatch 1"), std::string::npos)
        << what;
  }
  // The same ranks in 1F1B order run.
  EXPECT_NO_THROW(simulate_pipeline({pipeline_schedule(2, 0, 2, 1), pipeline_schedule(2, 1, 2, 1)},
                                    1, 1.0, 2.0));
}

TEST(PipelineTimeline, OneFOneBBubbleIsPMinusOneOverMPlusPMinusOne) {
  for (const Layout& l : layouts()) {
    if (l.v != 1) continue;
    const double expected = (l.p - 1.0) / (l.m + l.p - 1.0);
    for (double t_backward : {1.0, 2.0, 3.0}) {
      const Timeline tl = simulate_pipeline(l.p, l.m, 1, 1.0, t_backward);
      EXPECT_NEAR(tl.bubble_fraction, expected, 1e-12) << name(l) << " tb=" << t_backward;
      EXPECT_NEAR(tl.makespan, (l.m + l.p - 1) * (1.0 + t_backward), 1e-9) << name(l);
    }
    EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(l.p, l.m, 1), expected);
  }
  // p = 4, m = 8, t_b = 2 t_f: 3/11 of the step idle.
  EXPECT_NEAR(simulate_pipeline(4, 8, 1, 1.0, 2.0).bubble_fraction, 3.0 / 11.0, 1e-12);
}

TEST(PipelineTimeline, InterleavingShrinksTheBubbleToPMinusOneOverVMPlusPMinusOne) {
  for (const Layout& l : layouts()) {
    if (l.v == 1) continue;
    const double expected = (l.p - 1.0) / (l.v * l.m + l.p - 1.0);
    for (double t_backward : {1.0, 2.0}) {
      const Timeline tl = simulate_pipeline(l.p, l.m, l.v, 1.0, t_backward);
      EXPECT_NEAR(tl.bubble_fraction, expected, 1e-12) << name(l) << " tb=" << t_backward;
      // Step time (m + (p - 1) / v) (t_f + t_b): the fill and drain cost one chunk each.
      EXPECT_NEAR(tl.makespan, (l.m + (l.p - 1.0) / l.v) * (1.0 + t_backward), 1e-9) << name(l);
      if (l.p > 1) {
        const Timeline plain = simulate_pipeline(l.p, l.m, 1, 1.0, t_backward);
        EXPECT_LT(tl.bubble_fraction, plain.bubble_fraction) << name(l);
      }
    }
    EXPECT_NEAR(pipeline_bubble_fraction(l.p, l.m, l.v), expected, 1e-15);
  }
  EXPECT_NEAR(simulate_pipeline(4, 8, 2, 1.0, 2.0).bubble_fraction, 3.0 / 19.0, 1e-12);
  EXPECT_NEAR(simulate_pipeline(4, 8, 3, 1.0, 2.0).bubble_fraction, 3.0 / 27.0, 1e-12);
}

// Transfers between ranks, worked by hand (t_f = 1, t_b = 2, d = 0.1). One microbatch on
// two ranks crosses twice: 6 + 2d either way. Three: rank 1 posts each receive after its
// previous op, so every transfer waits for it, 12 + 4d; when transfers also need their sender
// between ops, rank 0's first activation leaves only after its second forward (rank 0 starts
// it at once), one forward later: 13 + 4d.
TEST(PipelineTimeline, TransfersDelayTheOpsThatWaitForThem) {
  const double d = 0.1;
  const PipeTransfer posted{.seconds = d, .needs_sender_progress = false};
  const PipeTransfer sender{.seconds = d, .needs_sender_progress = true};
  EXPECT_NEAR(simulate_pipeline(2, 1, 1, 1.0, 2.0, posted).makespan, 6 + 2 * d, 1e-12);
  EXPECT_NEAR(simulate_pipeline(2, 1, 1, 1.0, 2.0, sender).makespan, 6 + 2 * d, 1e-12);
  EXPECT_NEAR(simulate_pipeline(2, 3, 1, 1.0, 2.0, posted).makespan, 12 + 4 * d, 1e-12);
  const Timeline tl = simulate_pipeline(2, 3, 1, 1.0, 2.0, sender);
  EXPECT_NEAR(tl.makespan, 13 + 4 * d, 1e-12);
  EXPECT_NEAR(tl.busy[1][0].start, 2 + d, 1e-12);  // rank 1's first forward
  EXPECT_THROW(simulate_pipeline(2, 1, 1, 1.0, 2.0, {.seconds = -1}), std::invalid_argument);
}

// Over every layout, in both modes: no deadlock, an op that waits for another rank's output
// starts at least a transfer after it, and each constraint only lengthens the step (no
// transfers <= transfers once posted <= transfers that also need their sender).
TEST(PipelineTimeline, TransfersRespectDependenciesAndOnlyLengthenTheStep) {
  const double d = 0.3;
  for (const Layout& l : layouts()) {
    const Timeline free = simulate_pipeline(l.p, l.m, l.v, 1.0, 2.0);
    double previous = free.makespan;
    for (bool needs_sender : {false, true}) {
      Timeline tl;
      ASSERT_NO_THROW(tl = simulate_pipeline(l.p, l.m, l.v, 1.0, 2.0,
                                             {.seconds = d, .needs_sender_progress = needs_sender}))
          << name(l);
      std::map<std::tuple<int, int, int>, double> end;  // kind, virtual stage, microbatch
      for (int r = 0; r < l.p; ++r)
        for (const PipeInterval& iv : tl.busy[r])
          end[{iv.op.kind, virtual_stage(r, iv.op.chunk, l.p), iv.op.microbatch}] = iv.end;
      for (int r = 0; r < l.p; ++r)
        for (const PipeInterval& iv : tl.busy[r]) {
          const int s = virtual_stage(r, iv.op.chunk, l.p);
          const int from = iv.op.kind == PipeOp::forward ? s - 1 : s + 1;
          if (from < 0 || from >= l.p * l.v || owner_of(from, l.p) == r) continue;
          EXPECT_GE(iv.start + 1e-12, end.at({iv.op.kind, from, iv.op.microbatch}) + d) << name(l);
        }
      EXPECT_GE(tl.makespan + 1e-12, previous) << name(l) << " sender " << needs_sender;
      if (l.p > 1) {
        EXPECT_GT(tl.makespan, free.makespan) << name(l);
      }
      previous = tl.makespan;
    }
  }
}

TEST(PipelineTimeline, RendersOneLinePerRankWithLabelledOps) {
  // p = 4, m = 8, t_f = 1, t_b = 2: 33 time units at 3 columns each.
  const Timeline tl = simulate_pipeline(4, 8, 1, 1.0, 2.0);
  const std::string chart = render_timeline(tl, 99);
  std::istringstream lines(chart);
  std::string line;
  int rank = 0;
  while (std::getline(lines, line)) {
    const std::string prefix = "rank " + std::to_string(rank) + " |";
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
    const std::string cells = line.substr(prefix.size());
    ASSERT_EQ(cells.size(), 99u) << line;
    // 24 busy units of 33 per rank: 27 idle cells, every forward and backward labelled once.
    EXPECT_EQ(std::count(cells.begin(), cells.end(), '.'), 27) << line;
    EXPECT_EQ(std::count(cells.begin(), cells.end(), 'F'), 8) << line;
    EXPECT_EQ(std::count(cells.begin(), cells.end(), 'B'), 8) << line;
    ++rank;
  }
  EXPECT_EQ(rank, 4);
  EXPECT_EQ(chart.rfind("rank 0 |F0-F1-F2-F3-", 0), 0u) << chart;
  EXPECT_NE(chart.find("rank 3 |.........F0-B0----F1-B1----"), std::string::npos) << chart;

  // Interleaved, v = 2: chunk 1 is lower case.
  const std::string inter = render_timeline(simulate_pipeline(4, 8, 2, 1.0, 2.0), 114);
  EXPECT_EQ(std::count(inter.begin(), inter.end(), '\n'), 4);
  EXPECT_EQ(std::count(inter.begin(), inter.end(), 'f'), 4 * 8);
  EXPECT_EQ(std::count(inter.begin(), inter.end(), 'b'), 4 * 8);
  EXPECT_EQ(inter.rfind("rank 0 |F0F1F2F3f0f1f2f3", 0), 0u) << inter;
  // v = 3 names the chunk after a dot; a too-narrow chart cuts labels but keeps its width.
  EXPECT_NE(render_timeline(simulate_pipeline(2, 2, 3, 1.0, 2.0), 200).find("F1.2"),
            std::string::npos);
  const std::string narrow = render_timeline(tl, 10);
  EXPECT_EQ(narrow.substr(0, narrow.find('\n')).size(), std::string("rank 0 |").size() + 10);
  EXPECT_THROW(render_timeline(tl, 0), std::invalid_argument);
}

TEST(PipelineTimeline, IsFastOnALargeLayout) {
  // p = 8, m = 64, v = 4: 512 ops per rank.
  const Timeline tl = simulate_pipeline(8, 64, 4, 1.0, 2.0);
  EXPECT_NEAR(tl.bubble_fraction, 7.0 / (4 * 64 + 7), 1e-12);
}

}  // namespace
}  // namespace jumbo
