// The Communicator on Gloo (libgloo-dev) over TCP, for the CPU backend.
//
// Rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT (so a port in use
// is found at once), every other rank connects there and says who it is
// (rank, world size); rank 0 checks that the ranks are distinct and agree
// on the world size and answers each with a fresh session id. The ranks
// then exchange their Gloo addresses through a Gloo FileStore in a
// directory named after that id (CASTOR_RENDEZVOUS_DIR, default
// $TMPDIR/castor-rendezvous: local ranks, or hosts sharing that directory),
// so files of an earlier run on the same port are never read, and connect
// Gloo's TCP pairs (a full mesh). Collectives run with the timeout, so a
// rank that died or hangs fails its peers' next collective.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "training/distributed/communicator.h"

namespace castor::distributed {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHelloMagic = 0x43535452;  // "CSTR"

// What a rank sends rank 0, and what rank 0 answers.
struct Hello {
  uint32_t magic = kHelloMagic;
  int32_t rank = 0;
  int32_t world_size = 0;
};
struct Welcome {
  uint32_t magic = kHelloMagic;
  int32_t accepted = 0;  // 1, or 0 with `reason`
  uint64_t session = 0;
  char reason[160] = {};
};

// Closes a socket when it goes out of scope.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

int MillisecondsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Waits until `fd` is ready for `events`; false at the deadline.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    const int ready = poll(&p, 1, MillisecondsLeft(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool SendAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t sent = send(fd, p, bytes, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    p += sent;
    bytes -= static_cast<size_t>(sent);
  }
  return true;
}

bool ReceiveAll(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!WaitFor(fd, POLLIN, deadline)) return false;
    const ssize_t got = recv(fd, p, bytes, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    bytes -= static_cast<size_t>(got);
  }
  return true;
}

absl::StatusOr<sockaddr_in> ResolveMaster(const DistributedConfig& config,
                                          const std::string& prefix) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(config.master_addr.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "MASTER_ADDR=", config.master_addr,
                                                   ": no IPv4 address for that host"));
  }
  sockaddr_in address = *reinterpret_cast<sockaddr_in*>(found->ai_addr);
  freeaddrinfo(found);
  address.sin_port = htons(static_cast<uint16_t>(config.master_port));
  return address;
}

std::string MasterName(const DistributedConfig& config) {
  return absl::StrCat(config.master_addr, ":", config.master_port);
}

// Rank 0: listens, takes one Hello from every other rank, answers them all.
absl::StatusOr<uint64_t> HostRendezvous(const DistributedConfig& config) {
  const std::string prefix = RankPrefix(config.rank, config.world_size);
  absl::StatusOr<sockaddr_in> address = ResolveMaster(config, prefix);
  if (!address.ok()) return address.status();
  Socket listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int on = 1;
  setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (bind(listener.fd(), reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) != 0 ||
      listen(listener.fd(), config.world_size) != 0) {
    const int error = errno;
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "cannot listen on MASTER_ADDR:MASTER_PORT ", MasterName(config), ": ",
        std::strerror(error),
        error == EADDRINUSE ? " (the port is in use: choose another MASTER_PORT)" : ""));
  }
  const Clock::time_point deadline = Clock::now() + config.timeout;
  std::vector<Socket> peers;
  std::vector<bool> joined(static_cast<size_t>(config.world_size), false);
  joined[0] = true;
  std::string refusal;
  while (static_cast<int>(peers.size()) < config.world_size - 1) {
    if (!WaitFor(listener.fd(), POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < config.world_size; ++r) {
        if (!joined[static_cast<size_t>(r)])
          absl::StrAppend(&missing, missing.empty() ? "" : ", ", r);
      }
      return absl::InvalidArgumentError(absl::StrFormat(
          "%srank(s) %s did not join at %s within %.0f s (WORLD_SIZE=%d: are they all started?)",
          prefix, missing, MasterName(config), config.timeout.count() / 1000.0, config.world_size));
    }
    Socket peer(accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.fd() < 0) continue;
    Hello hello;
    if (!ReceiveAll(peer.fd(), &hello, sizeof(hello), deadline) || hello.magic != kHelloMagic) {
      continue;  // not a castor rank: ignore it
    }
    if (hello.world_size != config.world_size) {
      refusal = absl::StrCat("rank ", hello.rank, " has WORLD_SIZE=", hello.world_size,
                             ", rank 0 has ", config.world_size);
    } else if (hello.rank <= 0 || hello.rank >= config.world_size ||
               joined[static_cast<size_t>(hello.rank)]) {
      refusal = absl::StrCat("two processes have RANK=", hello.rank);
    } else {
      joined[static_cast<size_t>(hello.rank)] = true;
    }
    peers.push_back(std::move(peer));
    if (!refusal.empty()) break;
  }
  Welcome welcome;
  std::random_device entropy;
  welcome.session = (static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^
                    static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                    static_cast<uint64_t>(getpid());
  welcome.accepted = refusal.empty() ? 1 : 0;
  std::snprintf(welcome.reason, sizeof(welcome.reason), "%s", refusal.c_str());
  for (const Socket& peer : peers) SendAll(peer.fd(), &welcome, sizeof(welcome));
  if (!refusal.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "bad group: ", refusal));
  }
  return welcome.session;
}

// Other ranks: reach rank 0 (retrying until the deadline) and get the session.
absl::StatusOr<uint64_t> JoinRendezvous(const DistributedConfig& config) {
  const std::string prefix = RankPrefix(config.rank, config.world_size);
  absl::StatusOr<sockaddr_in> address = ResolveMaster(config, prefix);
  if (!address.ok()) return address.status();
  const Clock::time_point deadline = Clock::now() + config.timeout;
  while (true) {
    Socket socket_to_master(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (connect(socket_to_master.fd(), reinterpret_cast<const sockaddr*>(&*address),
                sizeof(*address)) == 0) {
      Hello hello;
      hello.rank = config.rank;
      hello.world_size = config.world_size;
      Welcome welcome;
      if (!SendAll(socket_to_master.fd(), &hello, sizeof(hello)) ||
          !ReceiveAll(socket_to_master.fd(), &welcome, sizeof(welcome), deadline) ||
          welcome.magic != kHelloMagic) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, MasterName(config),
            " (MASTER_ADDR:MASTER_PORT) answered, but not as castor's rank 0 of this group "
            "(is the port in use by another program, or did rank 0 fail?)"));
      }
      if (welcome.accepted != 1) {
        welcome.reason[sizeof(welcome.reason) - 1] = '\0';
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "rank 0 refused the group: ", welcome.reason));
      }
      return welcome.session;
    }
    if (Clock::now() >= deadline) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%sno rank 0 at %s (MASTER_ADDR:MASTER_PORT) within %.0f s: is rank 0 started, "
          "and did it get that port?",
          prefix, MasterName(config), config.timeout.count() / 1000.0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0;
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const DistributedConfig& config, std::shared_ptr<gloo::Context> context)
      : config_(config), context_(std::move(context)) {}

  int rank() const override { return config_.rank; }
  int world_size() const override { return config_.world_size; }

  absl::Status AllreduceAverage(float* data, size_t count, const std::string& what) override {
    if (count == 0) return absl::OkStatus();
    try {
      gloo::AllreduceOptions options(context_);
      options.setOutput(data, count);
      options.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      options.setTag(NextTag());
      options.setTimeout(config_.timeout);
      gloo::allreduce(options);
    } catch (const std::exception& e) {
      return Failed("allreduce of " + what, e);
    }
    // The same division on every rank: the same bits everywhere.
    const float ranks = static_cast<float>(config_.world_size);
    for (size_t i = 0; i < count; ++i) data[i] /= ranks;
    return absl::OkStatus();
  }

  absl::Status AllreduceSum(double* values, size_t count, const std::string& what) override {
    if (count == 0) return absl::OkStatus();
    try {
      gloo::AllreduceOptions options(context_);
      options.setOutput(values, count);
      options.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
      options.setTag(NextTag());
      options.setTimeout(config_.timeout);
      gloo::allreduce(options);
    } catch (const std::exception& e) {
      return Failed("allreduce of " + what, e);
    }
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, size_t bytes, int root, const std::string& what) override {
    if (root < 0 || root >= config_.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(RankPrefix(config_.rank, config_.world_size),
                                                     "broadcast of ", what, " from rank ", root,
                                                     ": no such rank"));
    }
    if (bytes == 0) return absl::OkStatus();
    try {
      gloo::BroadcastOptions options(context_);
      options.setOutput(static_cast<uint8_t*>(data), bytes);
      options.setRoot(root);
      options.setTag(NextTag());
      options.setTimeout(config_.timeout);
      gloo::broadcast(options);
    } catch (const std::exception& e) {
      return Failed("broadcast of " + what, e);
    }
    return absl::OkStatus();
  }

  absl::Status Barrier(const std::string& what) override {
    try {
      gloo::BarrierOptions options(context_);
      options.setTag(NextTag());
      options.setTimeout(config_.timeout);
      gloo::barrier(options);
    } catch (const std::exception& e) {
      return Failed("barrier (" + what + ")", e);
    }
    return absl::OkStatus();
  }

 private:
  uint32_t NextTag() { return next_tag_++; }

  absl::Status Failed(const std::string& operation, const std::exception& e) const {
    return absl::UnavailableError(absl::StrFormat(
        "%s%s failed: %s (another rank stopped, or did not answer within %.0f s; its own "
        "error names it)",
        RankPrefix(config_.rank, config_.world_size), operation, e.what(),
        config_.timeout.count() / 1000.0));
  }

  DistributedConfig config_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 1;
};

}  // namespace

bool CollectivesAvailable() { return true; }

absl::StatusOr<std::unique_ptr<Communicator>> Connect(const DistributedConfig& config) {
  const std::string prefix = RankPrefix(config.rank, config.world_size);
  // A peer that died closes its sockets; Gloo's next write to one must
  // fail the collective (an error naming this rank), not raise SIGPIPE,
  // which would kill this rank without a word.
  signal(SIGPIPE, SIG_IGN);
  absl::StatusOr<uint64_t> session =
      config.rank == 0 ? HostRendezvous(config) : JoinRendezvous(config);
  if (!session.ok()) return session.status();
  const char* root = std::getenv("CASTOR_RENDEZVOUS_DIR");
  const std::filesystem::path directory =
      (root != nullptr && root[0] != '\0'
           ? std::filesystem::path(root)
           : std::filesystem::temp_directory_path() / "castor-rendezvous") /
      absl::StrFormat("%016x", *session);
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat(prefix,
                                                   "cannot create the rendezvous directory ",
                                                   directory.string(), ": ", error.message()));
  }
  try {
    gloo::transport::tcp::attr attr;
    if (IsLoopback(config.master_addr)) attr.hostname = "127.0.0.1";
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(directory.string());
    auto context = std::make_shared<gloo::rendezvous::Context>(config.rank, config.world_size);
    context->setTimeout(config.timeout);
    context->connectFullMesh(store, device);
    auto communicator = std::make_unique<GlooCommunicator>(config, std::move(context));
    // Every rank has read the store: its files can go.
    if (absl::Status met = communicator->Barrier("rendezvous"); !met.ok()) return met;
    if (config.rank == 0) std::filesystem::remove_all(directory, error);
    return std::unique_ptr<Communicator>(std::move(communicator));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(prefix, "connecting the Gloo TCP pairs failed: ", e.what()));
  }
}

}  // namespace castor::distributed
