// Tests for data-parallel training (training/distributed/, issue #31) on
// the CPU with Gloo over loopback: the group configuration from the
// environment; DistributedSampler's shards; the Gloo communicator's
// collectives; two trainers as two ranks against one trainer on the whole
// batch (losses within 1e-6 relative and weights within 1e-5 after 20
// steps, the ranks' weights bitwise identical); an overflow on one rank
// skipping the step on both; the group of a backend's device collectives
// (NCCL's place, faked on the CPU backend over Gloo: its formation, a rank
// without them, a rank that cannot load them) and the trainer's device
// path against its host path; and `castor train` as ranks: --nproc 2
// against one process, rank-0-only output, the checkpoint's world size, a
// 2-rank resume continuing bit for bit, bad configurations (exit 2 on
// every rank), ranks that share nothing but the port, `mpirun -np 2`
// (Open MPI), and a killed or hung rank stopping the other within the
// timeout.
// The Gloo tests skip where castor was built without Gloo (Bazel).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/device_collectives.h"
#include "gmock/gmock.h"
#include "graph/json.h"
#include "graph/status.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"
#include "passes/autocast.h"
#include "passes/verifier.h"
#include "tests/cli_test_util.h"
#include "training/checkpoint.h"
#include "training/dataset.h"
#include "training/distributed/bucketed_allreduce.h"
#include "training/distributed/communicator.h"
#include "training/distributed/device_group.h"
#include "training/distributed/launcher.h"
#include "training/npy.h"
#include "training/trainer.h"
#include "training/training_backend.h"

namespace castor::tools {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

#define SKIP_WITHOUT_GLOO() \
  if (!distributed::CollectivesAvailable()) GTEST_SKIP() << "built without Gloo"

// --- the configuration ---------------------------------------------------------

absl::StatusOr<std::optional<distributed::DistributedConfig>> ConfigOf(
    std::map<std::string, std::string> environment) {
  return distributed::ConfigFromEnvironment(
      std::chrono::seconds(5), [&environment](const char* name) -> const char* {
        auto found = environment.find(name);
        return found == environment.end() ? nullptr : found->second.c_str();
      });
}

TEST(DistributedConfigTest, AloneWithoutRankAndWorldSize) {
  auto config = ConfigOf({{"MASTER_PORT", "29500"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->has_value());
  config = ConfigOf({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->has_value());
}

TEST(DistributedConfigTest, ReadsTorchrunVariables) {
  auto config = ConfigOf(
      {{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29501"}});
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->has_value());
  EXPECT_EQ((*config)->rank, 1);
  EXPECT_EQ((*config)->world_size, 3);
  EXPECT_EQ((*config)->master_addr, "localhost");
  EXPECT_EQ((*config)->master_port, 29501);
  EXPECT_EQ((*config)->timeout, std::chrono::seconds(5));
}

TEST(DistributedConfigTest, ReadsMpiLaunchersVariables) {
  // Open MPI's mpirun on one host: MASTER_ADDR 127.0.0.1, MASTER_PORT 29500.
  auto config = ConfigOf({{"OMPI_COMM_WORLD_RANK", "1"},
                          {"OMPI_COMM_WORLD_SIZE", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->has_value());
  EXPECT_EQ((*config)->rank, 1);
  EXPECT_EQ((*config)->world_size, 2);
  EXPECT_EQ((*config)->master_addr, "127.0.0.1");
  EXPECT_EQ((*config)->master_port, distributed::kDefaultMasterPort);
  // MPICH's Hydra, with the address and port given.
  config = ConfigOf({{"PMI_RANK", "3"},
                     {"PMI_SIZE", "4"},
                     {"MPI_LOCALNRANKS", "2"},
                     {"MASTER_ADDR", "node7"},
                     {"MASTER_PORT", "40000"}});
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->has_value());
  EXPECT_EQ((*config)->rank, 3);
  EXPECT_EQ((*config)->world_size, 4);
  EXPECT_EQ((*config)->master_addr, "node7");
  EXPECT_EQ((*config)->master_port, 40000);
  // torchrun's variables win over an MPI launcher's.
  config = ConfigOf({{"RANK", "0"},
                     {"WORLD_SIZE", "2"},
                     {"MASTER_PORT", "29600"},
                     {"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "2"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)->rank, 0);
  EXPECT_EQ((*config)->master_port, 29600);
  // Where the ranks sit: the launcher's local variables, else one host.
  config = ConfigOf({{"RANK", "5"},
                     {"WORLD_SIZE", "8"},
                     {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "4"},
                     {"MASTER_ADDR", "node0"},
                     {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)->local_rank, 1);
  EXPECT_EQ((*config)->local_world_size, 4);
  config = ConfigOf({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)->local_rank, 1);
  EXPECT_EQ((*config)->local_world_size, 2);
  // mpirun -np 1: a run on its own.
  config = ConfigOf({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->has_value());
}

TEST(DistributedConfigTest, BadConfigurationsNameTheVariable) {
  struct Case {
    std::map<std::string, std::string> environment;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not"},
           {{{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not"},
           {{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}},
            "RANK=2: expected an integer in [0, 2)"},
           {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK=-1: expected an integer in [0, 2)"},
           {{{"RANK", "0"}, {"WORLD_SIZE", "two"}}, "WORLD_SIZE=two: expected an integer >= 1"},
           {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "rank 0 of 2: MASTER_PORT=(unset)"},
           {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}},
            "rank 1 of 2: MASTER_PORT=70000: expected the port rank 0 listens on"},
           {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}, {"LOCAL_RANK", "2"}},
            "rank 1 of 2: LOCAL_RANK=2: expected an integer in [0, 2)"},
           {{{"RANK", "1"},
             {"WORLD_SIZE", "2"},
             {"MASTER_PORT", "1"},
             {"LOCAL_WORLD_SIZE", "3"}},
            "rank 1 of 2: LOCAL_WORLD_SIZE=3: expected an integer in [1, 2]"},
           {{{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_RANK is set but "
                                             "OMPI_COMM_WORLD_SIZE is not"},
           {{{"PMI_RANK", "5"}, {"PMI_SIZE", "4"}}, "PMI_RANK=5: expected an integer in [0, 4)"},
           // Ranks on several hosts cannot meet at 127.0.0.1.
           {{{"OMPI_COMM_WORLD_RANK", "0"},
             {"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
            "rank 0 of 4: the 4 ranks run on several hosts (OMPI_COMM_WORLD_LOCAL_SIZE=2): set "
            "MASTER_ADDR"},
       }) {
    auto config = ConfigOf(c.environment);
    ASSERT_FALSE(config.ok()) << c.message;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(c.message));
  }
}

// A GPU run gives each rank on a host a device of its own.
TEST(RankPlacementTest, EachRankOnAHostNeedsADevice) {
  EXPECT_TRUE(training::CheckDevicesForRanks(0, {0, 1}).ok());  // alone: no demand
  EXPECT_TRUE(training::CheckDevicesForRanks(8, {3, 8}).ok());
  EXPECT_TRUE(training::CheckDevicesForRanks(4, {1, 2}).ok());
  const absl::Status short_of_devices = training::CheckDevicesForRanks(1, {1, 2});
  EXPECT_EQ(short_of_devices.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(short_of_devices.message(),
              HasSubstr("2 data-parallel ranks on this host but 1 CUDA device(s)"));
}

// --- shards ----------------------------------------------------------------------

TEST(RankShardTest, SplitsAGlobalBatchAsDistributedSamplerDoes) {
  // torch.utils.data.DistributedSampler(num_replicas=2, shuffle=False) over
  // the order [7, 3, 9, 1, 4, 0, 8, 2] with a DataLoader of batch 2 gives
  // rank 0 batches [7, 9], [4, 8] and rank 1 [3, 1], [0, 2]: global batch k
  // (of 4) is the union of the ranks' batches k.
  const std::vector<int64_t> order = {7, 3, 9, 1, 4, 0, 8, 2};
  EXPECT_EQ(training::RankShard({7, 3, 9, 1}, order, 0, 2), (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(training::RankShard({7, 3, 9, 1}, order, 1, 2), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(training::RankShard({4, 0, 8, 2}, order, 0, 2), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(training::RankShard({4, 0, 8, 2}, order, 1, 2), (std::vector<int64_t>{0, 2}));
}

TEST(RankShardTest, PadsTheLastBatchWithTheEpochsFirstSamples) {
  // 7 samples on 4 ranks: DistributedSampler pads the order to 8 with its
  // first sample; with a global batch of 4, the last batch [4, 0, 8] gets
  // order[0] = 7 and every rank one row.
  const std::vector<int64_t> order = {7, 3, 9, 1, 4, 0, 8};
  EXPECT_EQ(training::RankShard({4, 0, 8}, order, 0, 4), (std::vector<int64_t>{4}));
  EXPECT_EQ(training::RankShard({4, 0, 8}, order, 2, 4), (std::vector<int64_t>{8}));
  EXPECT_EQ(training::RankShard({4, 0, 8}, order, 3, 4), (std::vector<int64_t>{7}));
  // Padding past the order's length wraps around it, as torch repeats it.
  EXPECT_EQ(training::RankShard({5}, {5}, 3, 4), (std::vector<int64_t>{5}));
}

// --- the Gloo communicator ----------------------------------------------------

int FreePort() {
  absl::StatusOr<int> port = distributed::FreeLoopbackPort();
  EXPECT_TRUE(port.ok()) << port.status();
  return port.ok() ? *port : 0;
}

distributed::DistributedConfig RankConfig(
    int rank, int world_size, int port,
    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  distributed::DistributedConfig config;
  config.rank = rank;
  config.world_size = world_size;
  config.master_addr = "127.0.0.1";
  config.master_port = port;
  config.timeout = timeout;
  return config;
}

// Runs `body(rank, communicator)` on `world_size` threads, one rank each,
// after connecting them.
void OnRanks(int world_size, const std::function<void(int, distributed::Communicator&)>& body) {
  const int port = FreePort();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<distributed::Communicator>> communicator =
          distributed::Connect(RankConfig(rank, world_size, port));
      ASSERT_TRUE(communicator.ok()) << communicator.status();
      EXPECT_EQ((*communicator)->rank(), rank);
      EXPECT_EQ((*communicator)->world_size(), world_size);
      body(rank, **communicator);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

TEST(GlooCommunicatorTest, AveragesSumsBroadcastsAndMeets) {
  SKIP_WITHOUT_GLOO();
  OnRanks(3, [](int rank, distributed::Communicator& communicator) {
    // Rank r holds r + 1, -2r and 0.5 * (r + 1) * 1e-3; the averages are
    // 2, -2 and 1e-3 (float32 of the float64 values).
    std::vector<float> data = {static_cast<float>(rank + 1), static_cast<float>(-2 * rank),
                               0.5f * static_cast<float>(rank + 1) * 1e-3f};
    ASSERT_TRUE(communicator.AllreduceAverage(data.data(), data.size(), "test data").ok());
    EXPECT_EQ(data[0], 2.0f);
    EXPECT_EQ(data[1], -2.0f);
    EXPECT_NEAR(data[2], 1e-3, 1e-9);
    // An inf on one rank is an inf (or NaN) on every rank.
    std::vector<float> overflow = {rank == 2 ? std::numeric_limits<float>::infinity() : 1.0f};
    ASSERT_TRUE(communicator.AllreduceAverage(overflow.data(), 1, "overflow").ok());
    EXPECT_FALSE(std::isfinite(overflow[0]));
    double values[2] = {static_cast<double>(rank), 1.0};
    ASSERT_TRUE(communicator.AllreduceSum(values, 2, "counts").ok());
    EXPECT_EQ(values[0], 3.0);
    EXPECT_EQ(values[1], 3.0);
    int64_t broadcast[2] = {rank == 1 ? 1234567890123 : 0, rank == 1 ? -5 : 0};
    ASSERT_TRUE(communicator.Broadcast(broadcast, sizeof(broadcast), 1, "numbers").ok());
    EXPECT_EQ(broadcast[0], 1234567890123);
    EXPECT_EQ(broadcast[1], -5);
    EXPECT_TRUE(communicator.Barrier("the end").ok());
    absl::Status bad_root = communicator.Broadcast(broadcast, 8, 3, "numbers");
    EXPECT_THAT(bad_root.message(), HasSubstr("broadcast of numbers from rank 3: no such rank"));
  });
}

TEST(BucketedAllreduceTest, AveragesEveryValueInBucketsOfTheGivenSize) {
  SKIP_WITHOUT_GLOO();
  OnRanks(3, [](int rank, distributed::Communicator& communicator) {
    // Buckets of 64 bytes (16 floats) after a first of 64 bytes too.
    distributed::BucketedAllreduce buckets(communicator, 64);
    for (int step = 1; step <= 2; ++step) {
      buckets.BeginStep(absl::StrCat("step ", step));
      // Keys 0..5 with 1, 10, 20, 3, 40, 7 values: value i of key k on
      // rank r is r + k + i + step, averaged 1 + k + i + step.
      const size_t counts[] = {1, 10, 20, 3, 40, 7};
      for (int key : {4, 0, 2, 5, 1, 3}) {  // the order the nodes finish in
        ASSERT_FALSE(buckets.Added(key));
        ASSERT_TRUE(buckets
                        .Add(key, counts[key],
                             [&](float* values) {
                               for (size_t i = 0; i < counts[key]; ++i) {
                                 values[i] = static_cast<float>(rank + key + i + step);
                               }
                               return absl::OkStatus();
                             })
                        .ok());
        EXPECT_TRUE(buckets.Added(key));
      }
      ASSERT_TRUE(buckets.Finish().ok());
      // In the order added, a bucket closing at 16 floats or more:
      // 40 | 1 20 | 7 10 | 3 (the last sent by Finish): 81 floats.
      EXPECT_EQ(buckets.buckets(), 4);
      EXPECT_EQ(buckets.bytes(), 81 * 4);
      EXPECT_GE(buckets.allreduce_seconds(), 0.0);
      for (int key = 0; key < 6; ++key) {
        size_t count = 0;
        const float* averaged = buckets.Averaged(key, &count);
        ASSERT_NE(averaged, nullptr);
        ASSERT_EQ(count, counts[key]);
        for (size_t i = 0; i < count; ++i) {
          EXPECT_EQ(averaged[i], static_cast<float>(1 + key + i + step)) << key << " " << i;
        }
      }
      size_t count = 0;
      EXPECT_EQ(buckets.Averaged(6, &count), nullptr);
    }
    // bucket_bytes 0: one bucket, whatever the size.
    distributed::BucketedAllreduce one(communicator, 0);
    one.BeginStep("step 3");
    for (int key = 0; key < 4; ++key) {
      ASSERT_TRUE(one.Add(key, 1000, [&](float* values) {
                       std::fill(values, values + 1000, static_cast<float>(rank));
                       return absl::OkStatus();
                     }).ok());
    }
    ASSERT_TRUE(one.Finish().ok());
    EXPECT_EQ(one.buckets(), 1);
    size_t count = 0;
    EXPECT_EQ(one.Averaged(3, &count)[999], 1.0f);
    // A key added twice is a bug, said as such.
    one.BeginStep("step 4");
    auto fill = [](float* values) {
      values[0] = 0;
      return absl::OkStatus();
    };
    ASSERT_TRUE(one.Add(0, 1, fill).ok());
    EXPECT_EQ(one.Add(0, 1, fill).code(), absl::StatusCode::kInternal);
    ASSERT_TRUE(one.Finish().ok());
  });
}

TEST(BucketedAllreduceTest, ARankThatLeavesFailsTheStepNamingTheBucket) {
  SKIP_WITHOUT_GLOO();
  OnRanks(2, [](int rank, distributed::Communicator& communicator) {
    if (rank == 1) return;  // leaves: its communicator closes
    distributed::BucketedAllreduce buckets(communicator, 4);
    buckets.BeginStep("step 7");
    for (int key = 0; key < 3; ++key) {
      ASSERT_TRUE(buckets.Add(key, 1, [](float* values) {
                           values[0] = 1;
                           return absl::OkStatus();
                         }).ok());
    }
    const absl::Status finished = buckets.Finish();
    ASSERT_FALSE(finished.ok());
    EXPECT_THAT(finished.message(),
                HasSubstr("allreduce of the loss and gradients of step 7, bucket 1"));
  });
}

TEST(GlooCommunicatorTest, APortInUseIsRefusedByName) {
  SKIP_WITHOUT_GLOO();
  const int port = FreePort();
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  absl::StatusOr<std::unique_ptr<distributed::Communicator>> rank0 =
      distributed::Connect(RankConfig(0, 2, port, std::chrono::seconds(2)));
  ASSERT_FALSE(rank0.ok());
  EXPECT_EQ(rank0.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rank0.status().message(),
              HasSubstr(absl::StrCat("rank 0 of 2: cannot listen on MASTER_ADDR:MASTER_PORT "
                                     "127.0.0.1:",
                                     port)));
  EXPECT_THAT(rank0.status().message(), HasSubstr("the port is in use"));
  // Rank 1 reaches the other program, which does not answer as rank 0.
  absl::StatusOr<std::unique_ptr<distributed::Communicator>> rank1 =
      distributed::Connect(RankConfig(1, 2, port, std::chrono::seconds(2)));
  ASSERT_FALSE(rank1.ok());
  EXPECT_EQ(rank1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rank1.status().message(), HasSubstr("rank 1 of 2: 127.0.0.1:"));
  EXPECT_THAT(rank1.status().message(), HasSubstr("not as castor's rank 0"));
  close(listener);
}

TEST(GlooCommunicatorTest, AMissingRankTimesOutNamingIt) {
  SKIP_WITHOUT_GLOO();
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<distributed::Communicator>> rank0 =
      distributed::Connect(RankConfig(0, 3, FreePort(), std::chrono::seconds(1)));
  ASSERT_FALSE(rank0.ok());
  EXPECT_THAT(rank0.status().message(), HasSubstr("rank 0 of 3: rank(s) 1, 2 did not join"));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
}

// --- trainers as ranks ------------------------------------------------------------

Model LoadSample(const std::string& name, const std::string& policy) {
  absl::StatusOr<Model> model =
      LoadModel(std::string(CASTOR_SOURCE_DIR) + "/models/" + name + ".onnx");
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(InferTypes(*model).ok());
  if (policy != "float32") {
    absl::StatusOr<AutocastReport> report = RunAutocast(*model, *Policy::Builtin(policy));
    EXPECT_TRUE(report.ok()) << report.status();
  }
  return std::move(*model);
}

// A trainer on its own single-threaded CPU backend (ranks run at once).
struct RankTrainer {
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<training::Trainer> trainer;
};

RankTrainer MakeRankTrainer(const std::string& model, const std::string& policy,
                            training::TrainerOptions options,
                            std::unique_ptr<CpuBackend> backend = nullptr) {
  RankTrainer made;
  made.backend = backend != nullptr ? std::move(backend)
                                    : std::make_unique<CpuBackend>(CpuBackendOptions{1});
  Model loaded = LoadSample(model, policy);
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(loaded, TrainingGraphOptions{});
  EXPECT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(VerifyModel(loaded).ok());
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(std::move(loaded), *graph, options, *made.backend);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (trainer.ok()) made.trainer = *std::move(trainer);
  return made;
}

// `steps` global batches of `batch` images in [0, 1) and labels in 0..9.
training::Dataset GlobalBatches(int64_t steps, int64_t batch) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  const int64_t n = steps * batch;
  Tensor images(DType::kFloat32, {n, 1, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) images.data<float>()[i] = pixel(rng);
  Tensor labels(DType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = (i * 7 + i / 10) % 10;
  absl::StatusOr<training::Dataset> dataset =
      training::MakeDataset("test batches", std::move(images), std::move(labels));
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return *std::move(dataset);
}

std::vector<int64_t> Rows(int64_t first, int64_t count) {
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < count; ++i) rows.push_back(first + i);
  return rows;
}

training::TrainerOptions SgdOptions() {
  training::TrainerOptions options;
  options.optimizer.kind = OptimizerKind::kSgd;
  options.optimizer.momentum = 0.9;
  options.lr.base_lr = 0.05;
  return options;
}

TEST(DataParallelTrainerTest, TwoRanksOnHalfBatchesMatchOneRankOnTheWholeBatch) {
  SKIP_WITHOUT_GLOO();
  constexpr int64_t kSteps = 20, kBatch = 64;
  const training::Dataset data = GlobalBatches(kSteps, kBatch);
  // One process, the whole global batch each step.
  RankTrainer single = MakeRankTrainer("cnn_opset17", "float32", SgdOptions());
  ASSERT_NE(single.trainer, nullptr);
  absl::StatusOr<training::Trainer::Snapshot> initial = single.trainer->TakeSnapshot();
  ASSERT_TRUE(initial.ok()) << initial.status();
  std::vector<double> single_losses;
  for (int64_t step = 0; step < kSteps; ++step) {
    training::Batch b = training::GatherBatch(data, Rows(step * kBatch, kBatch));
    absl::StatusOr<training::StepResult> r = single.trainer->Step({{"input", b.images}}, b.labels);
    ASSERT_TRUE(r.ok()) << r.status();
    single_losses.push_back(r->loss);
  }
  // Two ranks, each its DistributedSampler half of the same global batch.
  std::vector<std::vector<double>> rank_losses(2);
  std::vector<std::map<std::string, Tensor>> rank_state(2);
  OnRanks(2, [&](int rank, distributed::Communicator& communicator) {
    training::TrainerOptions options = SgdOptions();
    options.communicator = &communicator;
    RankTrainer ranked = MakeRankTrainer("cnn_opset17", "float32", options);
    ASSERT_NE(ranked.trainer, nullptr);
    for (int64_t step = 0; step < kSteps; ++step) {
      const std::vector<int64_t> global = Rows(step * kBatch, kBatch);
      training::Batch b = training::GatherBatch(data, training::RankShard(global, global, rank, 2));
      ASSERT_EQ(b.indices.size(), static_cast<size_t>(kBatch / 2));
      absl::StatusOr<training::StepResult> r =
          ranked.trainer->Step({{"input", b.images}}, b.labels);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_FALSE(r->skipped);
      rank_losses[static_cast<size_t>(rank)].push_back(r->loss);
    }
    absl::StatusOr<training::Trainer::Snapshot> snapshot = ranked.trainer->TakeSnapshot();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    rank_state[static_cast<size_t>(rank)] = std::move(snapshot->state);
  });
  ASSERT_EQ(rank_losses[0].size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(rank_losses[1].size(), static_cast<size_t>(kSteps));
  for (int64_t step = 0; step < kSteps; ++step) {
    // The reported loss is the global batch's mean on every rank.
    EXPECT_EQ(rank_losses[0][step], rank_losses[1][step]) << "step " << step + 1;
    EXPECT_NEAR(rank_losses[0][step], single_losses[step], 1e-6 * std::abs(single_losses[step]))
        << "step " << step + 1;
  }
  absl::StatusOr<training::Trainer::Snapshot> single_state = single.trainer->TakeSnapshot();
  ASSERT_TRUE(single_state.ok()) << single_state.status();
  ASSERT_EQ(rank_state[0].size(), 6u);
  for (const auto& [name, expected] : single_state->state) {
    const Tensor& rank0 = rank_state[0].at(name);
    const Tensor& rank1 = rank_state[1].at(name);
    ASSERT_EQ(rank0.byte_size(), expected.byte_size()) << name;
    EXPECT_EQ(std::memcmp(rank0.raw(), rank1.raw(), rank0.byte_size()), 0)
        << name << ": the ranks' weights drifted apart";
    double worst = 0;
    for (int64_t i = 0; i < expected.num_elements(); ++i) {
      worst = std::max(
          worst, std::abs(static_cast<double>(rank0.data<float>()[i]) - expected.data<float>()[i]));
    }
    EXPECT_LE(worst, 1e-5) << name;
    // ... after moving much further than that in 20 steps.
    double moved = 0;
    const Tensor& start = initial->state.at(name);
    for (int64_t i = 0; i < expected.num_elements(); ++i) {
      moved = std::max(
          moved, std::abs(static_cast<double>(expected.data<float>()[i]) - start.data<float>()[i]));
    }
    EXPECT_GT(moved, 1e-3) << name;
  }
}

TEST(DataParallelTrainerTest, AnOverflowOnOneRankSkipsTheStepOnBoth) {
  SKIP_WITHOUT_GLOO();
  const training::Dataset data = GlobalBatches(2, 16);
  OnRanks(2, [&](int rank, distributed::Communicator& communicator) {
    training::TrainerOptions options;
    options.communicator = &communicator;
    RankTrainer ranked = MakeRankTrainer("cnn_opset17", "mixed_float16", options);
    ASSERT_NE(ranked.trainer, nullptr);
    const double initial_scale = ranked.trainer->scaler().scale();
    absl::StatusOr<training::Trainer::Snapshot> before = ranked.trainer->TakeSnapshot();
    ASSERT_TRUE(before.ok()) << before.status();
    // Step 1: rank 1 alone sees a pixel of 1e30, inf in float16.
    training::Batch b = training::GatherBatch(data, training::RankShard(Rows(0, 16), {}, rank, 2));
    if (rank == 1) b.images.data<float>()[123] = 1e30f;
    absl::StatusOr<training::StepResult> r = ranked.trainer->Step({{"input", b.images}}, b.labels);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->skipped) << "rank " << rank;
    EXPECT_EQ(ranked.trainer->scaler().scale(), initial_scale / 2) << "rank " << rank;
    EXPECT_EQ(ranked.trainer->scaler().skipped_steps(), 1);
    EXPECT_EQ(ranked.trainer->optimizer_step(), 0);
    absl::StatusOr<training::Trainer::Snapshot> after = ranked.trainer->TakeSnapshot();
    ASSERT_TRUE(after.ok()) << after.status();
    for (const auto& [name, tensor] : before->state) {
      const Tensor& now = after->state.at(name);
      EXPECT_EQ(std::memcmp(tensor.raw(), now.raw(), tensor.byte_size()), 0)
          << "rank " << rank << " changed " << name << " on a skipped step";
    }
    // Step 2, finite on both: an update, the same on both ranks.
    b = training::GatherBatch(data, training::RankShard(Rows(16, 16), {}, rank, 2));
    r = ranked.trainer->Step({{"input", b.images}}, b.labels);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->skipped) << "rank " << rank;
    EXPECT_EQ(ranked.trainer->optimizer_step(), 1);
    // The ranks compare their weights: each one's sum of squared
    // differences from rank 0's is 0.
    absl::StatusOr<training::Trainer::Snapshot> updated = ranked.trainer->TakeSnapshot();
    ASSERT_TRUE(updated.ok()) << updated.status();
    for (auto& [name, tensor] : updated->state) {
      std::vector<float> mine(tensor.data<float>(), tensor.data<float>() + tensor.num_elements());
      std::vector<float> rank0 = mine;
      ASSERT_TRUE(communicator.Broadcast(rank0.data(), rank0.size() * sizeof(float), 0, name).ok());
      EXPECT_EQ(std::memcmp(mine.data(), rank0.data(), mine.size() * sizeof(float)), 0)
          << "rank " << rank << ": " << name << " differs from rank 0's";
    }
  });
}

// --- device collectives (NCCL's place, faked on the CPU) ---------------------------

// Device collectives whose device memory is the CPU backend's host memory:
// the group averages float32 buffers through the rank's Gloo communicator,
// so that the group's formation (distributed::JoinDeviceGroup) and the
// trainer's device path run without a GPU. It records what it was asked.
class HostMemoryCollectives : public DeviceCollectives {
 public:
  static constexpr double kWaitSeconds = 0.25e-3;  // what each Wait reports

  explicit HostMemoryCollectives(distributed::Communicator& communicator)
      : communicator_(communicator) {}

  std::string library() const override { return "FakeCCL"; }
  absl::Status Load() override {
    return load_error.empty() ? absl::OkStatus() : absl::FailedPreconditionError(load_error);
  }
  size_t group_id_bytes() const override { return 16; }
  absl::StatusOr<std::string> NewGroupId() override {
    if (!id_error.empty()) return absl::UnavailableError(id_error);
    return std::string("group-id-0123456", 16);
  }
  absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> Join(
      const std::string& id, int rank, int world_size, std::chrono::milliseconds) override {
    joined_id = id;
    joined_rank = rank;
    joined_world_size = world_size;
    return std::unique_ptr<DeviceCollectiveGroup>(new Group(*this, rank, world_size));
  }

  // Set before the group forms: Load's or NewGroupId's failure.
  std::string load_error, id_error;
  // What happened.
  std::string joined_id;
  int joined_rank = -1, joined_world_size = 0;
  std::vector<size_t> averaged;  // buffers per AverageInPlace
  int waits = 0;

 private:
  class Group : public DeviceCollectiveGroup {
   public:
    Group(HostMemoryCollectives& owner, int rank, int world_size)
        : owner_(owner), rank_(rank), world_size_(world_size) {}
    int rank() const override { return rank_; }
    int world_size() const override { return world_size_; }
    std::string engine() const override { return "FakeCCL 1.0"; }
    absl::Status AverageInPlace(const std::vector<TensorView>& buffers,
                                const std::string& what) override {
      owner_.averaged.push_back(buffers.size());
      for (const TensorView& buffer : buffers) {
        if (buffer.dtype != DType::kFloat32) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": a ", DTypeName(buffer.dtype),
                                                         " buffer"));
        }
        CASTOR_RETURN_IF_ERROR(owner_.communicator_.AllreduceAverage(
            buffer.as<float>(), static_cast<size_t>(buffer.num_elements()), what));
      }
      return absl::OkStatus();
    }
    absl::StatusOr<double> Wait(const std::string&) override {
      ++owner_.waits;
      return kWaitSeconds;
    }

   private:
    HostMemoryCollectives& owner_;
    int rank_, world_size_;
  };

  distributed::Communicator& communicator_;
};

// A single-threaded CPU backend that offers HostMemoryCollectives.
class CpuBackendWithCollectives : public CpuBackend {
 public:
  explicit CpuBackendWithCollectives(distributed::Communicator& communicator)
      : CpuBackend(CpuBackendOptions{1}), collectives_(communicator) {}
  DeviceCollectives* device_collectives() override { return &collectives_; }
  HostMemoryCollectives& fake() { return collectives_; }

 private:
  HostMemoryCollectives collectives_;
};

TEST(DeviceGroupTest, RanksJoinWithRankZerosGroupId) {
  SKIP_WITHOUT_GLOO();
  for (int world_size : {1, 3}) {
    OnRanks(world_size, [world_size](int rank, distributed::Communicator& communicator) {
      CpuBackendWithCollectives backend(communicator);
      absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> group =
          distributed::JoinDeviceGroup(backend, communicator, std::chrono::seconds(30));
      ASSERT_TRUE(group.ok()) << group.status();
      ASSERT_NE(*group, nullptr) << "rank " << rank << " of " << world_size;
      EXPECT_EQ(backend.fake().joined_id, std::string("group-id-0123456", 16))
          << "rank " << rank << " of " << world_size;
      EXPECT_EQ(backend.fake().joined_rank, rank);
      EXPECT_EQ(backend.fake().joined_world_size, world_size);
    });
  }
}

TEST(DeviceGroupTest, ARankWithoutThemSendsEveryRankThroughTheHost) {
  SKIP_WITHOUT_GLOO();
  // Rank 1 trains on a backend without device collectives (a CPU rank of a
  // --backend auto run, say): no rank joins a group.
  OnRanks(3, [](int rank, distributed::Communicator& communicator) {
    CpuBackendWithCollectives offering(communicator);
    CpuBackend plain(CpuBackendOptions{1});
    Backend& backend = rank == 1 ? static_cast<Backend&>(plain) : offering;
    absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> group =
        distributed::JoinDeviceGroup(backend, communicator, std::chrono::seconds(30));
    ASSERT_TRUE(group.ok()) << group.status();
    EXPECT_EQ(*group, nullptr) << "rank " << rank;
    EXPECT_EQ(offering.fake().joined_rank, -1) << "rank " << rank;
  });
}

TEST(DeviceGroupTest, ARankThatCannotLoadTheLibraryStopsEveryRank) {
  SKIP_WITHOUT_GLOO();
  OnRanks(3, [](int rank, distributed::Communicator& communicator) {
    CpuBackendWithCollectives backend(communicator);
    if (rank == 1) {
      backend.fake().load_error =
          "data-parallel training on cuda needs NCCL (libnccl.so.2): libnccl.so.2: cannot open "
          "shared object file";
    }
    absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> group =
        distributed::JoinDeviceGroup(backend, communicator, std::chrono::seconds(30));
    ASSERT_FALSE(group.ok()) << "rank " << rank;
    EXPECT_EQ(group.status().code(), absl::StatusCode::kFailedPrecondition);
    if (rank == 1) {
      EXPECT_EQ(group.status().message(),
                "rank 1 of 3: data-parallel training on cuda needs NCCL (libnccl.so.2): "
                "libnccl.so.2: cannot open shared object file");
    } else {
      EXPECT_EQ(group.status().message(),
                absl::StrCat("rank ", rank, " of 3: rank(s) 1 cannot load FakeCCL for this "
                             "data-parallel run (their errors say why)"));
    }
    EXPECT_EQ(backend.fake().joined_rank, -1);
  });
}

TEST(DeviceGroupTest, ARankZeroWithoutAGroupIdStopsEveryRank) {
  SKIP_WITHOUT_GLOO();
  OnRanks(2, [](int rank, distributed::Communicator& communicator) {
    CpuBackendWithCollectives backend(communicator);
    if (rank == 0) backend.fake().id_error = "rank 0: NCCL: ncclGetUniqueId: no network";
    absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> group =
        distributed::JoinDeviceGroup(backend, communicator, std::chrono::seconds(30));
    ASSERT_FALSE(group.ok()) << "rank " << rank;
    EXPECT_THAT(group.status().message(),
                HasSubstr(rank == 0 ? "rank 0 of 2: rank 0: NCCL: ncclGetUniqueId: no network"
                                    : "rank 1 of 2: rank 0 could not create the FakeCCL group"));
    EXPECT_EQ(backend.fake().joined_rank, -1);
  });
}

// The trainer's device path (one group of the loss and the gradients,
// averaged in backend memory after the backward pass) against its host
// path (Gloo buckets), on 2 ranks: the same averages, so the same bits.
TEST(DataParallelTrainerTest, DeviceCollectivesGiveTheHostPathsBits) {
  SKIP_WITHOUT_GLOO();
  constexpr int64_t kSteps = 4, kBatch = 32;
  const training::Dataset data = GlobalBatches(kSteps, kBatch);
  struct Run {
    std::vector<double> losses;
    std::map<std::string, Tensor> state;
    std::vector<training::StepResult> results;
    std::string engine;
    std::vector<size_t> averaged;
    int waits = 0;
  };
  std::vector<std::vector<Run>> runs(2, std::vector<Run>(2));  // [path][rank]
  for (int device : {0, 1}) {
    OnRanks(2, [&](int rank, distributed::Communicator& communicator) {
      training::TrainerOptions options = SgdOptions();
      options.communicator = &communicator;
      options.device_collectives = device == 1;
      auto backend = std::make_unique<CpuBackendWithCollectives>(communicator);
      CpuBackendWithCollectives* fake = backend.get();
      RankTrainer ranked = MakeRankTrainer("cnn_opset17", "float32", options, std::move(backend));
      ASSERT_NE(ranked.trainer, nullptr);
      Run& run = runs[static_cast<size_t>(device)][static_cast<size_t>(rank)];
      run.engine = ranked.trainer->allreduce_engine();
      for (int64_t step = 0; step < kSteps; ++step) {
        const std::vector<int64_t> global = Rows(step * kBatch, kBatch);
        training::Batch b =
            training::GatherBatch(data, training::RankShard(global, global, rank, 2));
        absl::StatusOr<training::StepResult> r =
            ranked.trainer->Step({{"input", b.images}}, b.labels);
        ASSERT_TRUE(r.ok()) << r.status();
        run.losses.push_back(r->loss);
        r->output = Tensor();
        run.results.push_back(*r);
      }
      absl::StatusOr<training::Trainer::Snapshot> snapshot = ranked.trainer->TakeSnapshot();
      ASSERT_TRUE(snapshot.ok()) << snapshot.status();
      run.state = std::move(snapshot->state);
      run.averaged = fake->fake().averaged;
      run.waits = fake->fake().waits;
    });
  }
  const Run& host = runs[0][0];
  EXPECT_EQ(host.engine, "Gloo");
  EXPECT_TRUE(host.averaged.empty()) << "the host path used the device collectives";
  int64_t elements = 1;  // the loss
  for (const auto& [name, tensor] : host.state) elements += tensor.num_elements();
  for (int rank : {0, 1}) {
    const Run& run = runs[1][static_cast<size_t>(rank)];
    ASSERT_EQ(run.losses.size(), static_cast<size_t>(kSteps)) << "rank " << rank;
    EXPECT_EQ(run.engine, "FakeCCL 1.0");
    // One group a step: the loss and the 6 gradients.
    EXPECT_EQ(run.averaged, std::vector<size_t>(kSteps, 7)) << "rank " << rank;
    EXPECT_EQ(run.waits, kSteps) << "rank " << rank;
    for (int64_t step = 0; step < kSteps; ++step) {
      EXPECT_EQ(run.losses[step], host.losses[step]) << "rank " << rank << " step " << step + 1;
      const training::StepResult& r = run.results[static_cast<size_t>(step)];
      EXPECT_EQ(r.allreduce_bytes, 4 * elements);
      EXPECT_EQ(r.allreduce_buckets, 1);
      EXPECT_EQ(r.allreduce_seconds, HostMemoryCollectives::kWaitSeconds);
      EXPECT_EQ(r.allreduce_wait_seconds, HostMemoryCollectives::kWaitSeconds);
    }
    for (const auto& [name, expected] : host.state) {
      const Tensor& weight = run.state.at(name);
      ASSERT_EQ(weight.byte_size(), expected.byte_size()) << name;
      EXPECT_EQ(std::memcmp(weight.raw(), expected.raw(), weight.byte_size()), 0)
          << "rank " << rank << ": " << name << " differs from the host path's";
    }
  }
}

TEST(DataParallelTrainerTest, AnOverflowOnOneRankSkipsTheStepOnBothThroughDeviceCollectives) {
  SKIP_WITHOUT_GLOO();
  const training::Dataset data = GlobalBatches(2, 16);
  OnRanks(2, [&](int rank, distributed::Communicator& communicator) {
    training::TrainerOptions options;
    options.communicator = &communicator;
    auto backend = std::make_unique<CpuBackendWithCollectives>(communicator);
    CpuBackendWithCollectives* fake = backend.get();
    RankTrainer ranked =
        MakeRankTrainer("cnn_opset17", "mixed_float16", options, std::move(backend));
    ASSERT_NE(ranked.trainer, nullptr);
    const double initial_scale = ranked.trainer->scaler().scale();
    // Step 1: rank 1 alone sees a pixel of 1e30, inf in float16; the
    // scaler's check reads the averaged gradients, inf on both ranks.
    training::Batch b = training::GatherBatch(data, training::RankShard(Rows(0, 16), {}, rank, 2));
    if (rank == 1) b.images.data<float>()[123] = 1e30f;
    absl::StatusOr<training::StepResult> r = ranked.trainer->Step({{"input", b.images}}, b.labels);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->skipped) << "rank " << rank;
    EXPECT_EQ(ranked.trainer->scaler().scale(), initial_scale / 2) << "rank " << rank;
    EXPECT_EQ(ranked.trainer->optimizer_step(), 0) << "rank " << rank;
    b = training::GatherBatch(data, training::RankShard(Rows(16, 16), {}, rank, 2));
    r = ranked.trainer->Step({{"input", b.images}}, b.labels);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->skipped) << "rank " << rank;
    EXPECT_EQ(ranked.trainer->optimizer_step(), 1) << "rank " << rank;
    EXPECT_EQ(fake->fake().averaged.size(), 2u) << "rank " << rank;
  });
}

// --- castor train as ranks -------------------------------------------------------

class DistributedTrainTest : public CliTempDirTest {
 protected:
  DistributedTrainTest() : CliTempDirTest("distributed") {}

  void SetUp() override {
    CliTempDirTest::SetUp();
    std::mt19937 rng(5);
    WriteImageSplit(dir_, "train", 256, 3, rng);
    WriteImageSplit(dir_, "test", 32, 3, rng);
    const fs::path d = dir_;
    data_ = absl::StrCat((d / "train_x.npy").string(), ",", (d / "train_y.npy").string(), ",",
                         (d / "test_x.npy").string(), ",", (d / "test_y.npy").string());
  }

  // `castor train` on the MLP with SGD (4 steps an epoch at batch 64).
  std::string TrainArgs(const std::string& extra, const std::string& batch = "64",
                        const std::string& epochs = "10", const std::string& data = "") const {
    return absl::StrCat("train ", CASTOR_SOURCE_DIR, "/models/mlp_opset17.onnx --data ",
                        data.empty() ? data_ : data,
                        " --policy float32 --optimizer sgd --momentum 0.9 --lr 0.05 --batch ",
                        batch, " --epochs ", epochs, " --threads 1 ", extra);
  }


  std::string data_;
};

TEST_F(DistributedTrainTest, TwoProcessesMatchOneAndOnlyRankZeroPrints) {
  SKIP_WITHOUT_GLOO();
  const fs::path one = (dir_ / "one").string(), two = dir_ / "two";
  Program single = RunCastor(
      dir_, TrainArgs(absl::StrCat("--max-steps 20 --metrics ", (dir_ / "one.jsonl").string(),
                                   " --checkpoint-dir ", one.string())));
  ASSERT_EQ(single.exit_code, 0) << single.err;
  Program pair = RunCastor(dir_, TrainArgs(absl::StrCat("--max-steps 20 --nproc 2 --metrics ",
                                                        (dir_ / "two.jsonl").string(),
                                                        " --checkpoint-dir ", two.string())));
  ASSERT_EQ(pair.exit_code, 0) << pair.err;
  EXPECT_THAT(pair.out, HasSubstr("batch 64 (32 per rank on 2 ranks, Gloo)"));
  // One header, one summary, one last progress line: rank 0's (its summary
  // has one line more, the allreduce's).
  EXPECT_EQ(std::count(pair.out.begin(), pair.out.end(), '\n'),
            std::count(single.out.begin(), single.out.end(), '\n') + 1)
      << pair.out;
  EXPECT_EQ(pair.out.find("summary:"), pair.out.rfind("summary:")) << pair.out;
  EXPECT_EQ(pair.err.find("step 20/20"), pair.err.rfind("step 20/20")) << pair.err;
  // The accuracy counts every rank's rows: the same as the single process's.
  auto accuracy = [](const std::string& err) {
    const size_t line = err.find("step 20/20");
    if (line == std::string::npos) return std::string("(no step 20/20)");
    const size_t acc = err.find("acc ", line);
    return err.substr(acc, err.find(' ', acc + 4) - acc);
  };
  EXPECT_EQ(accuracy(pair.err), accuracy(single.err));
  // The losses step by step, and the checkpoints (rank 0's only, recording
  // the world size): the weights within 1e-5 of the single process's.
  ASSERT_NO_FATAL_FAILURE(ExpectSameTraining(dir_ / "one.jsonl", one / "ckpt-00000020.onnx",
                                             dir_ / "two.jsonl", two / "ckpt-00000020.onnx", 20));
  absl::StatusOr<training::Checkpoint> checkpoint =
      training::ReadCheckpoint((two / "ckpt-00000020.onnx").string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const Json* world_size = checkpoint->state.extra.Find("world_size");
  ASSERT_NE(world_size, nullptr);
  EXPECT_EQ(world_size->as_int(), 2);
  // Every step all-reduced the loss and each gradient as float32, and says
  // so in its metrics line and the summary; the run alone has no allreduce.
  int64_t elements = 1;  // the loss
  for (const auto& [name, weight] : CheckpointWeights(two / "ckpt-00000020.onnx")) {
    elements += weight.num_elements();
  }
  int steps_with_allreduce = 0;
  for (absl::string_view line : absl::StrSplit(ReadFile(dir_ / "two.jsonl"), '\n')) {
    absl::StatusOr<Json> json = Json::Parse(std::string(line));
    if (!json.ok() || json->Find("loss") == nullptr) continue;
    ASSERT_NE(json->Find("allreduce_bytes"), nullptr) << line;
    EXPECT_EQ(json->Find("allreduce_bytes")->as_int(), 4 * elements) << line;
    EXPECT_GE(json->Find("allreduce_ms")->as_number(), 0.0) << line;
    EXPECT_GE(json->Find("allreduce_wait_ms")->as_number(), 0.0) << line;
    // The MLP's 2.55 MiB in buckets of 1 MiB first, then 25 MiB: the loss,
    // fc3's and fc2's weight gradients (1 MiB, sent while fc1's gradient is
    // computed), then the rest.
    EXPECT_EQ(json->Find("allreduce_buckets")->as_int(), 2) << line;
    ++steps_with_allreduce;
  }
  EXPECT_EQ(steps_with_allreduce, 20);
  EXPECT_THAT(ReadFile(dir_ / "one.jsonl"), Not(HasSubstr("allreduce")));
  EXPECT_THAT(pair.out, HasSubstr(absl::StrFormat(
                            "  allreduce       Gloo: %.2f MiB per step in 2 bucket(s), ",
                            4.0 * elements / 1048576.0)));
  EXPECT_THAT(single.out, Not(HasSubstr("allreduce")));
}

TEST_F(DistributedTrainTest, ATwoRankResumeContinuesBitForBit) {
  SKIP_WITHOUT_GLOO();
  const fs::path whole = (dir_ / "whole").string(), resumed = dir_ / "resumed";
  Program run =
      RunCastor(dir_, TrainArgs(absl::StrCat("--max-steps 8 --save-every 4 --keep 0 --nproc 2 "
                                             "--metrics ",
                                             (dir_ / "whole.jsonl").string(), " --checkpoint-dir ",
                                             whole.string())));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  fs::create_directories(resumed);
  fs::copy_file((whole / "ckpt-00000004.onnx").string(), resumed / "ckpt-00000004.onnx");
  Program resume =
      RunCastor(dir_, absl::StrCat("train --resume ", resumed.string(), " --data ", data_,
                                   " --threads 1 --epochs 10 --max-steps 8 "
                                   "--nproc 2 --metrics ",
                                   (dir_ / "resumed.jsonl").string()));
  ASSERT_EQ(resume.exit_code, 0) << resume.err;
  EXPECT_THAT(resume.err, Not(HasSubstr("rank(s)")));  // same world size: no note
  const std::vector<double> expected = MetricsLosses(dir_ / "whole.jsonl");
  const std::vector<double> losses = MetricsLosses(dir_ / "resumed.jsonl");
  ASSERT_EQ(expected.size(), 8u);
  ASSERT_EQ(losses.size(), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(losses[k], expected[4 + k]) << "step " << k + 5;
  const std::map<std::string, Tensor> a = CheckpointWeights(whole / "ckpt-00000008.onnx");
  const std::map<std::string, Tensor> b = CheckpointWeights(resumed / "ckpt-00000008.onnx");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, weight] : a) {
    EXPECT_EQ(std::memcmp(weight.raw(), b.at(name).raw(), weight.byte_size()), 0) << name;
  }
  // On one process it continues with the same global batch, and says so.
  Program alone =
      RunCastor(dir_, absl::StrCat("train --resume ", (whole / "ckpt-00000004.onnx").string(),
                                   " --data ", data_,
                                   " --threads 1 --epochs 10 --max-steps 5 "
                                   "--checkpoint-dir ",
                                   (dir_ / "alone").string()));
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  EXPECT_THAT(alone.err, HasSubstr("the checkpoint trained on 2 rank(s); this run has 1: it "
                                   "continues with the same global batch"));
}

TEST_F(DistributedTrainTest, BadConfigurationsExitTwoOnEveryRank) {
  SKIP_WITHOUT_GLOO();
  const std::string castor = CASTOR_BINARY;
  Program p = RunCastor(dir_, TrainArgs("--max-steps 1"), "env WORLD_SIZE=2 " + castor);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("WORLD_SIZE is set but RANK is not"));
  p = RunCastor(dir_, TrainArgs("--max-steps 1"),
                "env RANK=2 WORLD_SIZE=2 MASTER_PORT=29999 " + castor);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("RANK=2: expected an integer in [0, 2)"));
  p = RunCastor(dir_, TrainArgs("--max-steps 1 --nproc 2"), "env RANK=0 " + castor);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("--nproc starts its own ranks, but RANK is set"));
  p = RunCastor(dir_, TrainArgs("--max-steps 1 --nproc 2"), "env OMPI_COMM_WORLD_SIZE=2 " + castor);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("--nproc starts its own ranks, but OMPI_COMM_WORLD_SIZE is set "
                               "(by Open MPI's mpirun?)"));
  // A global batch the ranks cannot share: both ranks say so, the launcher
  // names the first that stopped and exits 2 too.
  p = RunCastor(dir_, TrainArgs("--max-steps 1 --nproc 2", "63"));
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_THAT(p.err, HasSubstr("rank 0 of 2: --batch 63 (the global batch) is not a multiple "
                               "of the 2 ranks"));
  EXPECT_THAT(p.err, HasSubstr("rank 1 of 2: --batch 63"));
  EXPECT_THAT(p.err, HasSubstr("exited with code 2"));
}

// Starts `castor train` as rank `rank` of 2 with its output in files;
// returns its pid.
pid_t StartRank(const fs::path& dir, int rank, int port, const std::string& arguments,
                const std::string& environment = "") {
  const std::string command = absl::StrCat(
      "exec env RANK=", rank, " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=", port, " ",
      environment, " ", CASTOR_BINARY, " ", arguments, " >", (dir / absl::StrCat("out", rank)).string(), " 2>",
      (dir / absl::StrCat("err", rank)).string());
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Buckets all-reduced while the backward pass runs give the same losses and
// weights as one allreduce after it (on 2 ranks each sum is a + b either
// way), in more buckets.
TEST_F(DistributedTrainTest, OverlappedBucketsMatchOneAllreduceAfterTheBackwardPass) {
  SKIP_WITHOUT_GLOO();
  std::map<std::string, std::vector<double>> losses;
  std::map<std::string, std::map<std::string, Tensor>> weights;
  for (const std::string bucket_mb : {"0", "0.25"}) {
    const fs::path checkpoints = dir_ / ("ckpt" + bucket_mb);
    const fs::path metrics = dir_ / ("metrics" + bucket_mb + ".jsonl");
    Program p = RunCastor(
        dir_, TrainArgs(absl::StrCat("--max-steps 8 --nproc 2 --bucket-mb ", bucket_mb,
                                     " --metrics ", metrics.string(), " --checkpoint-dir ",
                                     checkpoints.string(), " --save-every 8")));
    ASSERT_EQ(p.exit_code, 0) << p.err;
    losses[bucket_mb] = MetricsLosses(metrics);
    weights[bucket_mb] = CheckpointWeights(checkpoints / "ckpt-00000008.onnx");
    int buckets = 0;
    for (absl::string_view line : absl::StrSplit(ReadFile(metrics), '\n')) {
      absl::StatusOr<Json> json = Json::Parse(std::string(line));
      if (json.ok() && json->Find("allreduce_buckets") != nullptr) {
        buckets = static_cast<int>(json->Find("allreduce_buckets")->as_int());
      }
    }
    // 2.55 MiB: one bucket, or several of at least 0.25 MiB (a gradient
    // is never split: fc2's and fc1's weight gradients, 1 and 1.5 MiB, each
    // close one).
    if (bucket_mb == "0") {
      EXPECT_EQ(buckets, 1);
    } else {
      EXPECT_GE(buckets, 3);
    }
  }
  ASSERT_EQ(losses["0"].size(), 8u);
  EXPECT_EQ(losses["0"], losses["0.25"]);
  ASSERT_FALSE(weights["0"].empty());
  for (const auto& [name, weight] : weights["0"]) {
    const Tensor& other = weights["0.25"].at(name);
    EXPECT_EQ(std::memcmp(weight.raw(), other.raw(), weight.byte_size()), 0) << name;
  }
}

// --sync-batchnorm: the ResNet's BatchNormalization on 2 ranks x 8 rows
// normalises with the statistics of all 16, so the run matches one process
// on the whole batch (losses, weights and running statistics), where each
// rank's own statistics (DDP's default) do not.
TEST_F(DistributedTrainTest, SyncBatchNormMatchesOneProcessOnTheWholeBatch) {
  SKIP_WITHOUT_GLOO();
  auto train = [&](const std::string& name, const std::string& extra) {
    const fs::path checkpoints = dir_ / name;
    Program p = RunCastor(
        dir_, absl::StrCat("train ", CASTOR_SOURCE_DIR, "/models/resnet_opset17.onnx --data ",
                           data_, " --policy float32 --optimizer sgd --momentum 0.9 --lr 0.05 "
                           "--batch 16 --max-steps 6 --threads 1 --save-every 6 --metrics ",
                           (dir_ / (name + ".jsonl")).string(), " --checkpoint-dir ",
                           checkpoints.string(), " ", extra));
    EXPECT_EQ(p.exit_code, 0) << name << ": " << p.err;
    return std::make_pair(MetricsLosses(dir_ / (name + ".jsonl")),
                          CheckpointWeights(checkpoints / "ckpt-00000006.onnx"));
  };
  const auto [one_losses, one_weights] = train("one", "");
  const auto [synced_losses, synced_weights] = train("synced", "--nproc 2 --sync-batchnorm");
  const auto [own_losses, own_weights] = train("own", "--nproc 2");
  // Buckets of 10 KiB: gradient allreduces in flight while the backward
  // pass's BatchNormalization sums go through the same thread, in order.
  const auto [bucketed_losses, bucketed_weights] =
      train("bucketed", "--nproc 2 --sync-batchnorm --bucket-mb 0.01");
  EXPECT_EQ(bucketed_losses, synced_losses);
  ASSERT_EQ(one_losses.size(), 6u);
  ASSERT_EQ(synced_losses.size(), 6u);
  ASSERT_EQ(own_losses.size(), 6u);
  double own_differs = 0;
  for (size_t k = 0; k < one_losses.size(); ++k) {
    EXPECT_NEAR(synced_losses[k], one_losses[k], 1e-6 * std::abs(one_losses[k])) << "step " << k + 1;
    own_differs = std::max(own_differs, std::abs(own_losses[k] - one_losses[k]));
  }
  EXPECT_GT(own_differs, 1e-4) << "per-rank statistics should change the losses";
  // Weights and running statistics (float32 initializers of the checkpoint).
  ASSERT_FALSE(one_weights.empty());
  absl::StatusOr<training::Checkpoint> checkpoint =
      training::ReadCheckpoint((dir_ / "one" / "ckpt-00000006.onnx").string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_FALSE(checkpoint->state.running_stats.empty());
  for (const std::string& statistic : checkpoint->state.running_stats) {
    const Value* expected = checkpoint->model.graph->FindValue(statistic);
    absl::StatusOr<training::Checkpoint> synced =
        training::ReadCheckpoint((dir_ / "synced" / "ckpt-00000006.onnx").string());
    ASSERT_TRUE(synced.ok()) << synced.status();
    const Value* actual = synced->model.graph->FindValue(statistic);
    ASSERT_NE(expected, nullptr);
    ASSERT_NE(actual, nullptr);
    const Tensor& e = *expected->initializer();
    const Tensor& a = *actual->initializer();
    ASSERT_EQ(a.num_elements(), e.num_elements()) << statistic;
    for (int64_t i = 0; i < e.num_elements(); ++i) {
      ASSERT_NEAR(a.data<float>()[i], e.data<float>()[i], 1e-5 * (1 + std::abs(e.data<float>()[i])))
          << statistic << "[" << i << "]";
    }
  }
  for (const auto& [name, expected] : one_weights) {
    const Tensor& weight = synced_weights.at(name);
    for (int64_t i = 0; i < weight.num_elements(); ++i) {
      ASSERT_NEAR(weight.data<float>()[i], expected.data<float>()[i], 1e-5) << name;
    }
  }
  // The checkpoint says so; a resume without the flag says what changes.
  absl::StatusOr<training::Checkpoint> synced =
      training::ReadCheckpoint((dir_ / "synced" / "ckpt-00000006.onnx").string());
  ASSERT_TRUE(synced.ok()) << synced.status();
  const Json* recorded = synced->state.extra.Find("sync_batchnorm");
  ASSERT_NE(recorded, nullptr);
  EXPECT_TRUE(recorded->as_bool());
  Program resumed = RunCastor(dir_, absl::StrCat("train --resume ", (dir_ / "synced").string(),
                                                 " --max-steps 7 --nproc 2"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_THAT(resumed.err, HasSubstr("synchronised BatchNormalization across its ranks "
                                     "(--sync-batchnorm); this run does not"));
}

// As on two hosts: each rank with a temporary directory of its own. The
// ranks exchange their Gloo addresses through rank 0 (rendezvous_store.h),
// so nothing but MASTER_ADDR:MASTER_PORT is shared.
TEST_F(DistributedTrainTest, RanksSharingNothingButThePortTrainTogether) {
  SKIP_WITHOUT_GLOO();
  const int port = FreePort();
  pid_t pids[2];
  for (int rank = 0; rank < 2; ++rank) {
    const fs::path own = dir_ / absl::StrCat("tmp", rank);
    fs::create_directories(own);
    pids[rank] = StartRank(
        dir_, rank, port,
        TrainArgs(absl::StrCat("--max-steps 3 --dist-timeout 30 --metrics ",
                               (dir_ / absl::StrCat("metrics", rank, ".jsonl")).string())),
        absl::StrCat("TMPDIR=", own.string()));
  }
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    waitpid(pids[rank], &status, 0);
    ASSERT_TRUE(WIFEXITED(status)) << "rank " << rank;
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "rank " << rank << ": " << ReadFile(dir_ / absl::StrCat("err", rank));
  }
  EXPECT_EQ(MetricsLosses(dir_ / "metrics0.jsonl").size(), 3u);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(fs::is_empty(dir_ / absl::StrCat("tmp", rank))) << "rank " << rank;
  }
}

// `mpirun -np 2 castor train` (Open MPI, as tools/setup.sh installs it):
// the ranks come from OMPI_COMM_WORLD_RANK/SIZE and match --nproc 2.
TEST_F(DistributedTrainTest, MpirunStartsTheRanks) {
  SKIP_WITHOUT_GLOO();
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no mpirun (Debian's openmpi-bin; tools/setup.sh installs it)";
  }
  Program nproc = RunCastor(
      dir_, TrainArgs(absl::StrCat("--max-steps 6 --nproc 2 --metrics ",
                                   (dir_ / "nproc.jsonl").string())));
  ASSERT_EQ(nproc.exit_code, 0) << nproc.err;
  const std::string launcher = absl::StrCat(
      "mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT=", FreePort(), " ",
      CASTOR_BINARY);
  Program mpi = RunCastor(
      dir_,
      TrainArgs(absl::StrCat("--max-steps 6 --metrics ", (dir_ / "mpi.jsonl").string())),
      launcher);
  ASSERT_EQ(mpi.exit_code, 0) << mpi.out << mpi.err;
  EXPECT_THAT(mpi.out, HasSubstr("batch 64 (32 per rank on 2 ranks, Gloo)"));
  EXPECT_EQ(mpi.out.find("summary:"), mpi.out.rfind("summary:")) << mpi.out;
  EXPECT_EQ(MetricsLosses(dir_ / "mpi.jsonl"), MetricsLosses(dir_ / "nproc.jsonl"));
  EXPECT_EQ(MetricsLosses(dir_ / "mpi.jsonl").size(), 6u);
}

TEST_F(DistributedTrainTest, RanksThatDisagreeOnTheDataAllStop) {
  SKIP_WITHOUT_GLOO();
  const int port = FreePort();
  const std::string other_data =
      absl::StrCat((dir_ / "test_x.npy").string(), ",", (dir_ / "test_y.npy").string());
  const pid_t rank0 = StartRank(dir_, 0, port, TrainArgs("--dist-timeout 30", "16", "1"));
  const pid_t rank1 =
      StartRank(dir_, 1, port, TrainArgs("--dist-timeout 30", "16", "1", other_data));
  int status0 = 0, status1 = 0;
  waitpid(rank0, &status0, 0);
  waitpid(rank1, &status1, 0);
  ASSERT_TRUE(WIFEXITED(status0) && WIFEXITED(status1));
  EXPECT_EQ(WEXITSTATUS(status0), 2);
  EXPECT_EQ(WEXITSTATUS(status1), 2);
  EXPECT_THAT(ReadFile(dir_ / "err1"),
              HasSubstr("rank 1 of 2: this rank's training settings (flags or checkpoint), "
                        "training data differ(s) from rank 0's"));
  EXPECT_THAT(ReadFile(dir_ / "err0"),
              HasSubstr("rank 0 of 2: 1 rank(s) start from another castor version, settings, "
                        "data or weights than rank 0"));
}

TEST_F(DistributedTrainTest, AKilledRankStopsTheOtherWithinTheTimeout) {
  SKIP_WITHOUT_GLOO();
  const int port = FreePort();
  const std::string arguments =
      TrainArgs(absl::StrCat("--dist-timeout 20 --metrics ", (dir_ / "metrics.jsonl").string()),
                "64", "1000");
  const pid_t rank0 = StartRank(dir_, 0, port, arguments);
  const pid_t rank1 = StartRank(dir_, 1, port, arguments);
  // Let them train a few steps, then kill rank 1.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (MetricsLosses(dir_ / "metrics.jsonl").size() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (MetricsLosses(dir_ / "metrics.jsonl").size() < 3u) {
    kill(rank0, SIGKILL);
    kill(rank1, SIGKILL);
    waitpid(rank0, nullptr, 0);
    waitpid(rank1, nullptr, 0);
    FAIL() << "no 3 steps in 60 s: " << ReadFile(dir_ / "err0") << ReadFile(dir_ / "err1");
  }
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  waitpid(rank1, &status, 0);
  // Rank 0 must stop by itself within the timeout (20 s): poll for it.
  pid_t done = 0;
  while ((done = waitpid(rank0, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - killed < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (done == 0) {
    kill(rank0, SIGKILL);
    waitpid(rank0, &status, 0);
    FAIL() << "rank 0 still ran 30 s after rank 1 was killed";
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(seconds, 20.0 + 5.0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string err = ReadFile(dir_ / "err0");
  // Of the gradients, or of the accuracy counts that follow each step.
  EXPECT_THAT(err, testing::ContainsRegex("rank 0 of 2: allreduce of the (loss and gradients|"
                                          "accuracy counts) of step"));
  EXPECT_THAT(err, HasSubstr("another rank stopped"));
  EXPECT_EQ(err.find("rank 0 of 2:"), err.rfind("rank 0 of 2:")) << err;  // named once
  RecordProperty("rank0_stop_seconds", std::to_string(seconds));
}

TEST_F(DistributedTrainTest, AHungRankStopsTheOtherWithinTheTimeout) {
  SKIP_WITHOUT_GLOO();
  const int port = FreePort();
  const std::string arguments = TrainArgs(
      absl::StrCat("--dist-timeout 3 --metrics ", (dir_ / "metrics.jsonl").string()), "64",
      "1000");
  const pid_t rank0 = StartRank(dir_, 0, port, arguments);
  const pid_t rank1 = StartRank(dir_, 1, port, arguments);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (MetricsLosses(dir_ / "metrics.jsonl").size() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Rank 1 stops answering (alive, its connections open).
  ASSERT_EQ(kill(rank1, SIGSTOP), 0);
  const auto stopped = std::chrono::steady_clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(rank0, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - stopped < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  kill(rank1, SIGKILL);
  waitpid(rank1, nullptr, 0);
  if (done == 0) {
    kill(rank0, SIGKILL);
    waitpid(rank0, &status, 0);
    FAIL() << "rank 0 still ran 30 s after rank 1 hung (--dist-timeout 3)";
  }
  EXPECT_GE(seconds, 2.0);  // it waited for the timeout ...
  EXPECT_LT(seconds, 3.0 + 7.0);  // ... and not much longer
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_THAT(ReadFile(dir_ / "err0"), HasSubstr("rank 0 of 2: allreduce of"));
  RecordProperty("rank0_stop_seconds", std::to_string(seconds));
}

}  // namespace
}  // namespace castor::tools
