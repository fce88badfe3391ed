// The pipeline's exchanges (see the header) and their check under NCCL's rules.
#include "jumbo/parallel/pipeline_exchange.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace jumbo {
namespace {

// A rank's transfers of one op: to or from which rank (-1: none).
int peer_of(const PipeOp& op, PipePost::Kind kind, int stages, int stage, int v) {
  const PipeOpComm c = pipeline_op_comm(op, stages, stage, v);
  return kind == PipePost::send ? c.send_to_rank : c.recv_from_rank;
}

void add(PipeExchange& x, PipePost post) {
  if (x.count == static_cast<int>(x.posts.size())) {
    throw std::logic_error("pipeline exchange: more than four transfers");
  }
  x.posts[static_cast<size_t>(x.count++)] = post;
}

std::string describe(const PipeOp& op) {
  return fmt::format("{}{}.{}", op.kind == PipeOp::forward ? "F" : "B", op.microbatch, op.chunk);
}

// What a transfer carries: the direction, the microbatch and the virtual stage that sent it.
struct Message {
  PipeOp::Kind kind;
  int microbatch, from_virtual_stage;
  bool operator==(const Message&) const = default;
};

std::string describe(const Message& m) {
  return fmt::format("{} of microbatch {} from virtual stage {}",
                     m.kind == PipeOp::forward ? "the activations" : "the gradient", m.microbatch,
                     m.from_virtual_stage);
}

struct Endpoint {
  int group;  // index in the rank's exchanges
  Message message;
};

}  // namespace

std::vector<PipeExchange> pipeline_exchanges(const std::vector<PipeOp>& ops, int stages,
                                             int stage, int virtual_stages) {
  const int n = static_cast<int>(ops.size());
  // The steady state pairs forward i with backward i - w: F^w (F B)^(t - w) B^w for t
  // forwards and w warm-up forwards. The leading forwards are w + 1 when a steady state
  // exists, all t when it does not (and forward-only schedules have no backward at all).
  int forwards = 0, leading = 0;
  for (const PipeOp& op : ops) forwards += op.kind == PipeOp::forward;
  while (leading < n && ops[leading].kind == PipeOp::forward) ++leading;
  const int steady_from = leading == forwards ? n : leading - 1;
  const int steady_end = leading == forwards ? n : steady_from + 2 * (forwards - steady_from);
  auto block_after = [&](int k) {  // the last op of the block that starts at op k
    return k >= steady_from && k < steady_end ? k + 1 : k;
  };
  std::vector<PipeExchange> out;
  auto push = [&](PipeExchange& x) {
    if (x.count > 0) out.push_back(x);
  };
  auto add_kind = [&](PipeExchange& x, PipePost::Kind kind, int first, int last) {
    for (int k = first; k <= last; ++k) {
      if (peer_of(ops[k], kind, stages, stage, virtual_stages) >= 0) add(x, {kind, k});
    }
  };
  if (n == 0) return out;
  PipeExchange before{.after_op = -1};
  add_kind(before, PipePost::recv, 0, block_after(0));
  push(before);
  for (int first = 0; first < n;) {
    const int last = block_after(first);
    PipeExchange x{.after_op = last};
    add_kind(x, PipePost::send, first, last);
    if (last + 1 < n) add_kind(x, PipePost::recv, last + 1, block_after(last + 1));
    push(x);
    first = last + 1;
  }
  return out;
}

std::string check_exchanges_under_nccl_rules(
    const std::vector<std::vector<PipeOp>>& ops,
    const std::vector<std::vector<PipeExchange>>& exchanges, int virtual_stages) {
  const int p = static_cast<int>(ops.size());
  // The transfers from rank a to rank b, in posting order, at [a * p + b].
  std::vector<std::vector<Endpoint>> sent(p * p), received(p * p);
  for (int r = 0; r < p; ++r) {
    for (int g = 0; g < static_cast<int>(exchanges[r].size()); ++g) {
      const PipeExchange& x = exchanges[r][g];
      for (int i = 0; i < x.count; ++i) {
        const PipeOp& op = ops[r][x.posts[i].op];
        const int peer = peer_of(op, x.posts[i].kind, p, r, virtual_stages);
        const int vs = virtual_stage(r, op.chunk, p);
        if (x.posts[i].kind == PipePost::send) {
          sent[r * p + peer].push_back({g, {op.kind, op.microbatch, vs}});
        } else {  // what the op expects: from the virtual stage before (forward) or after
          const int from = op.kind == PipeOp::forward ? vs - 1 : vs + 1;
          received[peer * p + r].push_back({g, {op.kind, op.microbatch, from}});
        }
      }
    }
  }
  // partners[r][g]: the (rank, group) pairs rank r's group g meets; it completes once every
  // one of them has been posted.
  std::vector<std::vector<std::vector<std::pair<int, int>>>> partners(p);
  for (int r = 0; r < p; ++r) partners[r].resize(exchanges[r].size());
  for (int a = 0; a < p; ++a) {
    for (int b = 0; b < p; ++b) {
      const std::vector<Endpoint>& s = sent[a * p + b];
      const std::vector<Endpoint>& q = received[a * p + b];
      if (s.size() != q.size()) {
        return fmt::format("rank {} sends {} transfers to rank {}, which receives {}", a, s.size(),
                           b, q.size());
      }
      for (size_t i = 0; i < s.size(); ++i) {
        if (!(s[i].message == q[i].message)) {
          return fmt::format("transfer {} from rank {} to rank {} carries {} but is received as {}",
                             i + 1, a, b, describe(s[i].message), describe(q[i].message));
        }
        partners[a][s[i].group].push_back({b, q[i].group});
        partners[b][q[i].group].push_back({a, s[i].group});
      }
    }
  }
  std::vector<int> at(p, 0);  // each rank's group in progress
  auto finished = [&](int r) { return at[r] == static_cast<int>(exchanges[r].size()); };
  auto posted = [&](std::pair<int, int> partner) { return at[partner.first] >= partner.second; };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (!finished(r) && std::all_of(partners[r][at[r]].begin(), partners[r][at[r]].end(),
                                         posted)) {
        ++at[r];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < p; ++r) {
    if (finished(r)) continue;
    const PipeExchange& x = exchanges[r][at[r]];
    const std::string after =
        x.after_op < 0 ? "before its first op" : "after " + describe(ops[r][x.after_op]);
    std::string waits;
    for (const std::pair<int, int>& partner : partners[r][at[r]]) {
      if (posted(partner)) continue;
      waits += fmt::format("{}rank {}'s group {}", waits.empty() ? "" : ", ", partner.first,
                           partner.second + 1);
    }
    stuck += fmt::format("{}rank {} in its group {} ({}) waits for {}", stuck.empty() ? "" : "; ",
                         r, at[r] + 1, after, waits);
  }
  return stuck.empty() ? "" : "deadlock: " + stuck;
}

}  // namespace jumbo
