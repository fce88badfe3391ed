// SoloComm: the world of a process started without a launcher (no mpirun, no srun). It is
// one rank, so every collective is local; MPI is never started, which lets `jumbo` run on a
// machine without Open MPI's runtime (a login node, a bare GPU machine) and start faster.
#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "jumbo/comm/comm.h"

namespace jumbo {
namespace {

class SoloComm final : public Comm {
 public:
  explicit SoloComm(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  void all_reduce(Tensor, ReduceOp) override {}
  CommRequest iall_reduce(Tensor, ReduceOp) override { return {}; }
  void all_reduce_coalesced(std::span<const Tensor>, ReduceOp) override {}
  void reduce_scatter(Tensor in, Tensor out) override { copy_if_distinct(out, in); }
  CommRequest ireduce_scatter(Tensor in, Tensor out) override {
    copy_if_distinct(out, in);
    return {};
  }
  void all_gather(Tensor in, Tensor out) override { copy_if_distinct(out, in); }
  CommRequest iall_gather(Tensor in, Tensor out) override {
    copy_if_distinct(out, in);
    return {};
  }
  void broadcast(Tensor, int) override {}
  CommRequest isend(Tensor, int peer, int) override { no_peer("send to", peer); }
  CommRequest irecv(Tensor, int peer, int) override { no_peer("receive from", peer); }
  void wait(CommRequest& r) override { r.slot = -1; }
  void barrier() override {}
  double all_reduce_scalar(double value, ReduceOp) override { return value; }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int) override {
    return {mine};
  }
  void broadcast_bytes(std::vector<char>&, int) override {}
  std::shared_ptr<Comm> split(int color, int, const std::string& name) override {
    if (color < 0) return nullptr;
    return std::make_shared<SoloComm>(name);
  }

 private:
  [[noreturn]] void no_peer(const char* what, int peer) const {
    throw std::logic_error(fmt::format("{}: cannot {} rank {} in a one-rank world", name_, what,
                                       peer));
  }
  // Host memory only: device tensors go through an NcclComm, which handles a group of one.
  static void copy_if_distinct(Tensor dst, Tensor src) {
    if (dst.data == src.data) return;
    if (dst.device != Device::cpu || src.device != Device::cpu)
      throw std::logic_error("SoloComm: device tensors need an NcclComm");
    std::memcpy(dst.data, src.data, dst.bytes());
  }

  std::string name_;
};

}  // namespace

std::shared_ptr<Comm> make_solo_comm(const std::string& name) {
  return std::make_shared<SoloComm>(name);
}

}  // namespace jumbo
