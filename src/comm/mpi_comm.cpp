#include <mpi.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "jumbo/backend/bf16.h"
#include "jumbo/comm/comm.h"
#include "jumbo/comm/watchdog.h"
#include "mpi_comm.h"
#include "mpi_ring.h"
#include "mpi_types.h"

namespace jumbo {
namespace {

// bf16 has no MPI type: reduce it as 16-bit words with a user op that adds in fp32.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) {
    if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
  }
}

struct MpiOps {
  MPI_Op bf16_sum_op, bf16_max_op;
  MpiOps() {
    MPI_Op_create(&bf16_sum, 1, &bf16_sum_op);
    MPI_Op_create(&bf16_max, 1, &bf16_max_op);
  }
};

const MpiOps& ops() {
  static MpiOps o;
  return o;
}

}  // namespace

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT;
    case DType::bf16: return MPI_UINT16_T;
  }
  throw std::logic_error("MpiComm: unknown dtype");
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  if (t == DType::bf16) return op == ReduceOp::sum ? ops().bf16_sum_op : ops().bf16_max_op;
  return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
}

namespace {

int count_of(const Tensor& t) {
  if (t.numel() > INT32_MAX) {
    throw std::logic_error(fmt::format("MpiComm: {} elements exceed MPI's int count",
                                       t.numel()));
  }
  return static_cast<int>(t.numel());
}

class MpiComm final : public Comm {
 public:
  static constexpr size_t kMaxInFlight = 1024;
  MpiComm(MPI_Comm comm, std::string name, bool owned, P2pRules rules = P2pRules::mpi)
      : comm_(comm), name_(std::move(name)), owned_(owned), rules_(rules) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    requests_.reserve(kMaxInFlight);
    posted_bytes_.reserve(kMaxInFlight);
  }
  MPI_Comm handle() const { return comm_; }
  ~MpiComm() override {
    ring_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce(Tensor t, ReduceOp op) override {
    const BlockingOp watch("all_reduce", name_);
    count(t);
    if (size_ == 1) return;
    MPI_Allreduce(MPI_IN_PLACE, t.data, count_of(t), mpi_type(t.dtype), mpi_op(t.dtype, op),
                  comm_);
  }
  // Packed into one host buffer (grown once, then reused), reduced, unpacked.
  void all_reduce_coalesced(std::span<const Tensor> ts, ReduceOp op) override {
    const BlockingOp watch("all_reduce (coalesced)", name_);
    size_t bytes = 0;
    for (const Tensor& t : ts) {
      if (t.dtype != ts.front().dtype) {
        throw std::logic_error(fmt::format("{}: all_reduce_coalesced of {} and {}", name_,
                                           ts.front().describe(), t.describe()));
      }
      count(t);
      bytes += t.bytes();
    }
    if (size_ == 1 || ts.empty()) return;
    if (packed_.size() < bytes) packed_.resize(bytes);
    size_t at = 0;
    for (const Tensor& t : ts) {
      std::memcpy(packed_.data() + at, t.data, t.bytes());
      at += t.bytes();
    }
    const DType dtype = ts.front().dtype;
    const Tensor whole(packed_.data(), dtype, {static_cast<int64_t>(bytes / dtype_size(dtype))});
    MPI_Allreduce(MPI_IN_PLACE, whole.data, count_of(whole), mpi_type(dtype), mpi_op(dtype, op),
                  comm_);
    at = 0;
    for (const Tensor& t : ts) {
      std::memcpy(t.data, packed_.data() + at, t.bytes());
      at += t.bytes();
    }
  }
  CommRequest iall_reduce(Tensor t, ReduceOp op) override {
    count(t);
    if (size_ == 1) return {};
    if (op == ReduceOp::sum && RingCollectives::reducible(t.dtype) && t.numel() % size_ == 0) {
      return ring_request(RingKind::all_reduce, t);
    }
    MPI_Request* r = new_request();
    MPI_Iallreduce(MPI_IN_PLACE, t.data, count_of(t), mpi_type(t.dtype), mpi_op(t.dtype, op),
                   comm_, r);
    return {slot_of(r)};
  }
  void reduce_scatter(Tensor in, Tensor out) override {
    const BlockingOp watch("reduce_scatter", name_);
    check_blocks(in, out, "reduce_scatter");
    count(in);
    if (size_ == 1) return copy_if_distinct(out, in);
    if (RingCollectives::reducible(in.dtype)) {
      // The ring, in place on `in`, not MPI_Reduce_scatter_block: Open MPI's allocates a
      // temporary of the whole buffer on every call, which glibc hands back to the kernel on
      // free, so each call faulted its pages in anew (sequence parallelism's reduce-scatters
      // made a tp 2 step of the time model's check 0.40 s instead of 0.27 s).
      CommRequest r = ring_request(RingKind::reduce_scatter, in);
      wait(r);
      return copy_if_distinct(out, in.view({in.numel()}).rows(rank_ * out.numel(), out.numel()));
    }
    MPI_Reduce_scatter_block(in.data, out.data, count_of(out), mpi_type(in.dtype),
                             mpi_op(in.dtype, ReduceOp::sum), comm_);
  }
  // In place (the ring's): `in`'s other blocks are partial sums afterwards; an `out` that is
  // not in's block of this rank gets a copy.
  CommRequest ireduce_scatter(Tensor in, Tensor out) override {
    check_blocks(in, out, "reduce_scatter");
    count(in);
    if (size_ == 1) {
      copy_if_distinct(out, in);
      return {};
    }
    const Tensor mine = in.rows(rank_ * out.numel(), out.numel());
    CommRequest r = ring_request(RingKind::reduce_scatter, in);
    if (out.data != mine.data) {
      wait(r);
      copy_if_distinct(out, mine);
    }
    return r;
  }
  CommRequest iall_gather(Tensor in, Tensor out) override {
    check_blocks(out, in, "all_gather");
    count(in);
    if (size_ == 1) {
      copy_if_distinct(out, in);
      return {};
    }
    copy_if_distinct(out.rows(rank_ * in.numel(), in.numel()), in);
    return ring_request(RingKind::all_gather, out);
  }
  void all_gather(Tensor in, Tensor out) override {
    const BlockingOp watch("all_gather", name_);
    check_blocks(out, in, "all_gather");
    count(in);
    if (size_ == 1) return copy_if_distinct(out, in);
    const bool in_place = static_cast<char*>(out.data) + rank_ * in.bytes() == in.data;
    MPI_Allgather(in_place ? MPI_IN_PLACE : in.data, count_of(in), mpi_type(in.dtype), out.data,
                  count_of(in), mpi_type(in.dtype), comm_);
  }
  void broadcast(Tensor t, int root) override {
    const BlockingOp watch("broadcast", name_);
    if (rank_ == root && size_ > 1) bytes_sent_ += t.bytes();
    if (size_ == 1) return;
    MPI_Bcast(t.data, count_of(t), mpi_type(t.dtype), root, comm_);
  }
  // Under NCCL's rules a send completes only once its receive is posted (MPI_Issend) and tags
  // are ignored: messages between two ranks match in posting order, as NCCL's do.
  CommRequest isend(Tensor t, int peer, int tag) override {
    count(t);
    MPI_Request* r = new_request();
    if (rules_ == P2pRules::nccl) {
      MPI_Issend(t.data, count_of(t), mpi_type(t.dtype), peer, 0, comm_, r);
    } else {
      MPI_Isend(t.data, count_of(t), mpi_type(t.dtype), peer, tag, comm_, r);
    }
    return {slot_of(r)};
  }
  CommRequest irecv(Tensor t, int peer, int tag) override {
    MPI_Request* r = new_request();
    MPI_Irecv(t.data, count_of(t), mpi_type(t.dtype), peer, rules_ == P2pRules::nccl ? 0 : tag,
              comm_, r);
    posted_bytes_[static_cast<size_t>(slot_of(r))] = static_cast<int64_t>(t.bytes());
    return {slot_of(r)};
  }
  void wait(CommRequest& req) override {
    const BlockingOp watch("wait for a send, receive or non-blocking collective", name_);
    if (!req.pending()) return;
    if (req.slot >= kRingSlots) {
      ring_->wait(req.slot - kRingSlots);
      req.slot = -1;
      return;
    }
    MPI_Status status;
    MPI_Wait(&requests_[req.slot], &status);
    const int64_t posted = posted_bytes_[static_cast<size_t>(req.slot)];
    posted_bytes_[static_cast<size_t>(req.slot)] = -1;
    free_.push_back(req.slot);
    req.slot = -1;
    if (rules_ == P2pRules::nccl && posted >= 0) {
      // NCCL needs a receive's count to equal its send's; MPI would accept a shorter message.
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      if (got != posted) {
        throw std::logic_error(fmt::format("{}: a receive of {} bytes from rank {} was matched by "
                                           "a send of {} (NCCL's rules: equal counts)", name_,
                                           posted, status.MPI_SOURCE, got));
      }
    }
  }
  void barrier() override {
    const BlockingOp watch("barrier", name_); MPI_Barrier(comm_); }
  double all_reduce_scalar(double value, ReduceOp op) override {
    const BlockingOp watch("all_reduce", name_);
    if (size_ == 1) return value;
    double out = 0;
    MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_);
    return out;
  }
  // A binomial tree, not MPI_Gatherv: Open MPI's Gatherv is linear, so the root opened a
  // connection to every rank (+0.8 MiB on rank 0 at 64 ranks); here each rank talks to
  // log2(size) peers. Records [rank, length, bytes] travel up the tree in rank order.
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) override {
    const BlockingOp watch("gather", name_);
    std::vector<std::vector<char>> out;
    if (size_ == 1) {
      out.push_back(mine);
      return out;
    }
    if (control_ == MPI_COMM_NULL) MPI_Comm_dup(comm_, &control_);  // its own tag space
    std::vector<char> records;
    append_record(records, rank_, mine);
    const int relative = (rank_ - root + size_) % size_;
    for (int mask = 1; mask < size_; mask <<= 1) {
      if (relative & mask) {
        const int parent = (relative - mask + root) % size_;
        MPI_Send(records.data(), checked_int(records.size()), MPI_BYTE, parent, 0, control_);
        bytes_sent_ += records.size();
        return out;
      }
      if (relative + mask >= size_) continue;
      const int child = (relative + mask + root) % size_;
      MPI_Status status;
      MPI_Probe(child, 0, control_, &status);
      int n = 0;
      MPI_Get_count(&status, MPI_BYTE, &n);
      const size_t at = records.size();
      records.resize(at + static_cast<size_t>(n));
      MPI_Recv(records.data() + at, n, MPI_BYTE, child, 0, control_, MPI_STATUS_IGNORE);
    }
    out.resize(static_cast<size_t>(size_));
    for (size_t at = 0; at < records.size();) {
      int32_t from = 0;
      uint64_t length = 0;
      std::memcpy(&from, records.data() + at, sizeof from);
      std::memcpy(&length, records.data() + at + sizeof from, sizeof length);
      at += sizeof from + sizeof length;
      out[static_cast<size_t>(from)].assign(records.begin() + static_cast<ptrdiff_t>(at),
                                            records.begin() + static_cast<ptrdiff_t>(at + length));
      at += length;
    }
    return out;
  }
  void broadcast_bytes(std::vector<char>& bytes, int root) override {
    const BlockingOp watch("broadcast", name_);
    if (size_ == 1) return;
    int64_t n = static_cast<int64_t>(bytes.size());
    MPI_Bcast(&n, 1, MPI_INT64_T, root, comm_);
    bytes.resize(static_cast<size_t>(n));
    if (rank_ == root) bytes_sent_ += bytes.size();
    MPI_Bcast(bytes.data(), checked_int(bytes.size()), MPI_BYTE, root, comm_);
  }
  std::shared_ptr<Comm> split(int color, int key, const std::string& name) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub);
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiComm>(sub, name, true);
  }

 private:
  // Request slots are reused, so steady-state steps allocate nothing.
  MPI_Request* new_request() {
    if (free_.empty()) {
      if (requests_.size() == requests_.capacity()) {
        throw std::logic_error(fmt::format("{}: more than {} requests in flight", name_,
                                           requests_.capacity()));
      }
      requests_.push_back(MPI_REQUEST_NULL);
      posted_bytes_.push_back(-1);
      return &requests_.back();
    }
    const int s = free_.back();
    free_.pop_back();
    return &requests_[s];
  }
  // Bytes handed to the network: nothing for a group of one.
  void count(const Tensor& t) {
    if (size_ > 1) bytes_sent_ += t.bytes();
  }
  int checked_int(size_t n) const {
    if (n > static_cast<size_t>(std::numeric_limits<int>::max())) {
      throw std::logic_error(fmt::format("{}: {} bytes exceed MPI's int count", name_, n));
    }
    return static_cast<int>(n);
  }
  // Ring operations' requests are numbered from kRingSlots (MPI's below it).
  static constexpr int kRingSlots = 1 << 20;
  CommRequest ring_request(RingKind kind, Tensor whole) {
    // Created on first use (a collective call: every rank gets here in the same order).
    if (!ring_) ring_ = std::make_unique<RingCollectives>(comm_, rank_, size_, name_);
    return {kRingSlots + ring_->submit(kind, whole)};
  }
  int slot_of(MPI_Request* r) const { return static_cast<int>(r - requests_.data()); }
  void check_blocks(const Tensor& whole, const Tensor& block, const char* what) const {
    if (whole.numel() != block.numel() * size_ || whole.dtype != block.dtype) {
      throw std::logic_error(fmt::format("{} on {}: {} is not {} blocks of {}", what, name_,
                                         whole.describe(), size_, block.describe()));
    }
  }
  static void append_record(std::vector<char>& records, int rank, const std::vector<char>& bytes) {
    const int32_t from = rank;
    const uint64_t length = bytes.size();
    const size_t at = records.size();
    records.resize(at + sizeof from + sizeof length + bytes.size());
    std::memcpy(records.data() + at, &from, sizeof from);
    std::memcpy(records.data() + at + sizeof from, &length, sizeof length);
    if (!bytes.empty()) {
      std::memcpy(records.data() + at + sizeof from + sizeof length, bytes.data(), bytes.size());
    }
  }
  static void copy_if_distinct(Tensor dst, Tensor src) {
    if (dst.data != src.data) std::memcpy(dst.data, src.data, dst.bytes());
  }

  MPI_Comm comm_;
  MPI_Comm control_ = MPI_COMM_NULL;  // gather_bytes' tree, apart from the caller's tags
  std::string name_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
  P2pRules rules_;
  std::vector<MPI_Request> requests_;
  std::vector<int64_t> posted_bytes_;  // by slot: a receive's bytes, -1 for other requests
  std::vector<int> free_;
  std::vector<char> packed_;  // all_reduce_coalesced's staging buffer
  std::unique_ptr<RingCollectives> ring_;  // the non-blocking collectives' worker
};

}  // namespace

std::shared_ptr<Comm> duplicate_with_nccl_p2p(Comm& mpi) {
  auto* comm = dynamic_cast<MpiComm*>(&mpi);
  if (!comm) throw std::logic_error(mpi.name() + ": NCCL's rules apply to an MPI communicator");
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(comm->handle(), &dup);
  return std::make_shared<MpiComm>(dup, mpi.name(), true, P2pRules::nccl);
}

bool started_by_launcher() {
  if (const char* forced = std::getenv("JUMBO_MPI"); forced && *forced)
    return std::strcmp(forced, "0") != 0;
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

namespace {
bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}
}  // namespace

int mpi_init(int* argc, char*** argv) {
  if (!started_by_launcher()) return 1;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  }
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

void mpi_finalize() {
  if (mpi_running()) MPI_Finalize();
}

MpiInfo mpi_info() {
  MpiInfo info;
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);  // allowed before MPI_Init
  info.library.assign(text, static_cast<size_t>(length));
  // "Open MPI v4.1.4, package: ..., ident: ...": the part before the first comma.
  info.library = info.library.substr(0, info.library.find_first_of(",\n"));
  if (!started_by_launcher()) return info;
  mpi_init(nullptr, nullptr);
  info.started = true;
  int provided = 0;
  MPI_Query_thread(&provided);
  info.thread_multiple = provided == MPI_THREAD_MULTIPLE;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  MPI_Get_processor_name(name, &length);
  info.processor.assign(name, static_cast<size_t>(length));
  return info;
}

void mpi_abort(int code) {
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::shared_ptr<Comm> mpi_world() {
  if (!started_by_launcher()) {
    static auto solo = make_solo_comm("world");
    return solo;
  }
  mpi_init(nullptr, nullptr);
  static auto world = std::make_shared<MpiComm>(MPI_COMM_WORLD, "world", false);
  return world;
}

}  // namespace jumbo
