#pragma once
// Helpers for the S3 tests: a guard for environment variables and a tiny HTTP server that
// plays S3 or the EC2 metadata service in this process.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace jumbo::test {

// Sets or unsets variables for one test and puts the old values back.
class EnvGuard {
 public:
  void set(const char* name, const std::string& value) {
    save(name);
    ::setenv(name, value.c_str(), 1);
  }
  void unset(const char* name) {
    save(name);
    ::unsetenv(name);
  }
  ~EnvGuard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  void save(const char* name) {
    const char* v = std::getenv(name);
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// HTTP/1.1 on 127.0.0.1, one request per connection, answered by `handler`.
class TinyServer {
 public:
  struct Request {
    std::string method, target;               // target: path and query as sent
    std::map<std::string, std::string> headers;  // names in lower case
    std::string body;
  };
  struct Response {
    int status = 200;
    std::string body;
    std::vector<std::string> headers = {};
  };
  using Handler = std::function<Response(const Request&)>;

  explicit TinyServer(Handler handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      handle(c);
      ::close(c);
    }
  }
  static bool read_more(int c, std::string& buf) {
    char tmp[65536];
    const ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, static_cast<size_t>(n));
    return true;
  }
  static void send_all(int c, const std::string& s) {
    for (size_t off = 0; off < s.size();) {
      const ssize_t n = ::send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  void handle(int c) {
    std::string buf;
    size_t end;
    while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (!read_more(c, buf)) return;
    }
    Request req;
    size_t pos = buf.find("\r\n");
    const std::string first = buf.substr(0, pos);
    req.method = first.substr(0, first.find(' '));
    req.target = first.substr(first.find(' ') + 1, first.rfind(' ') - first.find(' ') - 1);
    while (pos < end) {
      const size_t next = buf.find("\r\n", pos + 2);
      const std::string line = buf.substr(pos + 2, next - pos - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& ch : name) ch = static_cast<char>(std::tolower(ch));
        req.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
      }
      pos = next;
    }
    const size_t length = req.headers.count("content-length")
                              ? std::stoul(req.headers["content-length"]) : 0;
    if (req.headers.count("expect")) send_all(c, "HTTP/1.1 100 Continue\r\n\r\n");
    req.body = buf.substr(end + 4);
    while (req.body.size() < length && read_more(c, req.body)) {
    }
    Response resp = handler_(req);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requests_.push_back(req);
    }
    std::string out = "HTTP/1.1 " + std::to_string(resp.status) + " X\r\nConnection: close\r\n" +
                      "Content-Length: " + std::to_string(resp.body.size()) + "\r\n";
    for (const auto& h : resp.headers) out += h + "\r\n";
    send_all(c, out + "\r\n" + resp.body);
  }

  Handler handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::vector<Request> requests_;
};

}  // namespace jumbo::test
