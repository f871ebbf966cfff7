// The Communicator on Gloo (libgloo-dev) over TCP, for the CPU backend.
//
// Rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT (so a port in use
// is found at once), every other rank connects there and says who it is
// (rank, world size); rank 0 checks that the ranks are distinct and agree
// on the world size and answers each. Over those same connections the
// ranks then exchange their Gloo addresses through rank 0's key-value store
// (rendezvous_store.h: nothing shared between hosts but the port) and
// connect Gloo's TCP pairs (a full mesh). Collectives run with the timeout,
// so a rank that died or hangs fails its peers' next collective.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "training/distributed/communicator.h"
#include "training/distributed/rendezvous_store.h"
#include "training/distributed/socket_io.h"

namespace castor::distributed {
namespace {

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
  char reason[160] = {};
};

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

// Rank 0: listens, takes one Hello from every other rank, answers them all,
// and keeps their connections for the key-value store (index = rank).
absl::StatusOr<std::vector<Socket>> HostRendezvous(const DistributedConfig& config) {
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
  std::vector<Socket> peers;  // in the order they came
  std::vector<int> peer_ranks;
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
    peer_ranks.push_back(hello.rank);
    if (!refusal.empty()) break;
  }
  Welcome welcome;
  welcome.accepted = refusal.empty() ? 1 : 0;
  std::snprintf(welcome.reason, sizeof(welcome.reason), "%s", refusal.c_str());
  for (const Socket& peer : peers) SendAll(peer.fd(), &welcome, sizeof(welcome));
  if (!refusal.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "bad group: ", refusal));
  }
  std::vector<Socket> by_rank(static_cast<size_t>(config.world_size));
  for (size_t k = 0; k < peers.size(); ++k) {
    by_rank[static_cast<size_t>(peer_ranks[k])] = std::move(peers[k]);
  }
  return by_rank;
}

// Other ranks: reach rank 0 (retrying until the deadline), be accepted, and
// keep the connection for the key-value store.
absl::StatusOr<Socket> JoinRendezvous(const DistributedConfig& config) {
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
      return socket_to_master;
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
  std::string engine() const override { return "Gloo"; }

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
  absl::StatusOr<std::vector<Socket>> peers;  // rank 0
  absl::StatusOr<Socket> master;              // the other ranks
  if (config.rank == 0) {
    peers = HostRendezvous(config);
    if (!peers.ok()) return peers.status();
  } else {
    master = JoinRendezvous(config);
    if (!master.ok()) return master.status();
  }
  try {
    const Clock::time_point deadline = Clock::now() + config.timeout;
    std::unique_ptr<RendezvousStore> store =
        config.rank == 0 ? RendezvousStore::Host(config, std::move(*peers), deadline)
                         : RendezvousStore::Join(config, std::move(*master), deadline);
    gloo::transport::tcp::attr attr;
    if (IsLoopback(config.master_addr)) attr.hostname = "127.0.0.1";
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(config.rank, config.world_size);
    context->setTimeout(config.timeout);
    context->connectFullMesh(*store, device);
    if (absl::Status finished = store->Finish(); !finished.ok()) return finished;
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(config, std::move(context)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(prefix, "connecting the Gloo TCP pairs failed: ", e.what()));
  }
}

}  // namespace castor::distributed
