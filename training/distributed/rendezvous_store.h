// Gloo's key-value store (gloo::rendezvous::Store) kept by rank 0 and reached
// over the rendezvous connections: the ranks publish and read their Gloo
// pair addresses through rank 0, so a group spread over several hosts needs
// nothing but MASTER_ADDR:MASTER_PORT (no shared directory, no Redis), as
// torchrun's TCP store does for PyTorch.
//
// Rank 0 holds the keys; a thread of its own answers the other ranks'
// requests (set; get, answered once the key exists; done) until every rank
// has said done. Requests and answers are length-prefixed frames whose sizes
// are checked before anything is allocated. A rank that disconnects, or a
// deadline that passes, throws gloo::IoException naming the rank (Gloo's
// connectFullMesh passes it on; Connect turns it into a status).
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gloo/rendezvous/store.h"
#include "training/distributed/communicator.h"
#include "training/distributed/socket_io.h"

namespace castor::distributed {

class RendezvousStore : public gloo::rendezvous::Store {
 public:
  // Rank 0: `peers[r]` is the connection to rank r (peers[0] is unused).
  static std::unique_ptr<RendezvousStore> Host(const DistributedConfig& config,
                                               std::vector<Socket> peers,
                                               Clock::time_point deadline);
  // Any other rank: `master` is its connection to rank 0.
  static std::unique_ptr<RendezvousStore> Join(const DistributedConfig& config, Socket master,
                                               Clock::time_point deadline);
  ~RendezvousStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // Once this rank has read what it needs: other ranks tell rank 0 so; rank
  // 0 answers until every rank has, then stops its thread. An error names
  // the rank that disconnected or did not finish before the deadline.
  absl::Status Finish();

 private:
  RendezvousStore(const DistributedConfig& config, Clock::time_point deadline);
  // Rank 0's thread: reads the peers' frames and answers them.
  void Serve();
  // Rank 0: the value of `key` once some rank has set it (throws at the
  // deadline or when the thread stopped with an error).
  std::vector<char> WaitForKey(const std::string& key, Clock::time_point deadline);
  // Rank 0's thread: records the first error and wakes the waiting calls.
  void Fail(const std::string& message);
  void Wake();
  [[noreturn]] void Throw(const std::string& message) const;

  const DistributedConfig config_;
  const Clock::time_point deadline_;
  // Rank 0.
  std::vector<Socket> peers_;
  Socket wake_read_, wake_write_;  // a pipe that interrupts the thread's poll
  std::thread server_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;  // guarded by mutex_
  std::string error_;                                 // guarded by mutex_
  bool stopping_ = false;                             // guarded by mutex_
  // Other ranks.
  Socket master_;
};

}  // namespace castor::distributed
