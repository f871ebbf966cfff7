// Data-parallel training's device collectives on the CUDA backend (NCCL,
// backend/cuda/nccl_collectives.cc), on a GPU:
//  - one GPU: a world of one joins with a freshly drawn group id (which
//    survives a copy through bytes, as the Gloo broadcast carries it) and
//    averages float32, float16 and bfloat16 buffers without changing a bit;
//    bad ids, ranks and dtypes are refused by name; a trainer in a world of
//    one averages through NCCL and steps exactly as a trainer alone;
//  - two GPUs or more: two ranks, a thread and a device each, average
//    bit for bit alike (exact averages where they are representable, an
//    inf on one rank reaching both), and `castor train --nproc 2 --backend
//    cuda` on the sample CNN matches one process at the same global batch
//    within the CPU distributed tests' tolerances (losses 1e-6 relative,
//    weights 1e-5); with one GPU, --nproc 2 --backend cuda is refused
//    naming both counts.
// Everything skips, saying why, without a GPU; the NCCL cases skip without
// NCCL on the machine (a missing libnccl.so.2; any other loading error
// fails), and the two-rank cases say how many GPUs they need.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "backend/cuda_backend.h"
#include "backend/cuda_probe.h"
#include "backend/device_collectives.h"
#include "gmock/gmock.h"
#include "graph/json.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "passes/training_graph.h"
#include "tests/cli_test_util.h"
#include "tests/cuda_test_util.h"
#include "tests/trainer_test_util.h"
#include "training/checkpoint.h"
#include "training/distributed/communicator.h"
#include "training/distributed/launcher.h"
#include "training/npy.h"
#include "training/trainer.h"

namespace castor::tools {
namespace {

using ::castor::testing::CudaFloatTypes;
using ::castor::testing::Gpu;
using ::castor::testing::Make;
using ::castor::testing::RandomTensor;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::chrono::seconds kTimeout(60);

// Skips without NCCL on the machine (saying so); any other loading
// failure fails the test.
#define CASTOR_REQUIRE_NCCL(backend)                                               \
  do {                                                                             \
    ASSERT_NE((backend).device_collectives(), nullptr)                             \
        << (backend).name() << " offers no device collectives";                    \
    const absl::Status castor_nccl_loaded_ = (backend).device_collectives()->Load(); \
    if (!castor_nccl_loaded_.ok() &&                                               \
        absl::StrContains(castor_nccl_loaded_.message(), "cannot open shared object file")) { \
      GTEST_SKIP() << "no NCCL on this machine: " << castor_nccl_loaded_.message();  \
    }                                                                              \
    ASSERT_TRUE(castor_nccl_loaded_.ok()) << castor_nccl_loaded_;                  \
  } while (0)

// A copy of a host tensor in a backend's memory, freed with it.
class DeviceTensor {
 public:
  DeviceTensor(Backend& backend, const Tensor& host) : backend_(backend) {
    view_ = TensorView{nullptr, host.dtype(), host.dims()};
    if (host.byte_size() == 0) return;
    absl::StatusOr<void*> data = backend.Allocate(host.byte_size());
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok()) return;
    view_.data = *data;
    EXPECT_TRUE(backend.CopyFromHost(view_.data, host.raw(), host.byte_size()).ok());
  }
  ~DeviceTensor() { backend_.Free(view_.data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  const TensorView& view() const { return view_; }
  Tensor Read() const {
    Tensor host(view_.dtype, view_.dims);
    EXPECT_TRUE(backend_.CopyToHost(host.raw(), view_.data, host.byte_size()).ok());
    return host;
  }

 private:
  Backend& backend_;
  TensorView view_;
};

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.byte_size() == b.byte_size() &&
         std::memcmp(a.raw(), b.raw(), a.byte_size()) == 0;
}

// --- one GPU: a world of one --------------------------------------------------

TEST(CudaCollectivesTest, AWorldOfOneKeepsEveryBitAndTheGroupIdRoundTrips) {
  CASTOR_REQUIRE_CUDA();
  Backend& gpu = Gpu();
  CASTOR_REQUIRE_NCCL(gpu);
  DeviceCollectives& nccl = *gpu.device_collectives();
  EXPECT_EQ(nccl.library(), "NCCL");
  ASSERT_EQ(nccl.group_id_bytes(), 128u);
  absl::StatusOr<std::string> id = nccl.NewGroupId();
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(id->size(), 128u);
  absl::StatusOr<std::string> another = nccl.NewGroupId();
  ASSERT_TRUE(another.ok()) << another.status();
  EXPECT_NE(*another, *id) << "two draws gave the same group id";
  // The id as the other ranks get it: bytes through a buffer.
  std::vector<char> wire(id->begin(), id->end());
  const std::string received(wire.begin(), wire.end());

  absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> short_id =
      nccl.Join(received.substr(0, 100), 0, 1, kTimeout);
  EXPECT_EQ(short_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_id.status().message(),
              HasSubstr("rank 0 of 1: NCCL: a group id of 100 bytes; NCCL's has 128"));
  absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> bad_rank =
      nccl.Join(received, 1, 1, kTimeout);
  EXPECT_EQ(bad_rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_rank.status().message(), HasSubstr("rank 1 of 1: NCCL: a rank must be in"));

  absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> group =
      nccl.Join(received, 0, 1, kTimeout);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->rank(), 0);
  EXPECT_EQ((*group)->world_size(), 1);
  EXPECT_THAT((*group)->engine(), StartsWith("NCCL 2."));
  absl::StatusOr<double> idle = (*group)->Wait("nothing queued");
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_EQ(*idle, 0.0);
  for (DType dtype : CudaFloatTypes()) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor a = RandomTensor(dtype, {1000}, 7), b = RandomTensor(dtype, {3}, 8, -1e4, 1e4);
    const Tensor empty(dtype, {0});
    DeviceTensor da(gpu, a), db(gpu, b), de(gpu, empty);
    ASSERT_TRUE((*group)->AverageInPlace({da.view(), db.view(), de.view()}, "a world of one").ok());
    absl::StatusOr<double> seconds = (*group)->Wait("a world of one");
    ASSERT_TRUE(seconds.ok()) << seconds.status();
    EXPECT_GE(*seconds, 0.0);
    EXPECT_TRUE(SameBits(da.Read(), a));
    EXPECT_TRUE(SameBits(db.Read(), b));
  }
  const Tensor labels = Make(DType::kInt64, {2}, {1, 2});
  DeviceTensor dl(gpu, labels);
  const absl::Status refused = (*group)->AverageInPlace({dl.view()}, "labels");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("rank 0 of 1: NCCL: labels: buffer 0 of 1 is int64; NCCL averages "
                        "float32, float16 or bfloat16"));
  // The group still works after a refused call.
  const Tensor c = RandomTensor(DType::kFloat32, {17}, 9);
  DeviceTensor dc(gpu, c);
  ASSERT_TRUE((*group)->AverageInPlace({dc.view()}, "after").ok());
  ASSERT_TRUE((*group)->Wait("after").ok());
  EXPECT_TRUE(SameBits(dc.Read(), c));
}

Model LoadSample(const std::string& name) {
  absl::StatusOr<Model> model =
      LoadModel(std::string(CASTOR_SOURCE_DIR) + "/models/" + name + ".onnx");
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(InferTypes(*model).ok());
  return std::move(*model);
}

std::unique_ptr<training::Trainer> MakeTrainer(Backend& backend,
                                               training::TrainerOptions options) {
  Model model = LoadSample("cnn_opset17");
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, TrainingGraphOptions{});
  EXPECT_TRUE(graph.ok()) << graph.status();
  options.optimizer.kind = OptimizerKind::kSgd;
  options.optimizer.momentum = 0.9;
  options.lr.base_lr = 0.05;
  options.replay_steps = false;  // the same node-by-node kernels on both sides
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(std::move(model), *graph, options, backend);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return trainer.ok() ? std::move(*trainer) : nullptr;
}

std::pair<Tensor, Tensor> Batch(int index, int64_t n = 16) {
  std::mt19937 rng(2000 + index);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Tensor images(DType::kFloat32, {n, 1, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) images.data<float>()[i] = pixel(rng);
  Tensor labels(DType::kInt64, {n});
  for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = (3 * i + index) % 10;
  return {std::move(images), std::move(labels)};
}

// A trainer in a data-parallel world of one (a Gloo communicator of one
// rank) averages its loss and gradients through NCCL, one group a step,
// and steps exactly as a trainer on its own.
TEST(CudaCollectivesTest, ATrainerInAWorldOfOneAveragesThroughNcclAndStepsAsOneAlone) {
  CASTOR_REQUIRE_CUDA();
  CASTOR_REQUIRE_NCCL(Gpu());
  if (!distributed::CollectivesAvailable()) GTEST_SKIP() << "castor was built without Gloo";
  absl::StatusOr<int> port = distributed::FreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  distributed::DistributedConfig config;
  config.master_port = *port;
  config.timeout = kTimeout;
  absl::StatusOr<std::unique_ptr<distributed::Communicator>> communicator =
      distributed::Connect(config);
  ASSERT_TRUE(communicator.ok()) << communicator.status();
  training::TrainerOptions ranked_options;
  ranked_options.communicator = communicator->get();
  ranked_options.collective_timeout = kTimeout;
  std::unique_ptr<training::Trainer> alone = MakeTrainer(Gpu(), {});
  std::unique_ptr<training::Trainer> ranked = MakeTrainer(Gpu(), ranked_options);
  ASSERT_TRUE(alone && ranked);
  EXPECT_EQ(alone->allreduce_engine(), "");
  EXPECT_THAT(ranked->allreduce_engine(), StartsWith("NCCL 2."));
  EXPECT_THAT(ranked->replay_unavailable(), HasSubstr("is not recorded"));
  int64_t elements = 1;  // the loss
  for (const auto& [name, tensor] : StateOf(*alone)) elements += tensor.num_elements();
  for (int step = 0; step < 4; ++step) {
    auto [images, labels] = Batch(step);
    absl::StatusOr<training::StepResult> a = alone->Step({{"input", images}}, labels);
    absl::StatusOr<training::StepResult> b = ranked->Step({{"input", images}}, labels);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " / " << b.status();
    EXPECT_EQ(a->loss, b->loss) << "step " << step + 1;
    EXPECT_EQ(a->allreduce_buckets, 0);
    EXPECT_EQ(b->allreduce_buckets, 1) << "step " << step + 1;
    EXPECT_EQ(b->allreduce_bytes, 4 * elements) << "step " << step + 1;  // float32 gradients
    EXPECT_GE(b->allreduce_seconds, 0.0) << "step " << step + 1;
    EXPECT_EQ(b->allreduce_wait_seconds, b->allreduce_seconds);
  }
  const std::map<std::string, Tensor> ranked_state = StateOf(*ranked);
  for (const auto& [name, tensor] : StateOf(*alone)) {
    EXPECT_TRUE(SameBits(ranked_state.at(name), tensor)) << name;
  }
}

// --- two GPUs: two ranks ------------------------------------------------------

// Skips unless there are at least 2 GPUs, saying how many there are.
#define CASTOR_REQUIRE_TWO_GPUS()                                                       \
  do {                                                                                   \
    const CudaProbe castor_probe_ = ProbeCuda();                                         \
    if (castor_probe_.device_count < 2) {                                                \
      GTEST_SKIP() << "two ranks need two GPUs (one each); this machine has "            \
                   << castor_probe_.device_count;                                        \
    }                                                                                    \
  } while (0)

TEST(CudaCollectivesTest, TwoRanksOnTwoDevicesEndWithTheSameBits) {
  CASTOR_REQUIRE_CUDA();
  CASTOR_REQUIRE_TWO_GPUS();
  CASTOR_REQUIRE_NCCL(Gpu());
  constexpr int64_t kExact = 1000, kRandom = 4096;
  // Rank r's values: even integers in [-40, 40] (their averages are
  // integers, exact in every dtype), element 7 inf on rank 1; and random
  // float32 values.
  auto exact_values = [](int rank) {
    std::vector<double> v(kExact);
    for (int64_t i = 0; i < kExact; ++i) {
      v[i] = rank == 0 ? 2.0 * ((i * 5) % 41) - 40 : 2.0 * ((i * 11) % 37) - 36;
    }
    if (rank == 1) v[7] = INFINITY;
    return v;
  };
  std::promise<std::string> drawn;
  std::shared_future<std::string> id = drawn.get_future().share();
  // [rank][dtype index], then each rank's averaged random float32 values.
  std::vector<std::vector<Tensor>> exact(2, std::vector<Tensor>(3));
  std::vector<Tensor> random(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      CudaBackendOptions options;
      options.device = rank;
      absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend(options);
      if (rank == 0) {
        absl::StatusOr<std::string> made =
            backend.ok() ? (*backend)->device_collectives()->NewGroupId()
                         : absl::StatusOr<std::string>(backend.status());
        EXPECT_TRUE(made.ok()) << made.status();
        drawn.set_value(made.ok() ? *made : std::string());
      }
      ASSERT_TRUE(backend.ok()) << backend.status();
      ASSERT_EQ(id.get().size(), 128u) << "rank 0 drew no group id";
      absl::StatusOr<std::unique_ptr<DeviceCollectiveGroup>> group =
          (*backend)->device_collectives()->Join(id.get(), rank, 2, kTimeout);
      ASSERT_TRUE(group.ok()) << group.status();
      for (size_t d = 0; d < CudaFloatTypes().size(); ++d) {
        const Tensor values = Make(CudaFloatTypes()[d], {kExact}, exact_values(rank));
        const Tensor other = RandomTensor(DType::kFloat32, {kRandom}, 100 + rank);
        DeviceTensor dv(**backend, values), dr(**backend, other);
        ASSERT_TRUE((*group)->AverageInPlace({dv.view(), dr.view()}, "two ranks").ok());
        absl::StatusOr<double> seconds = (*group)->Wait("two ranks");
        ASSERT_TRUE(seconds.ok()) << seconds.status();
        exact[rank][d] = dv.Read();
        if (d == 0) random[rank] = dr.Read();
      }
      group->reset();  // before its backend
    });
  }
  for (std::thread& thread : ranks) thread.join();
  const std::vector<double> a = exact_values(0), b = exact_values(1);
  for (size_t d = 0; d < CudaFloatTypes().size(); ++d) {
    SCOPED_TRACE(DTypeName(CudaFloatTypes()[d]));
    ASSERT_EQ(exact[0][d].num_elements(), kExact);
    EXPECT_TRUE(SameBits(exact[0][d], exact[1][d])) << "the ranks' averages differ";
    for (int64_t i = 0; i < kExact; ++i) {
      const double got = exact[0][d].GetDouble(i);
      if (i == 7) {
        EXPECT_FALSE(std::isfinite(got)) << "rank 1's inf did not reach rank 0";
      } else {
        ASSERT_EQ(got, (a[i] + b[i]) / 2) << "element " << i;
      }
    }
  }
  ASSERT_EQ(random[0].num_elements(), kRandom);
  EXPECT_TRUE(SameBits(random[0], random[1])) << "the ranks' float32 averages differ";
  const Tensor r0 = RandomTensor(DType::kFloat32, {kRandom}, 100);
  const Tensor r1 = RandomTensor(DType::kFloat32, {kRandom}, 101);
  for (int64_t i = 0; i < kRandom; ++i) {
    const double expected = (r0.GetDouble(i) + r1.GetDouble(i)) / 2;
    ASSERT_NEAR(random[0].GetDouble(i), expected, 1.2e-7 * std::abs(expected) + 1e-30)
        << "element " << i;
  }
}

// --- castor train --nproc 2 --backend cuda ----------------------------------------

class CudaDataParallelTrainTest : public CliTempDirTest {
 protected:
  CudaDataParallelTrainTest() : CliTempDirTest("cuda_data_parallel") {}

  void SetUp() override {
    CliTempDirTest::SetUp();
    std::mt19937 rng(5);
    WriteImageSplit(dir_, "train", 256, 3, rng);
    WriteImageSplit(dir_, "test", 32, 3, rng);
  }

  // `castor train` on the sample CNN, float32 and SGD, 20 steps of a
  // global batch of 64 (4 steps an epoch), on the GPU.
  std::string TrainArgs(const std::string& extra) const {
    const std::string d = dir_.string();
    return absl::StrCat("train ", CASTOR_SOURCE_DIR, "/models/cnn_opset17.onnx --data ", d,
                        "/train_x.npy,", d, "/train_y.npy,", d, "/test_x.npy,", d,
                        "/test_y.npy --policy float32 --optimizer sgd --momentum 0.9 --lr 0.05 "
                        "--batch 64 --epochs 5 --max-steps 20 --backend cuda --dist-timeout 120 ",
                        extra);
  }

};

TEST_F(CudaDataParallelTrainTest, TwoRanksOnTwoGpusMatchOneProcessOrAreRefusedOnOne) {
  CASTOR_REQUIRE_CUDA();
  if (!distributed::CollectivesAvailable()) {
    GTEST_SKIP() << "castor was built without Gloo (--nproc needs it)";
  }
  const CudaProbe probe = ProbeCuda();
  const std::filesystem::path one = dir_ / "one", two = dir_ / "two";
  Program pair = RunCastor(dir_, TrainArgs(absl::StrCat("--nproc 2 --metrics ",
                                                        (dir_ / "two.jsonl").string(),
                                                        " --checkpoint-dir ", two.string())));
  if (probe.device_count < 2) {
    EXPECT_EQ(pair.exit_code, 2) << pair.err;
    EXPECT_THAT(pair.err, HasSubstr(absl::StrCat("2 data-parallel ranks on this host but ",
                                                 probe.device_count, " CUDA device(s)")));
    return;
  }
  absl::StatusOr<std::string> nccl = LoadCudaCollectivesLibrary();
  if (!nccl.ok()) {  // every rank stops, naming the library
    EXPECT_EQ(pair.exit_code, 2) << pair.err;
    EXPECT_THAT(pair.err, HasSubstr("data-parallel training on cuda needs NCCL (libnccl.so.2)"));
    return;
  }
  ASSERT_EQ(pair.exit_code, 0) << pair.err;
  Program single = RunCastor(
      dir_, TrainArgs(absl::StrCat("--metrics ", (dir_ / "one.jsonl").string(),
                                   " --checkpoint-dir ", one.string())));
  ASSERT_EQ(single.exit_code, 0) << single.err;
  EXPECT_THAT(pair.out, HasSubstr(absl::StrCat("batch 64 (32 per rank on 2 ranks, ", *nccl, ")")));
  EXPECT_THAT(pair.out, HasSubstr(absl::StrCat("  allreduce       ", *nccl, ": ")));
  EXPECT_THAT(pair.out, HasSubstr(" in 1 bucket(s), "));
  ASSERT_NO_FATAL_FAILURE(ExpectSameTraining(dir_ / "one.jsonl", one / "ckpt-00000020.onnx",
                                             dir_ / "two.jsonl", two / "ckpt-00000020.onnx", 20));
}

}  // namespace
}  // namespace castor::tools
