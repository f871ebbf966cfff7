// Executor tests on a FakeBackend: host memory with its own tiny kernel
// table (Relu, Neg, Add; float32), so they do not depend on the CPU kernels.
// They check outputs, plan caching per shape signature, buffer reuse and
// in-place decisions (taken only when safe), resident/kept tensors, the
// feed and missing-kernel error messages, and that every buffer is freed.
#include "backend/executor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "graph/shape_inference.h"

namespace castor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::Status Unary(KernelContext& ctx, float (*fn)(float)) {
  const TensorView& x = ctx.input(0);
  absl::StatusOr<TensorView*> y = ctx.Output(0, x.dims);
  if (!y.ok()) return y.status();
  for (int64_t i = 0; i < x.num_elements(); ++i) (*y)->as<float>()[i] = fn(x.as<float>()[i]);
  return absl::OkStatus();
}
absl::Status ReluKernel(KernelContext& ctx) {
  return Unary(ctx, [](float v) { return v > 0 ? v : 0.0f; });
}
absl::Status NegKernel(KernelContext& ctx) {
  return Unary(ctx, [](float v) { return -v; });
}
// Same-shape Add only (enough for these tests).
absl::Status AddKernel(KernelContext& ctx) {
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  if (a.dims != b.dims) return ctx.Error("fake Add needs equal shapes");
  absl::StatusOr<TensorView*> y = ctx.Output(0, a.dims);
  if (!y.ok()) return y.status();
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    (*y)->as<float>()[i] = a.as<float>()[i] + b.as<float>()[i];
  }
  return absl::OkStatus();
}

// Equal of a [C] row against each row of b [R, C], element by element, so
// an output sharing a's buffer would overwrite a while it is still read.
absl::Status EqualRowsKernel(KernelContext& ctx) {
  const TensorView& a = ctx.input(0);
  const TensorView& b = ctx.input(1);
  const int64_t columns = a.num_elements();
  absl::StatusOr<TensorView*> y = ctx.Output(0, DType::kBool, b.dims);
  if (!y.ok()) return y.status();
  for (int64_t i = 0; i < b.num_elements(); ++i) {
    (*y)->as<uint8_t>()[i] = a.as<float>()[i % columns] == b.as<float>()[i];
  }
  return absl::OkStatus();
}

// What the fake Reshape kernel saw of its shape input's host copy, by node.
std::map<std::string, std::optional<std::vector<int64_t>>>& SeenHostShapes() {
  static auto* seen = new std::map<std::string, std::optional<std::vector<int64_t>>>();
  return *seen;
}
// Shape, handing the executor a host copy of its output.
absl::Status ShapeKernel(KernelContext& ctx) {
  const std::vector<int64_t>& dims = ctx.input(0).dims;
  absl::StatusOr<TensorView*> y =
      ctx.Output(0, DType::kInt64, {static_cast<int64_t>(dims.size())});
  if (!y.ok()) return y.status();
  std::memcpy((*y)->data, dims.data(), dims.size() * sizeof(int64_t));
  ctx.SetHostCopy(0, Tensor::FromVector<int64_t>(DType::kInt64, {(*y)->dims[0]}, dims));
  return absl::OkStatus();
}
// Reshape that records whether its shape came with a host copy.
absl::Status RecordingReshapeKernel(KernelContext& ctx) {
  const TensorView& shape = ctx.input(1);
  std::optional<std::vector<int64_t>>& seen = SeenHostShapes()[ctx.node().name()];
  seen.reset();
  if (shape.host_data != nullptr) {
    const auto* values = static_cast<const int64_t*>(shape.host_data);
    seen = std::vector<int64_t>(values, values + shape.num_elements());
  }
  std::vector<int64_t> dims(shape.as<int64_t>(), shape.as<int64_t>() + shape.num_elements());
  absl::StatusOr<TensorView*> y = ctx.Output(0, dims);
  if (!y.ok()) return y.status();
  std::memcpy((*y)->data, ctx.input(0).data, ctx.input(0).byte_size());
  return absl::OkStatus();
}

// Host memory; counts live allocations so tests can check nothing leaks.
class FakeBackend : public Backend {
 public:
  explicit FakeBackend(bool in_place_ok) {
    for (auto [op, fn] : {std::pair{"Relu", &ReluKernel}, std::pair{"Neg", &NegKernel},
                          std::pair{"Add", &AddKernel}, std::pair{"Equal", &EqualRowsKernel}}) {
      table_.Register(KernelDef{"", op, FloatDTypesIn({DType::kFloat32}), fn, in_place_ok});
    }
    table_.Register(KernelDef{"", "Shape", {}, &ShapeKernel, false});
    table_.Register(KernelDef{"", "Reshape", {}, &RecordingReshapeKernel, false});
  }
  std::string name() const override { return "fake"; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    live_.insert(p);
    return p;
  }
  void Free(void* data) override {
    live_.erase(data);
    std::free(data);
  }
  absl::Status CopyFromHost(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status CopyWithin(void* dst, const void* src, size_t n) override {
    std::memmove(dst, src, n);
    return absl::OkStatus();
  }
  const KernelTable& kernels() const override { return table_; }
  absl::Status Synchronize() override {
    ++synchronizations_;
    return absl::OkStatus();
  }
  int synchronizations_ = 0;

  size_t live_allocations() const { return live_.size(); }

 private:
  KernelTable table_;
  std::set<void*> live_;
};

// A model builder: `x` float32[N,4] input, nodes appended by name.
class ModelBuilder {
 public:
  ModelBuilder() {
    model_.ir_version = 8;
    model_.opset_imports.push_back({"", 17});
    x_ = *model_.graph->AddInput("x", DType::kFloat32, Shape{Dim::Symbol("N"), Dim(4)});
  }
  Value* x() { return x_; }
  Value* Add(const std::string& op, std::vector<Value*> inputs, const std::string& out) {
    return (*model_.graph->AddNode(op, inputs, {out}, out + "_node"))->output(0);
  }
  Model& Finish(std::vector<Value*> outputs) {
    for (Value* v : outputs) model_.graph->AddOutput(v);
    absl::Status s = InferTypes(model_);
    EXPECT_TRUE(s.ok()) << s;
    return model_;
  }
  Model& model() { return model_; }

 private:
  Model model_;
  Value* x_;
};

Tensor Input(int64_t rows, float start = 1.0f) {
  std::vector<float> values(rows * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = start + static_cast<float>(i);
  return Tensor::FromVector<float>(DType::kFloat32, {rows, 4}, values);
}

// x -> Relu -> Neg -> Relu -> Neg -> y: each value is read only by the next node.
Model& Chain(ModelBuilder& b) {
  Value* a = b.Add("Relu", {b.x()}, "a");
  Value* c = b.Add("Neg", {a}, "c");
  Value* d = b.Add("Relu", {c}, "d");
  return b.Finish({b.Add("Neg", {d}, "y")});
}

TEST(ExecutorTest, ChainComputesAndReusesBuffers) {
  FakeBackend backend(/*in_place_ok=*/false);
  ModelBuilder builder;
  auto executor = Executor::Create(Chain(builder), backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  // 64 rows x 4 floats = 1024 bytes per activation; x = 1..256, so Relu(x) = x,
  // Neg -> -x, Relu -> 0, Neg -> -0.
  auto out = (*executor)->Run({{"x", Input(64)}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].dims(), (std::vector<int64_t>{64, 4}));
  EXPECT_EQ((*out)[0].data<float>()[5], 0.0f);

  const PlanStats& stats = (*executor)->last_stats();
  EXPECT_EQ(stats.num_nodes, 4);
  EXPECT_EQ(stats.total_activation_bytes, 4 * 1024);
  EXPECT_EQ(stats.peak_activation_bytes, 2 * 1024);  // producer and consumer
  EXPECT_LT(stats.peak_activation_bytes, stats.total_activation_bytes);
  EXPECT_EQ(stats.buffer_reuses, 2);  // d takes a's buffer, y takes c's
  EXPECT_EQ(stats.in_place_reuses, 0);
  EXPECT_EQ(stats.backend_allocated_bytes, 3 * 1024);  // the feed plus two activations
}

// time_kernels: one KernelTime per node in run order, counting every run,
// the backend synchronised after each kernel; off, nothing is timed.
TEST(ExecutorTest, TimedKernelsCountEveryRunOfEachNode) {
  FakeBackend backend(false);
  ModelBuilder builder;
  ExecutorOptions options;
  options.time_kernels = true;
  auto executor = Executor::Create(Chain(builder), backend, options);
  ASSERT_TRUE(executor.ok()) << executor.status();
  ASSERT_TRUE((*executor)->Run({{"x", Input(64)}}).ok());
  ASSERT_TRUE((*executor)->Run({{"x", Input(2)}}).ok());
  const std::vector<KernelTime>& times = (*executor)->kernel_times();
  ASSERT_EQ(times.size(), 4u);
  const std::vector<std::string> names = {"a_node", "c_node", "d_node", "y_node"};
  for (size_t i = 0; i < times.size(); ++i) {
    ASSERT_NE(times[i].node, nullptr);
    EXPECT_EQ(times[i].node->name(), names[i]);
    EXPECT_EQ(times[i].runs, 2);
    EXPECT_GE(times[i].seconds, 0.0);
  }
  EXPECT_GE(backend.synchronizations_, 8);

  FakeBackend untimed_backend(false);
  ModelBuilder untimed_builder;
  auto untimed = Executor::Create(Chain(untimed_builder), untimed_backend);
  ASSERT_TRUE(untimed.ok()) << untimed.status();
  ASSERT_TRUE((*untimed)->Run({{"x", Input(64)}}).ok());
  EXPECT_TRUE((*untimed)->kernel_times().empty());
  EXPECT_LT(untimed_backend.synchronizations_, 4);
}

TEST(ExecutorTest, PlansAreCachedPerShapeSignature) {
  FakeBackend backend(false);
  ModelBuilder builder;
  auto executor = Executor::Create(Chain(builder), backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  ASSERT_TRUE((*executor)->Run({{"x", Input(64)}}).ok());
  EXPECT_EQ((*executor)->num_plans(), 1);
  ASSERT_TRUE((*executor)->Run({{"x", Input(64, -3.0f)}}).ok());
  EXPECT_EQ((*executor)->num_plans(), 1);
  EXPECT_EQ((*executor)->last_stats().backend_allocated_bytes, 0);  // all from the pool
  auto out = (*executor)->Run({{"x", Input(2, -3.0f)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*executor)->num_plans(), 2);
  EXPECT_EQ((*out)[0].dims(), (std::vector<int64_t>{2, 4}));
  // x = -3..4: Relu -> 0,0,0,0,0,1,2,3; Neg; Relu -> 0; Neg -> -0.
  EXPECT_EQ((*out)[0].data<float>()[7], 0.0f);
}

TEST(ExecutorTest, InPlaceTakenAlongChainButNeverOnGraphInput) {
  FakeBackend backend(/*in_place_ok=*/true);
  ModelBuilder builder;
  auto executor = Executor::Create(Chain(builder), backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  auto out = (*executor)->Run({{"x", Input(64, -10.0f)}});
  ASSERT_TRUE(out.ok()) << out.status();
  const PlanStats& stats = (*executor)->last_stats();
  EXPECT_EQ(stats.in_place_reuses, 3);  // all but the first node, which reads x
  EXPECT_EQ(stats.peak_activation_bytes, 1024);
  // x[0] = -10 -> 0 -> -0 -> 0 -> -0; x[20] = 10 -> 10 -> -10 -> 0 -> -0.
  EXPECT_EQ((*out)[0].data<float>()[20], 0.0f);
}

TEST(ExecutorTest, InPlaceNotTakenWhileInputIsReadLater) {
  FakeBackend backend(true);
  ModelBuilder builder;
  Value* a = builder.Add("Relu", {builder.x()}, "a");
  Value* b = builder.Add("Neg", {a}, "b");  // a is still read by Add
  Value* c = builder.Add("Add", {b, a}, "c");
  Value* d = builder.Add("Add", {c, a}, "d");
  auto executor = Executor::Create(builder.Finish({d}), backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  auto out = (*executor)->Run({{"x", Input(1)}});  // x = 1,2,3,4
  ASSERT_TRUE(out.ok()) << out.status();
  // d = (-a + a) + a = a; had Neg overwritten a, d would be -a.
  EXPECT_EQ((*out)[0].data<float>()[0], 1.0f);
  EXPECT_EQ((*out)[0].data<float>()[3], 4.0f);
  EXPECT_EQ((*executor)->last_stats().in_place_reuses, 2);  // c takes b, d takes c
}

TEST(ExecutorTest, FindFirstNonFiniteNamesTheFirstNodeInOrder) {
  FakeBackend backend(true);
  {
    ModelBuilder builder;
    Value* a = builder.Add("Relu", {builder.x()}, "a");
    Value* b = builder.Add("Add", {a, a}, "b");  // 3e38 + 3e38 overflows here
    Value* c = builder.Add("Add", {b, b}, "c");  // and stays inf
    auto executor = Executor::Create(builder.Finish({c}), backend);
    ASSERT_TRUE(executor.ok()) << executor.status();
    Tensor x = Tensor::FromVector<float>(DType::kFloat32, {1, 4}, {3e38f, 1, 2, 3e38f});
    auto found = (*executor)->FindFirstNonFinite({{"x", x}});
    ASSERT_TRUE(found.ok()) << found.status();
    ASSERT_TRUE(found->has_value());
    EXPECT_EQ((*found)->node, "b_node");
    EXPECT_EQ((*found)->op_type, "Add");
    EXPECT_EQ((*found)->value, "b");
    EXPECT_EQ((*found)->non_finite, 2);
    EXPECT_EQ((*found)->elements, 4);

    auto clean = (*executor)->FindFirstNonFinite({{"x", Input(2)}});
    ASSERT_TRUE(clean.ok()) << clean.status();
    EXPECT_FALSE(clean->has_value());
    // A normal run afterwards still works.
    auto out = (*executor)->Run({{"x", Input(1)}});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0].data<float>()[3], 16.0f);
  }
  EXPECT_EQ(backend.live_allocations(), 0u);
}

// An in-place output never takes an input buffer of another dtype, even of
// the same byte size: Equal(float32[2], float32[4,2]) -> bool[4,2] (8 bytes
// each) would overwrite the float input while later rows still read it.
TEST(ExecutorTest, InPlaceNeedsTheSameDType) {
  FakeBackend backend(/*in_place_ok=*/true);
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", 17});
  Value* x = *model.graph->AddInput("x", DType::kFloat32, Shape{Dim(2)});
  Value* y = *model.graph->AddInput("y", DType::kFloat32, Shape{Dim(4), Dim(2)});
  Value* r = (*model.graph->AddNode("Relu", {x}, {"r"}, "relu"))->output(0);
  model.graph->AddOutput((*model.graph->AddNode("Equal", {r, y}, {"e"}, "equal"))->output(0));
  ASSERT_TRUE(InferTypes(model).ok());
  auto executor = Executor::Create(model, backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  auto out = (*executor)->Run(
      {{"x", Tensor::FromVector<float>(DType::kFloat32, {2}, {1, 2})},
       {"y", Tensor::FromVector<float>(DType::kFloat32, {4, 2}, {1, 2, 1, 2, 0, 2, 1, 0})}});
  ASSERT_TRUE(out.ok()) << out.status();
  const uint8_t* e = (*out)[0].data<uint8_t>();
  EXPECT_EQ(std::vector<uint8_t>(e, e + 8), (std::vector<uint8_t>{1, 1, 1, 1, 0, 1, 1, 0}));
  EXPECT_EQ((*executor)->last_stats().in_place_reuses, 0);
}

TEST(ExecutorTest, GraphOutputIsNeitherReusedNorOverwritten) {
  FakeBackend backend(true);
  ModelBuilder builder;
  Value* a = builder.Add("Relu", {builder.x()}, "a");
  Value* b = builder.Add("Neg", {a}, "b");
  auto executor = Executor::Create(builder.Finish({a, b}), backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  auto out = (*executor)->Run({{"x", Input(1)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].data<float>()[1], 2.0f);
  EXPECT_EQ((*out)[1].data<float>()[1], -2.0f);
  EXPECT_EQ((*executor)->last_stats().in_place_reuses, 0);
  EXPECT_EQ((*executor)->last_stats().buffer_reuses, 0);
}

TEST(ExecutorTest, InitializersAreResidentUpdatableAndOverridable) {
  FakeBackend backend(false);
  ModelBuilder builder;
  Tensor w = Tensor::FromVector<float>(DType::kFloat32, {1, 4}, {10, 20, 30, 40});
  Value* weight = *builder.model().graph->AddInitializer("w", w);
  Value* bias = *builder.model().graph->AddInput("bias", DType::kFloat32, Shape{1, 4});
  builder.model().graph->SetInitializerOfInput(bias, Tensor(DType::kFloat32, {1, 4}));
  Value* y = builder.Add("Add", {builder.Add("Add", {builder.x(), weight}, "s"), bias}, "y");
  auto executor = Executor::Create(builder.Finish({y}), backend);
  ASSERT_TRUE(executor.ok()) << executor.status();

  auto view = (*executor)->ResidentTensor("w");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->dims, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(view->as<float>()[2], 30.0f);
  EXPECT_FALSE((*executor)->ResidentTensor("s").ok());

  auto out = (*executor)->Run({{"x", Input(1)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].data<float>()[0], 11.0f);

  Tensor w2 = Tensor::FromVector<float>(DType::kFloat32, {1, 4}, {1, 1, 1, 1});
  ASSERT_TRUE((*executor)->UpdateResident("w", w2).ok());
  EXPECT_THAT((*executor)->UpdateResident("w", Tensor(DType::kFloat32, {4})).message(),
              HasSubstr("resident tensor 'w' is float32[1,4], update is float32[4]"));
  Tensor b2 = Tensor::FromVector<float>(DType::kFloat32, {1, 4}, {100, 100, 100, 100});
  out = (*executor)->Run({{"x", Input(1)}, {"bias", b2}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].data<float>()[3], 4.0f + 1.0f + 100.0f);
}

TEST(ExecutorTest, KernelsSeeHostCopiesOfSmallIntegerValues) {
  // Reshape's shape from Shape (the kernel's host copy), from an int64
  // initializer (the executor's), and from an int64 feed; none once a
  // resident tensor is overwritten from backend memory.
  FakeBackend backend(false);
  ModelBuilder builder;
  Graph& graph = *builder.model().graph;
  Value* shape = builder.Add("Shape", {builder.x()}, "shape");
  Value* from_shape = builder.Add("Reshape", {builder.x(), shape}, "from_shape");
  // An input with an initializer: resident, but not a constant to inference.
  Value* k = *graph.AddInput("k", DType::kInt64, Shape{Dim(2)});
  graph.SetInitializerOfInput(k, Tensor::FromVector<int64_t>(DType::kInt64, {2}, {2, 8}));
  Value* from_initializer = builder.Add("Reshape", {builder.x(), k}, "from_initializer");
  Value* fed = *graph.AddInput("fed", DType::kInt64, Shape{Dim(3)});
  Value* from_feed = builder.Add("Reshape", {builder.x(), fed}, "from_feed");
  Model& model = builder.Finish({from_shape, from_initializer, from_feed});
  auto executor = Executor::Create(model, backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  const Tensor fed_shape = Tensor::FromVector<int64_t>(DType::kInt64, {3}, {4, 2, 2});
  ASSERT_TRUE((*executor)->Run({{"x", Input(4)}, {"fed", fed_shape}}).ok());
  EXPECT_EQ(SeenHostShapes()["from_shape_node"], (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(SeenHostShapes()["from_initializer_node"], (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(SeenHostShapes()["from_feed_node"], (std::vector<int64_t>{4, 2, 2}));

  ASSERT_TRUE((*executor)->UpdateResident(
      "k", Tensor::FromVector<int64_t>(DType::kInt64, {2}, {8, 2})).ok());
  ASSERT_TRUE((*executor)->Run({{"x", Input(4)}, {"fed", fed_shape}}).ok());
  EXPECT_EQ(SeenHostShapes()["from_initializer_node"], (std::vector<int64_t>{8, 2}));

  const Tensor other = Tensor::FromVector<int64_t>(DType::kInt64, {2}, {16, 1});
  ASSERT_TRUE((*executor)->AssignResident("k", TensorView{const_cast<uint8_t*>(other.raw()),
                                                          DType::kInt64, {2}}).ok());
  ASSERT_TRUE((*executor)->Run({{"x", Input(4)}, {"fed", fed_shape}}).ok());
  EXPECT_EQ(SeenHostShapes()["from_initializer_node"], std::nullopt);
  EXPECT_EQ(SeenHostShapes()["from_feed_node"], (std::vector<int64_t>{4, 2, 2}));
}

TEST(ExecutorTest, KeptValuesSurviveTheRunAndConstantsFold) {
  FakeBackend backend(true);
  ModelBuilder builder;
  Node* constant = *builder.model().graph->AddNode("Constant", {}, {"k"}, "k_node");
  constant->SetAttribute(Attribute::TensorValue(
      "value", Tensor::FromVector<float>(DType::kFloat32, {1, 4}, {0.5f, 0.5f, 0.5f, 0.5f})));
  Value* a = builder.Add("Relu", {builder.x()}, "a");
  Value* b = builder.Add("Add", {a, constant->output(0)}, "b");
  Value* y = builder.Add("Neg", {b}, "y");
  ExecutorOptions options;
  options.keep_values = {"b"};
  auto executor = Executor::Create(builder.Finish({y}), backend, options);
  ASSERT_TRUE(executor.ok()) << executor.status();  // no Constant kernel needed
  auto out = (*executor)->Run({{"x", Input(1)}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].data<float>()[0], -1.5f);
  auto kept = (*executor)->KeptValueToHost("b");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->data<float>()[0], 1.5f);                  // Neg did not overwrite it in place
  EXPECT_EQ((*executor)->last_stats().in_place_reuses, 1);  // b takes a's buffer only
  EXPECT_THAT(std::string((*executor)->KeptValue("a").status().message()),
              HasSubstr("not in ExecutorOptions::keep_values"));
}

TEST(ExecutorTest, FeedErrorsNameTheInputAndTheExpectation) {
  FakeBackend backend(false);
  ModelBuilder builder;
  Value* x2 = *builder.model().graph->AddInput("x2", DType::kFloat32, Shape{Dim(2), Dim(4)});
  Value* y = builder.Add("Add", {builder.Add("Relu", {builder.x()}, "a"), x2}, "y");
  auto executor = Executor::Create(builder.Finish({y}), backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  Executor& e = **executor;
  auto message = [&](std::vector<std::pair<std::string, Tensor>> feeds) {
    absl::StatusOr<std::vector<Tensor>> r = e.Run(feeds);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_THAT(message({{"x", Input(2)}}),
              HasSubstr("missing feed for graph input 'x2' (float32[2,4])"));
  EXPECT_THAT(message({{"x", Input(2)}, {"x2", Input(2)}, {"z", Input(2)}}),
              HasSubstr("unknown feed 'z': the graph inputs are x, x2"));
  EXPECT_THAT(message({{"x", Tensor(DType::kInt64, {2, 4})}, {"x2", Input(2)}}),
              HasSubstr("input 'x': fed int64, the model expects float32"));
  EXPECT_THAT(message({{"x", Tensor(DType::kFloat32, {8})}, {"x2", Input(2)}}),
              HasSubstr("input 'x': fed rank 1 [8], the model expects rank 2 [N,4]"));
  EXPECT_THAT(message({{"x", Input(2)}, {"x2", Input(3)}}),
              HasSubstr("input 'x2': dim 0 is 3, the model expects 2"));
  EXPECT_THAT(message({{"x", Input(2)}, {"x", Input(2)}, {"x2", Input(2)}}),
              HasSubstr("input 'x' is fed twice"));
  EXPECT_TRUE(e.Run({{"x", Input(2)}, {"x2", Input(2)}}).ok());
}

TEST(ExecutorTest, BackendFeedsAreReadInPlaceAndKeepTheirHostCopy) {
  // Feeds already in backend memory (a recorded step's fixed buffers): the
  // run reads them where they are, never writes them (even with in-place
  // kernels), allocates nothing for them, and gives kernels the host copy a
  // feed brings along.
  FakeBackend backend(/*in_place_ok=*/true);
  ModelBuilder builder;
  Graph& graph = *builder.model().graph;
  Value* fed = *graph.AddInput("fed", DType::kInt64, Shape{Dim(3)});
  Value* reshaped = builder.Add("Reshape", {builder.x(), fed}, "reshaped");
  Value* y = builder.Add("Neg", {builder.Add("Relu", {builder.x()}, "a")}, "y");
  auto executor = Executor::Create(builder.Finish({y, reshaped}), backend);
  ASSERT_TRUE(executor.ok()) << executor.status();
  Executor& e = **executor;
  const Tensor x = Input(4);
  const Tensor shape = Tensor::FromVector<int64_t>(DType::kInt64, {3}, {2, 2, 4});
  absl::StatusOr<std::vector<Tensor>> expected = e.Run({{"x", x}, {"fed", shape}});
  ASSERT_TRUE(expected.ok()) << expected.status();

  void* x_buffer = *backend.Allocate(x.byte_size());
  void* shape_buffer = *backend.Allocate(shape.byte_size());
  std::memcpy(x_buffer, x.raw(), x.byte_size());
  std::memcpy(shape_buffer, shape.raw(), shape.byte_size());
  const size_t live_before = backend.live_allocations();
  std::vector<std::pair<std::string, TensorView>> feeds = {
      {"x", TensorView{x_buffer, DType::kFloat32, {4, 4}}},
      {"fed", TensorView{shape_buffer, DType::kInt64, {3}, shape.raw()}}};
  ASSERT_TRUE(e.RunOnBackendWithBackendFeeds(feeds).ok());
  EXPECT_EQ(SeenHostShapes()["reshaped_node"], (std::vector<int64_t>{2, 2, 4}));
  for (int k = 0; k < 2; ++k) {
    absl::StatusOr<TensorView> got = e.OutputView(k);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->dims, (*expected)[k].dims());
    EXPECT_EQ(std::memcmp(got->data, (*expected)[k].raw(), got->byte_size()), 0) << "output " << k;
    EXPECT_NE(got->data, x_buffer) << "output " << k;
  }
  EXPECT_EQ(std::memcmp(x_buffer, x.raw(), x.byte_size()), 0) << "the feed was overwritten";
  EXPECT_EQ(backend.live_allocations(), live_before) << "the pool had every buffer already";

  feeds[1].second.host_data = nullptr;  // no host copy: kernels must read the backend's
  ASSERT_TRUE(e.RunOnBackendWithBackendFeeds(feeds).ok());
  EXPECT_EQ(SeenHostShapes()["reshaped_node"], std::nullopt);

  feeds[0].second.dtype = DType::kFloat16;
  absl::Status wrong = e.RunOnBackendWithBackendFeeds(feeds);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.message()),
              HasSubstr("input 'x': fed float16, the model expects float32"));
  e.ReleaseOutputs();
  backend.Free(x_buffer);
  backend.Free(shape_buffer);
}

TEST(ExecutorTest, AllMissingKernelsAreListedAtOnce) {
  FakeBackend backend(false);
  ModelBuilder builder;
  Value* a = builder.Add("Sigmoid", {builder.x()}, "a");
  Value* b = builder.Add("Relu", {a}, "b");
  Value* c = builder.Add("Tanh", {b}, "c");
  Value* d = builder.Add("Sigmoid", {c}, "d");
  auto executor = Executor::Create(builder.Finish({d}), backend);
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(executor.status().message()),
              AllOf(HasSubstr("backend 'fake' has no kernel for 3 nodes (ops Sigmoid, Tanh)"),
                    HasSubstr("Sigmoid node 'a_node' (float32) -> (float32)"),
                    HasSubstr("Tanh node 'c_node'"), HasSubstr("Sigmoid node 'd_node'")));
}

TEST(ExecutorTest, SubgraphNodesAreRejected) {
  FakeBackend backend(false);
  ModelBuilder builder;
  Value* a = builder.Add("Relu", {builder.x()}, "a");
  Model& model = builder.Finish({a});
  Attribute body;
  body.name = "body";
  body.kind = AttrKind::kGraph;
  body.serialized = {""};
  a->producer()->SetAttribute(body);
  auto executor = Executor::Create(model, backend);
  ASSERT_FALSE(executor.ok());
  EXPECT_THAT(std::string(executor.status().message()),
              HasSubstr("Relu node 'a_node': ops with subgraphs (If, Loop, Scan) are not "
                        "supported"));
}

TEST(ExecutorTest, KernelErrorsPropagateAndNothingLeaks) {
  FakeBackend backend(true);
  {
    ModelBuilder builder;
    Value* w = *builder.model().graph->AddInput("w", DType::kFloat32, Shape{Dim::Symbol("M"), 4});
    Value* y = builder.Add("Add", {builder.Add("Relu", {builder.x()}, "a"), w}, "y");
    auto executor = Executor::Create(builder.Finish({y}), backend);
    ASSERT_TRUE(executor.ok()) << executor.status();
    auto out = (*executor)->Run({{"x", Input(2)}, {"w", Input(3)}});
    EXPECT_THAT(std::string(out.status().message()),
                HasSubstr("Add node 'y_node': fake Add needs equal shapes"));
    ASSERT_TRUE((*executor)->Run({{"x", Input(3)}, {"w", Input(3)}}).ok());
    EXPECT_GT(backend.live_allocations(), 0u);
  }
  EXPECT_EQ(backend.live_allocations(), 0u);
}

TEST(ExecutorTest, DescribePlanStatsReadsWell) {
  PlanStats stats;
  stats.num_nodes = 4;
  stats.peak_activation_bytes = 2048;
  stats.total_activation_bytes = 3 * 1024 * 1024;
  stats.backend_allocated_bytes = 512;
  stats.buffer_reuses = 2;
  stats.in_place_reuses = 1;
  EXPECT_EQ(DescribePlanStats(stats),
            "peak activations 2.0 KiB (3.0 MiB without reuse), 512 B allocated from the "
            "backend, 2 buffer reuses, 1 in place, 4 nodes");
}

}  // namespace
}  // namespace castor
