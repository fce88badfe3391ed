// CloudWatch Embedded Metric Format lines, to a file and/or to the agent's TCP/UDP endpoint.
// The socket side must never end or stall a week-long run: non-blocking connect bounded by
// kConnectTimeout, non-blocking sends, lines dropped (and counted) when the agent is away.
#include "jumbo/obs/emf.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace jumbo {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr auto kConnectTimeout = std::chrono::milliseconds(1000);
constexpr auto kRetryInterval = std::chrono::seconds(60);
// UDP cannot tell when an agent comes back, so its refusals are repeated at most this often.
constexpr auto kUdpWarningInterval = std::chrono::hours(1);

// Adds one metric to the declaration and its value to the line, unless the value is not finite:
// JSON has no NaN/Infinity and CloudWatch rejects them, so such a metric is left out.
void add_metric(nlohmann::ordered_json& line, nlohmann::ordered_json& declared, const char* name,
                const char* unit, double value) {
  if (!std::isfinite(value)) return;
  declared.push_back({{"Name", name}, {"Unit", unit}});
  line[name] = value;
}

}  // namespace

std::string emf_line(const StepMetrics& m, const std::string& ns, const std::string& run_name,
                     const std::string& layout, int64_t timestamp_ms) {
  nlohmann::ordered_json declared = nlohmann::ordered_json::array();
  nlohmann::ordered_json values = nlohmann::ordered_json::object();
  add_metric(values, declared, "Loss", "None", m.loss);
  if (m.val_loss) add_metric(values, declared, "ValLoss", "None", *m.val_loss);
  add_metric(values, declared, "TokensPerSecond", "Count/Second", m.tokens_per_s);
  add_metric(values, declared, "TFLOPsPerDevice", "None", m.tflops_per_device);
  add_metric(values, declared, "MFU", "Percent", m.mfu * 100.0);
  add_metric(values, declared, "GradNorm", "None", m.grad_norm);
  add_metric(values, declared, "StepTime", "Seconds", m.step_time_s);
  add_metric(values, declared, "LearningRate", "None", m.lr);
  declared.push_back({{"Name", "MemoryPeak"}, {"Unit", "Bytes"}});
  values["MemoryPeak"] = m.mem_peak_bytes;
  // Always present, 0 or 1: an alarm on Sum >= 1 needs the zeros as data points.
  add_metric(values, declared, "Anomalies", "Count", m.anomaly ? 1.0 : 0.0);
  if (m.ranks) {
    add_metric(values, declared, "StragglerRatio", "None", m.ranks->slowest_ratio);
    add_metric(values, declared, "Stragglers", "Count", static_cast<double>(m.ranks->stragglers.size()));
  }

  // ordered_json: _aws first, then dimensions and properties, then values, as the docs show.
  nlohmann::ordered_json j;
  j["_aws"]["Timestamp"] = timestamp_ms;
  j["_aws"]["CloudWatchMetrics"] = nlohmann::ordered_json::array(
      {{{"Namespace", ns},
        {"Dimensions", nlohmann::ordered_json::array({{"RunName", "Layout"}})},
        {"Metrics", declared}}});
  j["RunName"] = run_name;
  j["Layout"] = layout;
  // Step and Tokens are properties: searchable in CloudWatch Logs Insights, not metrics.
  j["Step"] = m.step;
  j["Tokens"] = m.tokens;
  j.update(values);
  return j.dump();
}

std::string emf_layout(int64_t tp, int64_t pp, int64_t dp) {
  return fmt::format("tp{}-pp{}-dp{}", tp, pp, dp);
}

std::string emf_run_name(const RunConfig& cfg) {
  if (!cfg.log.run_name.empty()) return cfg.log.run_name;
  // Keep a readable, dimension-safe name: letters, digits, '.', '_', '-' ("<embedded demo>"
  // becomes "embedded-demo").
  std::string name;
  for (char c : std::filesystem::path(cfg.source).stem().string()) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    if (keep) {
      name += c;
    } else if (!name.empty() && name.back() != '-') {
      name += '-';
    }
  }
  while (!name.empty() && name.back() == '-') name.pop_back();
  return name.empty() ? "jumbo" : name;
}

// The connection to the agent's EMF endpoint. Every network failure is handled here, never
// thrown: only a malformed address (which the config already refuses) is an error.
class EmfSocket {
 public:
  explicit EmfSocket(std::string address) : address_(std::move(address)) {
    // The config validated it (tcp://HOST:PORT or udp://HOST:PORT); IPv6 hosts may be [..].
    tcp_ = address_.rfind("tcp://", 0) == 0;
    const size_t colon = address_.rfind(':');
    if ((!tcp_ && address_.rfind("udp://", 0) != 0) || colon == std::string::npos || colon <= 6) {
      throw UserError(fmt::format("log.emf_address = \"{}\": expected tcp://HOST:PORT or "
                                  "udp://HOST:PORT", address_));
    }
    host_ = address_.substr(6, colon - 6);
    port_ = address_.substr(colon + 1);
    if (host_.size() >= 2 && host_.front() == '[' && host_.back() == ']') {
      host_ = host_.substr(1, host_.size() - 2);
    }
    connect_now();
  }
  ~EmfSocket() {
    if (fd_ >= 0) close(fd_);
  }
  EmfSocket(const EmfSocket&) = delete;
  EmfSocket& operator=(const EmfSocket&) = delete;

  int64_t dropped() const { return dropped_; }

  // `line` ends in '\n'. Sends it whole or not at all (as seen by the agent).
  void send_line(const std::string& line) {
    if (fd_ < 0 && SteadyClock::now() - last_attempt_ >= kRetryInterval) connect_now();
    if (fd_ < 0) {
      ++dropped_;
      return;
    }
    // TCP is a byte stream: the tail of a line the kernel took only partly must go first, or
    // the agent would see two lines glued together.
    if (!pending_.empty()) send_some(pending_);
    std::string rest = line;
    if (!pending_.empty() || fd_ < 0 || !send_some(rest)) {
      ++dropped_;
      return;
    }
    pending_ = std::move(rest);  // usually empty
  }

 private:
  // Sends what the socket buffer takes now, erasing it from `data`. False when nothing of
  // `data` could be sent (buffer full, or the connection is gone).
  bool send_some(std::string& data) {
    const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.erase(0, static_cast<size_t>(n));
      return true;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS || err == EINTR) return false;
    if (!tcp_ && err == ECONNREFUSED) {
      // UDP: an earlier datagram found no listener (ICMP). The socket stays usable.
      warn("send", err);
      return false;
    }
    warn("send", err);
    disconnect();
    return false;
  }

  void connect_now() {
    last_attempt_ = SteadyClock::now();
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = tcp_ ? SOCK_STREAM : SOCK_DGRAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const int gai = getaddrinfo(host_.c_str(), port_.c_str(), &hints, &found);
    if (gai != 0) {
      warn_text(fmt::format("cannot resolve host: {}", gai_strerror(gai)));
      return;
    }
    const auto deadline = last_attempt_ + kConnectTimeout;
    int err = ETIMEDOUT;
    for (addrinfo* a = found; a && fd_ < 0; a = a->ai_next) {
      err = try_connect(*a, deadline);
    }
    freeaddrinfo(found);
    if (fd_ < 0) {
      warn("connect", err);
    } else if (failing_) {
      recovered();
    }
  }

  // Connects fd_ to `a` before `deadline`; returns 0 or the errno that stopped it.
  int try_connect(const addrinfo& a, SteadyClock::time_point deadline) {
    const int fd = socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol);
    if (fd < 0) return errno;
    int err = 0;
    if (connect(fd, a.ai_addr, a.ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - SteadyClock::now());
        pollfd p{fd, POLLOUT, 0};
        const int ready = left.count() > 0 ? poll(&p, 1, static_cast<int>(left.count())) : 0;
        socklen_t len = sizeof(err);
        if (ready <= 0) {
          err = ready == 0 ? ETIMEDOUT : errno;
        } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
    }
    if (err != 0) {
      close(fd);
      return err;
    }
    fd_ = fd;
    return 0;
  }

  void disconnect() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    pending_.clear();  // a half line must not start the next connection
  }

  void warn(const char* what, int err) { warn_text(fmt::format("{} failed: {}", what, std::strerror(err))); }

  // One line per outage, not per dropped line: a week-long run must not flood its log.
  void warn_text(const std::string& reason) {
    const auto now = SteadyClock::now();
    if (failing_ && (tcp_ || now - last_warning_ < kUdpWarningInterval)) return;
    failing_ = true;
    last_warning_ = now;
    std::fprintf(stderr,
                 "jumbo: warning: log.emf_address = %s: %s; EMF lines are dropped (%lld so far) "
                 "until the agent takes them again%s\n",
                 address_.c_str(), reason.c_str(), static_cast<long long>(dropped_),
                 tcp_ ? " (reconnecting at most once a minute)" : "");
    std::fflush(stderr);
  }

  // TCP only: a connection after an outage. UDP has no such signal.
  void recovered() {
    failing_ = false;
    std::fprintf(stderr, "jumbo: log.emf_address = %s: sending again (%lld EMF lines dropped so far)\n",
                 address_.c_str(), static_cast<long long>(dropped_));
    std::fflush(stderr);
  }

  std::string address_, host_, port_;
  bool tcp_ = true;
  int fd_ = -1;
  std::string pending_;
  SteadyClock::time_point last_attempt_, last_warning_;
  bool failing_ = false;
  int64_t dropped_ = 0;
};

EmfLog::EmfLog(const LogConfig& log, std::string run_name, std::string layout)
    : namespace_(log.emf_namespace),
      run_name_(std::move(run_name)),
      layout_(std::move(layout)),
      file_path_(log.emf_file) {
  // CloudWatch refuses a dimension value that is empty, blank, longer than 1024 characters
  // or not ASCII; say so before training rather than lose every metric silently.
  bool printable = run_name_.find_first_not_of(' ') != std::string::npos;
  for (unsigned char c : run_name_) printable = printable && c >= 0x20 && c < 0x7f;
  if (!printable || run_name_.size() > 1024) {
    throw UserError(fmt::format("log.run_name = \"{}\": expected 1 to 1024 printable ASCII "
                                "characters (the RunName dimension of the EMF metrics)",
                                run_name_));
  }
  if (!file_path_.empty()) {
    const std::filesystem::path file(file_path_);
    if (file.has_parent_path()) {
      std::error_code ignored;  // a failure shows up as the fopen error, which names the path
      std::filesystem::create_directories(file.parent_path(), ignored);
    }
    file_ = std::fopen(file_path_.c_str(), "a");  // the agent tails it; a resumed run appends
    if (!file_) {
      throw UserError(fmt::format("log.emf_file = {}: cannot open for writing: {}", file_path_,
                                  std::strerror(errno)));
    }
  }
  if (!log.emf_address.empty()) socket_ = std::make_unique<EmfSocket>(log.emf_address);
}

EmfLog::~EmfLog() {
  if (file_) std::fclose(file_);
}

int64_t EmfLog::dropped() const { return socket_ ? socket_->dropped() : 0; }

void EmfLog::write(const StepMetrics& m) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
  const std::string line = emf_line(m, namespace_, run_name_, layout_, ms) + '\n';
  if (file_ &&
      (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)) {
    throw UserError(fmt::format("log.emf_file = {}: write failed: {}", file_path_, std::strerror(errno)));
  }
  if (socket_) socket_->send_line(line);
}

}  // namespace jumbo
