// A data-parallel step's gradient averaging in buckets, overlapped with the
// backward pass (PyTorch DDP's gradient buckets): the trainer hands over
// each gradient as soon as its node has run (Executor::SetOutputObserver);
// once a bucket holds enough bytes, a thread of its own all-reduces it
// while the next nodes run. After the backward pass the trainer adds what
// is left, Finish sends the last bucket and waits, and Averaged gives each
// gradient's average.
//
// Every rank runs the same graph with the same plan, so the gradients
// arrive in the same order everywhere, and so do the buckets and their
// allreduces: no negotiation is needed. The step's other collectives (the
// sums of synchronised BatchNormalization) go through the same thread with
// SumNow, so that every rank issues all of them in one order. The first bucket is small (1 MiB,
// as in DDP) so that communication starts early; the others hold
// `bucket_bytes`. bucket_bytes 0 makes one bucket of everything: with
// nothing added before the backward pass ends, one allreduce after it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "training/distributed/communicator.h"

namespace castor::distributed {

class BucketedAllreduce {
 public:
  static constexpr size_t kFirstBucketBytes = size_t{1} << 20;

  // `communicator` must outlive this object; bucket_bytes 0: one bucket.
  BucketedAllreduce(Communicator& communicator, size_t bucket_bytes);
  ~BucketedAllreduce();
  BucketedAllreduce(const BucketedAllreduce&) = delete;
  BucketedAllreduce& operator=(const BucketedAllreduce&) = delete;

  // Starts a step; `what` names it in errors ("step 12").
  void BeginStep(std::string what);
  // Whether `key` was added this step.
  bool Added(int key) const;
  // Appends `count` float32 values under `key` (a small non-negative id;
  // each at most once a step): `fill` writes them to the pointer it gets.
  // A bucket that reaches its size starts its allreduce.
  absl::Status Add(int key, size_t count, const std::function<absl::Status(float*)>& fill);
  // Sums `count` doubles across the ranks in place, after the buckets
  // queued so far, and waits for it (`what` names them in errors).
  absl::Status SumNow(double* values, size_t count, const std::string& what);
  // Sends the last bucket and waits until every allreduce of the step is
  // done; the first failure, naming the step and bucket.
  absl::Status Finish();
  // After Finish: the average of `key`'s values over the ranks (nullptr
  // when it was not added), `count` of them.
  const float* Averaged(int key, size_t* count) const;

  // This step: bytes all-reduced, buckets, seconds spent in allreduce
  // calls (on the communication thread, overlapping the backward pass), and
  // seconds Finish waited for them.
  int64_t bytes() const { return bytes_; }
  int buckets() const { return launched_; }
  double allreduce_seconds() const;
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Bucket {
    std::vector<float> values;
  };
  // A collective handed to the communication thread: a bucket's
  // allreduce, or a SumNow whose caller waits for `finished`.
  struct Queued {
    std::function<absl::Status()> run;
    bool* finished = nullptr;       // SumNow's: set when done
    absl::Status* result = nullptr;  // SumNow's
  };
  struct Location {
    int bucket = -1;  // -1: not added this step
    size_t offset = 0;
    size_t count = 0;
  };
  // The bytes after which bucket `index` is sent.
  size_t Capacity(int index) const;
  // Queues the current bucket, if it holds anything, for the
  // communication thread.
  void Launch();
  void Work();  // the communication thread

  Communicator& communicator_;
  const size_t bucket_bytes_;
  std::string step_;
  // Reused from step to step; by pointer, so that adding a bucket never
  // moves one the communication thread reads.
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<Location> locations_;  // by key
  int current_ = 0;   // the bucket being filled
  int launched_ = 0;  // buckets queued this step
  int64_t bytes_ = 0;
  double wait_seconds_ = 0;

  std::thread worker_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Queued> queue_;   // guarded by mutex_: buckets to all-reduce
  int done_ = 0;               // guarded by mutex_: buckets finished this step
  absl::Status failure_;       // guarded by mutex_: the first failed allreduce
  double busy_seconds_ = 0;    // guarded by mutex_
  bool stopping_ = false;      // guarded by mutex_
};

}  // namespace castor::distributed
