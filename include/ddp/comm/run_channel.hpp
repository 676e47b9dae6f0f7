#pragma once
// The line protocol between ddp-run and its workers (docs/elastic.md, "Processes"): one TCP
// connection per worker, messages of tab-separated fields ended by a newline.
//
//   worker -> ddp-run   hello <rank> <world> <pid> <membership>
//                       left <trainer> <steps> <whole 0|1> <file> <checkpoint steps> <checkpoint dir>
//                       saved                 every trainer of this rank left its state or ended
//                       failed <reason>       this rank gave up (its own error)
//                       step <steps>          the first step from handed-over state completed
//                       bye                   the program ended normally
//   ddp-run -> worker   peer_failed <rank> <reason>
//
// A connection that closes before `saved` or `bye` is a worker that died (a signal, a crash).
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp::run {

// The environment ddp-run gives its workers.
inline constexpr const char* address_variable = "DDP_RUN_ADDRESS";        // host:port of ddp-run
inline constexpr const char* state_variable = "DDP_RUN_STATE";            // where this membership leaves its state
inline constexpr const char* resume_variable = "DDP_RUN_RESUME";          // what it starts from (after a failure)
inline constexpr const char* membership_variable = "DDP_RUN_MEMBERSHIP";  // 0, 1, ...: restarts so far

inline std::vector<std::string> fields(std::string_view line) {
  std::vector<std::string> out;
  for (;;) {
    const auto tab = line.find('\t');
    out.emplace_back(line.substr(0, tab));
    if (tab == std::string_view::npos) return out;
    line.remove_prefix(tab + 1);
  }
}
inline std::string join(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (auto p : parts) {
    if (!out.empty()) out += '\t';
    for (char c : p) out += c == '\t' || c == '\n' ? ' ' : c;
  }
  return out;
}

// One connection: whole lines out, lines in as they arrive.
class channel {
 public:
  channel() = default;
  explicit channel(int fd) : fd_(fd) {}
  channel(channel&& o) noexcept : fd_(std::exchange(o.fd_, -1)), in_(std::move(o.in_)) {}
  channel& operator=(channel&& o) noexcept {
    if (this != &o) close(), fd_ = std::exchange(o.fd_, -1), in_ = std::move(o.in_);
    return *this;
  }
  ~channel() { close(); }
  int fd() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  // Sends one line; false when the peer is gone.
  bool send(std::string_view line) {
    std::string out(line);
    out += '\n';
    std::size_t sent = 0;
    while (sent < out.size()) {
      const ssize_t n = ::send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }
  // Reads what has arrived (blocking until something has); false at the end of the stream.
  bool receive() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      in_.append(buf, static_cast<std::size_t>(n));
      return true;
    }
  }
  // The next complete line received, if any.
  std::optional<std::string> next_line() {
    const auto nl = in_.find('\n');
    if (nl == std::string::npos) return std::nullopt;
    std::string line = in_.substr(0, nl);
    in_.erase(0, nl + 1);
    return line;
  }
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string in_;
};

// Connects to "host:port".
inline channel connect_to(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos)
    throw error("run", "connect", -1, std::string(address_variable) + "='" + address + "' is not host:port");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw error("run", "connect", -1, "cannot resolve ddp-run's address '" + address + "': " + gai_strerror(rc));
  int last = 0;
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ::freeaddrinfo(found);
      return channel(fd);
    }
    last = errno;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw error("run", "connect", -1,
              "cannot reach ddp-run at " + address + ": " + std::strerror(last) + " (is ddp-run still running?)");
}

}  // namespace ddp::run
