// Data-parallel training's collectives (issue #31): one small interface
// (average float32 buffers, sum a few scalars, broadcast, barrier) that the
// trainer calls between the backward pass and the optimizer, implemented
// by an existing collective library only: Gloo over TCP for the CPU
// backend (gloo_communicator.cc, built where CMake finds libgloo-dev).
// A backend with collectives in its own memory (NCCL on CUDA,
// backend/device_collectives.h) averages the gradients itself; the
// communicator then only forms that group (device_group.h) and carries
// the run's host-side collectives (agreement checks, evaluation sums).
//
// A run joins a group from torchrun-style environment variables: RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT (`castor train --nproc N` sets them
// for N local processes), or from those an MPI launcher sets (`mpirun -np N
// castor train ...`: Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_*). Without
// them a run is alone (world size 1): no communicator, no library, today's
// behaviour exactly.
//
// Every error names this process's rank ("rank 1 of 2: ..."); a peer that
// died or stopped answering fails the collective within the timeout
// instead of hanging.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace castor::distributed {

// Where this process stands in its group and how to reach rank 0.
struct DistributedConfig {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // How long a rendezvous or a collective may wait for the other ranks.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // This rank's place among the ranks on its host (a GPU run gives each
  // its own device); without the launcher's variables, the group is taken
  // to be one host (local_rank = rank, local_world_size = world_size), and
  // with a local size but no local rank, ranks placed host by host
  // (local_rank = rank % local_world_size).
  int local_rank = 0;
  int local_world_size = 1;
};

// The environment variables that make a run one rank of a group.
inline constexpr char kRankEnv[] = "RANK";
inline constexpr char kWorldSizeEnv[] = "WORLD_SIZE";
inline constexpr char kMasterAddrEnv[] = "MASTER_ADDR";
inline constexpr char kMasterPortEnv[] = "MASTER_PORT";
// MASTER_PORT where an MPI launcher started the ranks and it is unset
// (torchrun's default port).
inline constexpr int kDefaultMasterPort = 29500;

// A program that starts ranks, and the variables it tells each its place by.
struct Launcher {
  const char* name;
  const char* rank_variable;
  const char* world_size_variable;
  // This rank's index and the number of ranks on this host.
  const char* local_rank_variable;
  const char* local_size_variable;
  // MASTER_PORT when unset, or 0: MASTER_PORT is required.
  int default_master_port;
};
// torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), Open MPI's
// mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE) and
// MPICH's/Intel MPI's Hydra mpiexec (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
// MPI_LOCALNRANKS), in the order ConfigFromEnvironment looks for them.
const std::vector<Launcher>& Launchers();

// Reads the first launcher's rank and world size that are set, MASTER_ADDR
// (default 127.0.0.1) and MASTER_PORT (default 29500 under MPI) through
// `lookup` (getenv by default; nullptr for an unset variable). nullopt when
// no launcher's variables are set (a run on its own), and for a world size
// of 1. InvalidArgument naming the variable and what was expected when one
// of rank and world size is set without the other, a value is no integer,
// the rank is not in [0, world size), the local rank is not in [0, local
// size), a group of several has no MASTER_PORT in [1, 65535], or the ranks
// span several hosts (local size below the world size) without MASTER_ADDR.
absl::StatusOr<std::optional<DistributedConfig>> ConfigFromEnvironment(
    std::chrono::milliseconds timeout,
    const std::function<const char*(const char*)>& lookup = nullptr);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The library behind it, for summaries: "Gloo".
  virtual std::string engine() const = 0;

  // data[i] = (sum over ranks of data[i]) / world_size, in place; every
  // rank ends with the same bits. inf and NaN propagate (an overflow on
  // any rank is an overflow on all). `what` names the buffer in errors.
  virtual absl::Status AllreduceAverage(float* data, size_t count, const std::string& what) = 0;
  // values[i] = sum over ranks of values[i], in place (flags, counts, losses).
  virtual absl::Status AllreduceSum(double* values, size_t count, const std::string& what) = 0;
  // Every rank gets root's `bytes` bytes at `data`.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root, const std::string& what) = 0;
  // Returns once every rank has called it.
  virtual absl::Status Barrier(const std::string& what) = 0;
};

// Whether this castor was built with a collective library (Gloo).
bool CollectivesAvailable();

// Joins the group `config` describes: rank 0 listens on MASTER_ADDR:
// MASTER_PORT (a port in use is InvalidArgument naming it), every rank
// meets it there within the timeout, and the Gloo TCP pairs are connected.
// Unimplemented when castor was built without Gloo. Errors name the rank.
absl::StatusOr<std::unique_ptr<Communicator>> Connect(const DistributedConfig& config);

// "rank 1 of 2: " for messages.
std::string RankPrefix(int rank, int world_size);

}  // namespace castor::distributed
