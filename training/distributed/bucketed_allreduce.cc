// Gradient averaging in buckets overlapped with the backward pass (see
// bucketed_allreduce.h).
#include "training/distributed/bucketed_allreduce.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "graph/status.h"

namespace castor::distributed {

using Clock = std::chrono::steady_clock;

BucketedAllreduce::BucketedAllreduce(Communicator& communicator, size_t bucket_bytes)
    : communicator_(communicator),
      bucket_bytes_(bucket_bytes == 0 ? std::numeric_limits<size_t>::max() : bucket_bytes) {
  worker_ = std::thread([this] { Work(); });
}

BucketedAllreduce::~BucketedAllreduce() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.clear();  // a step that failed midway: its other buckets are not sent
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void BucketedAllreduce::BeginStep(std::string what) {
  {
    // A step that failed before its Finish may have buckets in flight:
    // their memory is reused below.
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return done_ == launched_; });
  }
  step_ = std::move(what);
  for (std::unique_ptr<Bucket>& bucket : buckets_) bucket->values.clear();
  std::fill(locations_.begin(), locations_.end(), Location{});
  current_ = 0;
  launched_ = 0;
  bytes_ = 0;
  wait_seconds_ = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = 0;
  failure_ = absl::OkStatus();
  busy_seconds_ = 0;
}

bool BucketedAllreduce::Added(int key) const {
  return key >= 0 && static_cast<size_t>(key) < locations_.size() &&
         locations_[static_cast<size_t>(key)].bucket >= 0;
}

size_t BucketedAllreduce::Capacity(int index) const {
  if (index == 0 && bucket_bytes_ != std::numeric_limits<size_t>::max()) {
    return std::min(kFirstBucketBytes, bucket_bytes_);
  }
  return bucket_bytes_;
}

absl::Status BucketedAllreduce::Add(int key, size_t count,
                                    const std::function<absl::Status(float*)>& fill) {
  if (key < 0) return absl::InternalError(absl::StrCat("gradient bucket key ", key));
  if (static_cast<size_t>(key) >= locations_.size()) locations_.resize(key + 1);
  if (Added(key)) {
    return absl::InternalError(absl::StrCat("value ", key, " added twice to the buckets of ", step_));
  }
  if (static_cast<size_t>(current_) == buckets_.size()) {
    buckets_.push_back(std::make_unique<Bucket>());
  }
  std::vector<float>& values = buckets_[static_cast<size_t>(current_)]->values;
  const size_t offset = values.size();
  values.resize(offset + count);
  CASTOR_RETURN_IF_ERROR(fill(values.data() + offset));
  locations_[static_cast<size_t>(key)] = Location{current_, offset, count};
  bytes_ += static_cast<int64_t>(count * sizeof(float));
  if (values.size() * sizeof(float) >= Capacity(current_)) Launch();
  return absl::OkStatus();
}

void BucketedAllreduce::Launch() {
  if (static_cast<size_t>(current_) >= buckets_.size()) return;
  std::vector<float>& values = buckets_[static_cast<size_t>(current_)]->values;
  if (values.empty()) return;
  float* data = values.data();
  const size_t count = values.size();
  std::string what = absl::StrCat("the loss and gradients of ", step_, ", bucket ", current_ + 1);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Queued{[this, data, count, what = std::move(what)] {
      return communicator_.AllreduceAverage(data, count, what);
    }});
  }
  changed_.notify_all();
  ++current_;
  ++launched_;
}

absl::Status BucketedAllreduce::SumNow(double* values, size_t count, const std::string& what) {
  bool finished = false;
  absl::Status result;
  std::unique_lock<std::mutex> lock(mutex_);
  queue_.push_back(Queued{[this, values, count, &what] {
                            return communicator_.AllreduceSum(values, count, what);
                          },
                          &finished, &result});
  changed_.notify_all();
  changed_.wait(lock, [&] { return finished; });
  return result;
}

absl::Status BucketedAllreduce::Finish() {
  Launch();
  const Clock::time_point started = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return done_ == launched_; });
  wait_seconds_ = std::chrono::duration<double>(Clock::now() - started).count();
  return failure_;
}

const float* BucketedAllreduce::Averaged(int key, size_t* count) const {
  if (!Added(key)) return nullptr;
  const Location& location = locations_[static_cast<size_t>(key)];
  *count = location.count;
  return buckets_[static_cast<size_t>(location.bucket)]->values.data() + location.offset;
}

double BucketedAllreduce::allreduce_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_seconds_;
}

void BucketedAllreduce::Work() {
  while (true) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    Queued job = std::move(queue_.front());
    queue_.pop_front();
    // After a failure (a rank died: each collective would wait out the
    // timeout) the step's other collectives are not sent.
    const absl::Status earlier = failure_;
    lock.unlock();
    absl::Status sent = earlier;
    double seconds = 0;
    if (earlier.ok()) {
      const Clock::time_point started = Clock::now();
      sent = job.run();
      seconds = std::chrono::duration<double>(Clock::now() - started).count();
    }
    lock.lock();
    if (!sent.ok() && failure_.ok()) failure_ = sent;
    if (job.finished != nullptr) {
      *job.result = sent;
      *job.finished = true;
    } else {
      busy_seconds_ += seconds;
      ++done_;
    }
    lock.unlock();
    changed_.notify_all();
  }
}

}  // namespace castor::distributed
