// Blocking TCP helpers of the data-parallel rendezvous (gloo_communicator.cc,
// rendezvous_store.cc): a socket closed when it goes out of scope, and sends
// and receives that give up at a deadline instead of hanging on a peer that
// stopped answering.
#pragma once

#include <chrono>
#include <cstddef>
#include <utility>

namespace castor::distributed {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor; closes it when it goes out of scope.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Milliseconds from now to `deadline`, 0 once it has passed.
int MillisecondsLeft(Clock::time_point deadline);
// Waits until `fd` is ready for `events` (poll's); false at the deadline or
// on an error.
bool WaitFor(int fd, short events, Clock::time_point deadline);
// Sends all `bytes` (without SIGPIPE); false when the peer is gone.
bool SendAll(int fd, const void* data, size_t bytes);
// Receives exactly `bytes`; false when the peer closed, on an error or at
// the deadline.
bool ReceiveAll(int fd, void* data, size_t bytes, Clock::time_point deadline);

}  // namespace castor::distributed
