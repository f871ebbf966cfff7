// Gloo's key-value store kept by rank 0 and reached over the rendezvous
// connections (see rendezvous_store.h).
#include "training/distributed/rendezvous_store.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"

namespace castor::distributed {
namespace {

constexpr uint32_t kFrameMagic = 0x4353544b;  // "CSTK"
// Gloo's keys are short names; its values, one address per peer (about a
// hundred bytes each), stay far below this for any group size.
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = uint64_t{64} << 20;

enum class Op : uint32_t { kSet = 1, kGet = 2, kDone = 3, kValue = 4 };

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t op = 0;
  uint32_t key_bytes = 0;
  uint32_t reserved = 0;
  uint64_t value_bytes = 0;
};

bool SendFrame(int fd, Op op, const std::string& key, const std::vector<char>& value) {
  FrameHeader header;
  header.op = static_cast<uint32_t>(op);
  header.key_bytes = static_cast<uint32_t>(key.size());
  header.value_bytes = value.size();
  return SendAll(fd, &header, sizeof(header)) && SendAll(fd, key.data(), key.size()) &&
         SendAll(fd, value.data(), value.size());
}

// Reads one frame; an error message when the peer is gone, late or sent
// something that is no frame of ours (sizes checked before allocating).
std::string ReceiveFrame(int fd, Clock::time_point deadline, Op* op, std::string* key,
                         std::vector<char>* value) {
  FrameHeader header;
  if (!ReceiveAll(fd, &header, sizeof(header), deadline)) return "closed the connection";
  if (header.magic != kFrameMagic || header.op < 1 || header.op > 4 ||
      header.key_bytes > kMaxKeyBytes || header.value_bytes > kMaxValueBytes) {
    return absl::StrFormat(
        "sent a malformed rendezvous frame (op %u, key of %u bytes, value of %u bytes; at most "
        "%u and %u)",
        header.op, header.key_bytes, header.value_bytes, kMaxKeyBytes, kMaxValueBytes);
  }
  *op = static_cast<Op>(header.op);
  key->assign(header.key_bytes, '\0');
  value->assign(header.value_bytes, '\0');
  if (!ReceiveAll(fd, key->data(), key->size(), deadline) ||
      !ReceiveAll(fd, value->data(), value->size(), deadline)) {
    return "closed the connection in the middle of a frame";
  }
  return "";
}

}  // namespace

RendezvousStore::RendezvousStore(const DistributedConfig& config, Clock::time_point deadline)
    : config_(config), deadline_(deadline) {}

std::unique_ptr<RendezvousStore> RendezvousStore::Host(const DistributedConfig& config,
                                                       std::vector<Socket> peers,
                                                       Clock::time_point deadline) {
  std::unique_ptr<RendezvousStore> store(new RendezvousStore(config, deadline));
  store->peers_ = std::move(peers);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    store->Throw(absl::StrCat("cannot create the rendezvous store's pipe: ", std::strerror(errno)));
  }
  store->wake_read_ = Socket(pipe_fds[0]);
  store->wake_write_ = Socket(pipe_fds[1]);
  store->server_ = std::thread([raw = store.get()] { raw->Serve(); });
  return store;
}

std::unique_ptr<RendezvousStore> RendezvousStore::Join(const DistributedConfig& config,
                                                       Socket master,
                                                       Clock::time_point deadline) {
  std::unique_ptr<RendezvousStore> store(new RendezvousStore(config, deadline));
  store->master_ = std::move(master);
  return store;
}

RendezvousStore::~RendezvousStore() {
  if (server_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    Wake();
    server_.join();
  }
}

void RendezvousStore::Throw(const std::string& message) const {
  throw gloo::IoException(absl::StrCat(RankPrefix(config_.rank, config_.world_size), message));
}

void RendezvousStore::Wake() {
  const char byte = 1;
  [[maybe_unused]] ssize_t written = write(wake_write_.fd(), &byte, 1);  // full pipe: awake anyway
}

void RendezvousStore::Fail(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_.empty()) error_ = message;
  changed_.notify_all();
}

void RendezvousStore::Serve() {
  const size_t ranks = static_cast<size_t>(config_.world_size);
  std::vector<bool> done(ranks, false);
  done[0] = true;
  size_t remaining = ranks - 1;
  std::vector<std::pair<size_t, std::string>> pending_gets;  // rank, key
  std::vector<pollfd> polled;
  std::vector<size_t> polled_rank;
  while (remaining > 0 || !pending_gets.empty()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    polled.assign(1, pollfd{wake_read_.fd(), POLLIN, 0});
    polled_rank.assign(1, 0);
    for (size_t r = 1; r < ranks; ++r) {
      if (done[r]) continue;
      polled.push_back(pollfd{peers_[r].fd(), POLLIN, 0});
      polled_rank.push_back(r);
    }
    const int ready = poll(polled.data(), polled.size(), MillisecondsLeft(deadline_));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      std::vector<size_t> late;
      for (size_t r = 1; r < ranks; ++r) {
        if (!done[r]) late.push_back(r);
      }
      Fail(absl::StrFormat("rank(s) %s did not finish the rendezvous within %.0f s",
                           absl::StrJoin(late, ", "), config_.timeout.count() / 1000.0));
      return;
    }
    if (polled[0].revents != 0) {
      char drained[64];
      while (read(wake_read_.fd(), drained, sizeof(drained)) > 0) {
      }
    }
    for (size_t k = 1; k < polled.size(); ++k) {
      if (polled[k].revents == 0) continue;
      const size_t rank = polled_rank[k];
      Op op;
      std::string key;
      std::vector<char> value;
      const std::string fault = ReceiveFrame(peers_[rank].fd(), deadline_, &op, &key, &value);
      if (!fault.empty()) {
        Fail(absl::StrCat("rank ", rank, " ", fault, " during the rendezvous"));
        return;
      }
      if (op == Op::kSet) {
        std::lock_guard<std::mutex> lock(mutex_);
        values_[key] = std::move(value);
        changed_.notify_all();
      } else if (op == Op::kGet) {
        pending_gets.emplace_back(rank, std::move(key));
      } else if (op == Op::kDone) {
        done[rank] = true;
        --remaining;
      } else {
        Fail(absl::StrCat("rank ", rank, " sent an answer frame to rank 0"));
        return;
      }
    }
    // Answer every request whose key some rank has set by now.
    for (size_t k = 0; k < pending_gets.size();) {
      std::vector<char> value;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto found = values_.find(pending_gets[k].second);
        if (found == values_.end()) {
          ++k;
          continue;
        }
        value = found->second;
      }
      const size_t rank = pending_gets[k].first;
      if (!SendFrame(peers_[rank].fd(), Op::kValue, "", value)) {
        Fail(absl::StrCat("rank ", rank, " closed the connection during the rendezvous"));
        return;
      }
      pending_gets.erase(pending_gets.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
}

std::vector<char> RendezvousStore::WaitForKey(const std::string& key,
                                              Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_until(lock, deadline,
                      [&] { return values_.count(key) != 0 || !error_.empty(); });
  if (auto found = values_.find(key); found != values_.end()) return found->second;
  if (!error_.empty()) Throw(error_);
  Throw(absl::StrFormat("no rank published the rendezvous key '%s' within %.0f s", key,
                        config_.timeout.count() / 1000.0));
}

void RendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  if (key.size() > kMaxKeyBytes || data.size() > kMaxValueBytes) {
    Throw(absl::StrCat("rendezvous key '", key.substr(0, 64), "' or its value is too large"));
  }
  if (config_.rank == 0) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      values_[key] = data;
      changed_.notify_all();
    }
    Wake();  // the thread answers the requests that waited for this key
    return;
  }
  if (!SendFrame(master_.fd(), Op::kSet, key, data)) {
    Throw(absl::StrCat("rank 0 (", config_.master_addr, ":", config_.master_port,
                       ") closed the rendezvous connection"));
  }
}

std::vector<char> RendezvousStore::get(const std::string& key) {
  if (config_.rank == 0) return WaitForKey(key, deadline_);
  if (!SendFrame(master_.fd(), Op::kGet, key, {})) {
    Throw(absl::StrCat("rank 0 (", config_.master_addr, ":", config_.master_port,
                       ") closed the rendezvous connection"));
  }
  Op op;
  std::string answer_key;
  std::vector<char> value;
  const std::string fault = ReceiveFrame(master_.fd(), deadline_, &op, &answer_key, &value);
  if (!fault.empty() || op != Op::kValue) {
    Throw(absl::StrFormat(
        "rank 0 gave no value for the rendezvous key '%s' within %.0f s (%s): did a rank fail "
        "to start?",
        key, config_.timeout.count() / 1000.0,
        fault.empty() ? "it answered with another frame" : fault));
  }
  return value;
}

void RendezvousStore::wait(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) get(key);
}

void RendezvousStore::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& /*timeout: the group's own applies*/) {
  wait(keys);
}

absl::Status RendezvousStore::Finish() {
  if (config_.rank != 0) {
    if (!SendFrame(master_.fd(), Op::kDone, "", {})) {
      return absl::UnavailableError(absl::StrCat(RankPrefix(config_.rank, config_.world_size),
                                                 "rank 0 closed the rendezvous connection"));
    }
    return absl::OkStatus();
  }
  server_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(RankPrefix(config_.rank, config_.world_size), error_));
}

}  // namespace castor::distributed
