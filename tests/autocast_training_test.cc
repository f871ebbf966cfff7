// Tests for the training graph's bfloat16 Conv and pools (AutocastOptions::
// training_graph_ops, issue #29 item 1): under mixed_bfloat16 a Conv,
// MaxPool, AveragePool or GlobalAveragePool that ONNX refuses in bfloat16
// below opset 22 computes in bfloat16 as castor's com.castor form in the
// training graph (no Casts between it and its bfloat16 neighbours; its
// gradient in bfloat16 too), while the file 'castor convert' writes keeps
// the ONNX op in float32 and its record says where it computes in bfloat16. The sample CNN's loss curve under it
// stays close to float32's, and the checkpoint record tells the two
// behaviours apart (KeptFloat32NodesOfGraph).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "graph/gradient_builder.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "gtest/gtest.h"
#include "passes/autocast.h"
#include "passes/training_graph.h"
#include "passes/verifier.h"
#include "training/checkpoint.h"
#include "training/trainer.h"

namespace castor {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
T ValueOrDie(absl::StatusOr<T> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) std::abort();
  return *std::move(result);
}

Policy BuiltinPolicy(const std::string& name) { return ValueOrDie(Policy::Builtin(name)); }

AutocastOptions TrainingOps() {
  AutocastOptions options;
  options.training_graph_ops = true;
  return options;
}

const Node& NodeNamed(const Model& model, const std::string& name) {
  const Node* node = model.graph->FindNode(name);
  if (node == nullptr) {
    ADD_FAILURE() << "no node " << name;
    std::abort();
  }
  return *node;
}

// "source->dtype" for every inserted Cast, in graph order.
std::vector<std::string> CastSummary(const Model& model) {
  std::vector<std::string> summary;
  for (const Node* node : model.graph->nodes()) {
    if (ReadAutocastRecord(*node).inserted_cast.empty()) continue;
    summary.push_back(
        absl::StrCat(node->input(0)->name(), "->", DTypeName(node->output(0)->dtype())));
  }
  return summary;
}

// x -> Conv -> Relu -> Conv -> Relu (graph output), at `opset`.
Model TwoConvModel(int64_t opset) {
  Model model;
  model.ir_version = 8;
  model.opset_imports = {{"", opset}};
  Graph& g = *model.graph;
  Value* x = ValueOrDie(g.AddInput("x", DType::kFloat32, Shape::FromDims({2, 3, 9, 7})));
  auto weight = [&](const std::string& name, std::vector<int64_t> dims) {
    Tensor tensor(DType::kFloat32, dims);
    for (int64_t i = 0; i < tensor.num_elements(); ++i) {
      tensor.data<float>()[i] = 0.05f * std::sin(0.7f * static_cast<float>(i));
    }
    return ValueOrDie(g.AddInitializer(name, std::move(tensor)));
  };
  Value* k1 = weight("k1", {4, 3, 3, 3});
  Value* b1 = weight("b1", {4});
  Value* k2 = weight("k2", {5, 4, 3, 3});
  Node* conv1 = ValueOrDie(g.AddNode("Conv", {x, k1, b1}, {"conv1"}, "conv1"));
  conv1->SetAttribute(Attribute::Ints("pads", {1, 1, 1, 1}));
  Node* relu = ValueOrDie(g.AddNode("Relu", {conv1->output(0)}, {"relu"}, "relu"));
  Node* conv2 = ValueOrDie(g.AddNode("Conv", {relu->output(0), k2}, {"conv2"}, "conv2"));
  conv2->SetAttribute(Attribute::Ints("strides", {2, 1}));
  Node* out = ValueOrDie(g.AddNode("Relu", {conv2->output(0)}, {"out"}, "out"));
  g.AddOutput(out->output(0));
  EXPECT_TRUE(InferTypes(model).ok());
  return model;
}

TEST(AutocastTrainingFormTest, ConvBelowOpset22ComputesBfloat16AsCastorConv) {
  Model model = TwoConvModel(17);
  const AutocastReport report =
      ValueOrDie(RunAutocast(model, BuiltinPolicy("mixed_bfloat16"), TrainingOps()));
  for (const char* name : {"conv1", "conv2"}) {
    const Node& conv = NodeNamed(model, name);
    EXPECT_EQ(conv.domain(), kCastorDomain) << name;
    EXPECT_EQ(conv.op_type(), "Conv") << name;
    EXPECT_EQ(ReadAutocastRecord(conv).dtype, "bfloat16") << name;
    EXPECT_THAT(ReadAutocastRecord(conv).why,
                HasSubstr("so castor's training graph runs it as com.castor Conv"));
    EXPECT_EQ(conv.output(0)->dtype(), DType::kBFloat16) << name;
  }
  // The Relu between them follows in bfloat16: no Cast between the Convs;
  // the last Relu produces the float32 graph output (keep_io_types).
  EXPECT_EQ(ReadAutocastRecord(NodeNamed(model, "relu")).dtype, "bfloat16");
  EXPECT_EQ(ReadAutocastRecord(NodeNamed(model, "out")).dtype, "float32");
  EXPECT_THAT(CastSummary(model),
              ElementsAre("x->bfloat16", "k1->bfloat16", "b1->bfloat16", "k2->bfloat16",
                          "conv2->float32"));
  EXPECT_EQ(model.graph->FindValue("conv1")->producer()->name(), "conv1");  // names kept
  EXPECT_EQ(model.OpsetVersion(kCastorDomain), 1);
  EXPECT_EQ(report.training_forms.at("Conv"), 2);
  EXPECT_THAT(report.notes, Contains(HasSubstr("2 Conv nodes compute in bfloat16 as com.castor "
                                               "Conv")));
  absl::Status verified = VerifyModel(model);
  EXPECT_TRUE(verified.ok()) << verified;

  // StripAutocast gives back the float32 ONNX graph.
  ASSERT_TRUE(StripAutocast(model).ok());
  for (const char* name : {"conv1", "conv2"}) {
    EXPECT_EQ(NodeNamed(model, name).domain(), "") << name;
    EXPECT_EQ(NodeNamed(model, name).output(0)->dtype(), DType::kFloat32) << name;
  }
  EXPECT_TRUE(CastSummary(model).empty());
}

TEST(AutocastTrainingFormTest, ConvertedFileKeepsOnnxConvInFloat32AndSaysWhereItIsBfloat16) {
  Model model = TwoConvModel(17);
  const AutocastReport report = ValueOrDie(RunAutocast(model, BuiltinPolicy("mixed_bfloat16")));
  for (const char* name : {"conv1", "conv2"}) {
    const Node& conv = NodeNamed(model, name);
    EXPECT_EQ(conv.domain(), "") << name;
    EXPECT_EQ(ReadAutocastRecord(conv).dtype, "float32") << name;
    EXPECT_THAT(ReadAutocastRecord(conv).why,
                HasSubstr("does not accept bfloat16 at opset 17"));
    EXPECT_THAT(ReadAutocastRecord(conv).why,
                HasSubstr("'castor train' runs it in bfloat16 all the same, as com.castor Conv"));
  }
  EXPECT_EQ(model.OpsetVersion(kCastorDomain), 0);
  EXPECT_THAT(report.notes,
              ElementsAre(HasSubstr("2 Conv nodes stay float32 in this file (Conv accepts "
                                    "bfloat16 only from opset 22; the model is opset 17) and "
                                    "compute in bfloat16 in 'castor train' as com.castor Conv")));
  EXPECT_TRUE(report.training_forms.empty());
}

TEST(AutocastTrainingFormTest, OnlyWhereOnnxRefusesTheDtype) {
  // float16: ONNX Conv takes it at every opset; opset 22: bfloat16 too.
  Model float16 = TwoConvModel(17);
  ValueOrDie(RunAutocast(float16, BuiltinPolicy("mixed_float16"), TrainingOps()));
  EXPECT_EQ(NodeNamed(float16, "conv1").domain(), "");
  EXPECT_EQ(ReadAutocastRecord(NodeNamed(float16, "conv1")).dtype, "float16");
  Model opset22 = TwoConvModel(22);
  const AutocastReport report =
      ValueOrDie(RunAutocast(opset22, BuiltinPolicy("mixed_bfloat16"), TrainingOps()));
  EXPECT_EQ(NodeNamed(opset22, "conv1").domain(), "");
  EXPECT_EQ(ReadAutocastRecord(NodeNamed(opset22, "conv1")).dtype, "bfloat16");
  EXPECT_TRUE(report.training_forms.empty());
  Model float32 = TwoConvModel(17);
  ValueOrDie(RunAutocast(float32, BuiltinPolicy("float32"), TrainingOps()));
  EXPECT_EQ(NodeNamed(float32, "conv1").domain(), "");
}

// x -> Conv -> Relu -> MaxPool (ceil_mode) -> AveragePool
// (count_include_pad) -> GlobalAveragePool -> Flatten (graph output), at
// opset 17.
Model PoolModel() {
  Model model;
  model.ir_version = 8;
  model.opset_imports = {{"", 17}};
  Graph& g = *model.graph;
  Value* x = ValueOrDie(g.AddInput("x", DType::kFloat32, Shape::FromDims({2, 3, 9, 7})));
  Tensor k(DType::kFloat32, {4, 3, 3, 3});
  for (int64_t i = 0; i < k.num_elements(); ++i) {
    k.data<float>()[i] = 0.05f * std::sin(0.7f * static_cast<float>(i));
  }
  Value* k1 = ValueOrDie(g.AddInitializer("k1", std::move(k)));
  Node* conv = ValueOrDie(g.AddNode("Conv", {x, k1}, {"conv"}, "conv"));
  conv->SetAttribute(Attribute::Ints("pads", {1, 1, 1, 1}));
  Node* relu = ValueOrDie(g.AddNode("Relu", {conv->output(0)}, {"relu"}, "relu"));
  Node* max = ValueOrDie(g.AddNode("MaxPool", {relu->output(0)}, {"max"}, "max"));
  max->SetAttribute(Attribute::Ints("kernel_shape", {2, 2}));
  max->SetAttribute(Attribute::Ints("strides", {2, 2}));
  max->SetAttribute(Attribute::Int("ceil_mode", 1));
  Node* average = ValueOrDie(g.AddNode("AveragePool", {max->output(0)}, {"average"}, "average"));
  average->SetAttribute(Attribute::Ints("kernel_shape", {2, 2}));
  average->SetAttribute(Attribute::Ints("pads", {1, 1, 0, 0}));
  average->SetAttribute(Attribute::Int("count_include_pad", 1));
  Node* global =
      ValueOrDie(g.AddNode("GlobalAveragePool", {average->output(0)}, {"global"}, "global"));
  Node* out = ValueOrDie(g.AddNode("Flatten", {global->output(0)}, {"out"}, "out"));
  g.AddOutput(out->output(0));
  EXPECT_TRUE(InferTypes(model).ok());
  return model;
}

TEST(AutocastTrainingFormTest, PoolsBelowOpset22ComputeBfloat16AsCastorForms) {
  Model model = PoolModel();
  const AutocastReport report =
      ValueOrDie(RunAutocast(model, BuiltinPolicy("mixed_bfloat16"), TrainingOps()));
  for (const char* name : {"conv", "max", "average", "global"}) {
    const Node& node = NodeNamed(model, name);
    EXPECT_EQ(node.domain(), kCastorDomain) << name;
    EXPECT_EQ(ReadAutocastRecord(node).dtype, "bfloat16") << name;
    EXPECT_THAT(ReadAutocastRecord(node).why,
                HasSubstr("so castor's training graph runs it as com.castor " + node.op_type()));
  }
  // One Cast in (x, k1), one out (the float32 graph output): none between.
  EXPECT_THAT(CastSummary(model), ElementsAre("x->bfloat16", "k1->bfloat16", "global->float32"));
  for (const char* op : {"MaxPool", "AveragePool", "GlobalAveragePool"}) {
    EXPECT_EQ(report.training_forms.at(op), 1) << op;
  }
  absl::Status verified = VerifyModel(model);
  EXPECT_TRUE(verified.ok()) << verified;
  // The gradients read and write bfloat16 (the same kernels as ONNX's pools).
  TrainingGraphOptions options;
  options.output = "out";  // [N, 4] logits
  ValueOrDie(BuildTrainingGraph(model, options));
  int pool_grads = 0;
  for (const Node* node : model.graph->nodes()) {
    if (node->op_type() != "MaxPoolGrad" && node->op_type() != "AveragePoolGrad" &&
        node->op_type() != "GlobalAveragePoolGrad") {
      continue;
    }
    ++pool_grads;
    EXPECT_EQ(node->input(0)->dtype(), DType::kBFloat16) << node->name();
    EXPECT_EQ(node->output(0)->dtype(), DType::kBFloat16) << node->name();
  }
  EXPECT_EQ(pool_grads, 3);

  // 'castor convert': ONNX pools, float32 after the float32 Conv; StripAutocast
  // of the training form gives the ONNX ops back.
  Model converted = PoolModel();
  ValueOrDie(RunAutocast(converted, BuiltinPolicy("mixed_bfloat16")));
  for (const char* name : {"max", "average", "global"}) {
    const Node& node = NodeNamed(converted, name);
    EXPECT_EQ(node.domain(), "") << name;
    EXPECT_EQ(ReadAutocastRecord(node).dtype, "float32") << name;
  }
  Model stripped = PoolModel();
  ValueOrDie(RunAutocast(stripped, BuiltinPolicy("mixed_bfloat16"), TrainingOps()));
  ASSERT_TRUE(StripAutocast(stripped).ok());
  for (const char* name : {"max", "average", "global"}) {
    EXPECT_EQ(NodeNamed(stripped, name).domain(), "") << name;
    EXPECT_EQ(NodeNamed(stripped, name).output(0)->dtype(), DType::kFloat32) << name;
  }
}

Model LoadSample(const std::string& name) {
  Model model = ValueOrDie(LoadModel(std::string(CASTOR_SOURCE_DIR) + "/models/" + name + ".onnx"));
  EXPECT_TRUE(InferTypes(model).ok());
  return model;
}

int CountConvs(const Model& model) {
  int convs = 0;
  for (const Node* node : model.graph->nodes()) convs += node->op_type() == "Conv";
  return convs;
}

// The sample CNN and ResNet: every Conv in bfloat16.
class SampleConvTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SampleConvTest, EveryConvComputesBfloat16InTheTrainingGraph) {
  Model model = LoadSample(GetParam());
  const int convs = CountConvs(model);
  ASSERT_GT(convs, 0);
  ValueOrDie(RunAutocast(model, BuiltinPolicy("mixed_bfloat16"), TrainingOps()));
  for (const Node* node : model.graph->nodes()) {
    if (node->op_type() != "Conv") continue;
    EXPECT_EQ(node->domain(), kCastorDomain) << node->name();
    EXPECT_EQ(ReadAutocastRecord(*node).dtype, "bfloat16") << node->name();
    EXPECT_EQ(node->input(0)->dtype(), DType::kBFloat16) << node->name();
  }
  EXPECT_EQ(CountConvs(model), convs);
  // So do the CNN's MaxPool after its Conv and the ResNet's
  // GlobalAveragePool after its bfloat16 residual sum (whose BatchNormalized
  // input goes on in bfloat16), as castor's training forms.
  int pools = 0;
  for (const Node* node : model.graph->nodes()) {
    if (node->op_type() != "MaxPool" && node->op_type() != "GlobalAveragePool") continue;
    ++pools;
    EXPECT_EQ(node->domain(), kCastorDomain) << node->name();
    EXPECT_EQ(node->input(0)->dtype(), DType::kBFloat16) << node->name();
  }
  EXPECT_EQ(pools, 1);
  const TrainingGraph graph = ValueOrDie(BuildTrainingGraph(model, TrainingGraphOptions{}));
  absl::Status verified = VerifyModel(model);
  EXPECT_TRUE(verified.ok()) << verified;
  int conv_grads = 0;
  for (const Node* node : model.graph->nodes()) {
    if (node->op_type() != "ConvGrad") continue;
    ++conv_grads;
    // dY and X in bfloat16: the data and weight gradients are bfloat16 GEMMs.
    EXPECT_EQ(node->input(0)->dtype(), DType::kBFloat16) << node->name();
    EXPECT_EQ(node->input(1)->dtype(), DType::kBFloat16) << node->name();
  }
  EXPECT_EQ(conv_grads, convs);
  EXPECT_FALSE(graph.gradients.empty());

  // The converted file: ONNX Conv in float32, each saying where it is bfloat16.
  Model converted = LoadSample(GetParam());
  ValueOrDie(RunAutocast(converted, BuiltinPolicy("mixed_bfloat16")));
  for (const Node* node : converted.graph->nodes()) {
    if (node->op_type() != "Conv") continue;
    EXPECT_EQ(node->domain(), "") << node->name();
    EXPECT_EQ(ReadAutocastRecord(*node).dtype, "float32") << node->name();
    EXPECT_THAT(ReadAutocastRecord(*node).why, HasSubstr("'castor train' runs it in bfloat16"));
  }

  // The checkpoint record: nodes kept float32 as the training graph computes
  // them (no Conv), and as checkpoints before the training form recorded
  // them (every Conv).
  Model float32 = LoadSample(GetParam());
  const Policy policy = BuiltinPolicy("mixed_bfloat16");
  const std::vector<std::string> now = ValueOrDie(training::KeptFloat32Nodes(float32, policy));
  const std::vector<std::string> before =
      ValueOrDie(training::KeptFloat32NodesOfGraph(float32, policy, /*training_graph_ops=*/false));
  // (Relus between a Conv and a bfloat16 reader turn bfloat16 with it.)
  EXPECT_GE(before.size(), now.size() + convs);
  int convs_before = 0;
  for (const std::string& name : before) convs_before += NodeNamed(float32, name).op_type() == "Conv";
  EXPECT_EQ(convs_before, convs);
  for (const std::string& name : now) {
    EXPECT_NE(NodeNamed(float32, name).op_type(), "Conv") << name;
    EXPECT_NE(std::find(before.begin(), before.end(), name), before.end()) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SampleConvTest,
                         ::testing::Values("cnn_opset17", "resnet_opset17", "cnn_opset13",
                                           "resnet_opset13"));

CpuBackend& Cpu() {
  static CpuBackend* backend = new CpuBackend();
  return *backend;
}

std::unique_ptr<training::Trainer> MakeTrainer(const std::string& policy,
                                               const std::string& sample = "cnn_opset17",
                                               const TrainingGraphOptions& graph_options = {}) {
  Model model = LoadSample(sample);
  if (policy != "float32") {
    ValueOrDie(RunAutocast(model, BuiltinPolicy(policy), TrainingOps()));
  }
  const TrainingGraph graph = ValueOrDie(BuildTrainingGraph(model, graph_options));
  training::TrainerOptions options;
  options.lr.base_lr = 1e-3;
  return ValueOrDie(training::Trainer::Create(std::move(model), graph, options, Cpu()));
}

TEST(AutocastTrainingFormTest, CnnLossCurveUnderBfloat16ConvsStaysCloseToFloat32) {
  // 12 Adam steps on a fixed batch of 32 random images: the bfloat16 run
  // (Convs, GEMMs and their gradients in bfloat16, float32 accumulation)
  // follows the float32 one within a few percent and learns as much.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Tensor images(DType::kFloat32, {32, 1, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) images.data<float>()[i] = pixel(rng);
  Tensor labels(DType::kInt64, {32});
  for (int64_t i = 0; i < 32; ++i) labels.data<int64_t>()[i] = (i * 7) % 10;
  std::unique_ptr<training::Trainer> bf16 = MakeTrainer("mixed_bfloat16");
  std::unique_ptr<training::Trainer> fp32 = MakeTrainer("float32");
  int castor_convs = 0;
  for (const Node* node : bf16->model().graph->nodes()) {
    castor_convs += node->op_type() == "Conv" && node->domain() == kCastorDomain;
  }
  EXPECT_EQ(castor_convs, 1);
  double first = 0, last_bf16 = 0, last_fp32 = 0;
  for (int step = 0; step < 12; ++step) {
    const training::StepResult a = ValueOrDie(bf16->Step({{"input", images}}, labels));
    const training::StepResult b = ValueOrDie(fp32->Step({{"input", images}}, labels));
    ASSERT_FALSE(a.skipped);
    EXPECT_TRUE(std::isfinite(a.loss));
    EXPECT_NEAR(a.loss, b.loss, 0.03 * b.loss + 0.01) << "step " << step;
    if (step == 0) first = b.loss;
    last_bf16 = a.loss;
    last_fp32 = b.loss;
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last_fp32, 0.8 * first);
  EXPECT_LT(last_bf16, 0.8 * first);
}

// Four steps of `a` and `b` on the same 16 random images (`seed`): the same
// losses and the same state after them (weights, optimizer moments,
// running statistics), bit for bit.
void ExpectTheSameTrainingBits(training::Trainer& a, training::Trainer& b, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Tensor images(DType::kFloat32, {16, 1, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) images.data<float>()[i] = pixel(rng);
  Tensor labels(DType::kInt64, {16});
  for (int64_t i = 0; i < 16; ++i) labels.data<int64_t>()[i] = (i * 3 + seed) % 10;
  for (int step = 0; step < 4; ++step) {
    const training::StepResult from_a = ValueOrDie(a.Step({{"input", images}}, labels));
    const training::StepResult from_b = ValueOrDie(b.Step({{"input", images}}, labels));
    ASSERT_FALSE(from_a.skipped);
    EXPECT_EQ(from_a.loss, from_b.loss) << "step " << step;
  }
  const training::Trainer::Snapshot after_a = ValueOrDie(a.TakeSnapshot());
  const training::Trainer::Snapshot after_b = ValueOrDie(b.TakeSnapshot());
  ASSERT_EQ(after_a.state.size(), after_b.state.size());
  for (const auto& [name, tensor] : after_a.state) {
    const Tensor& other = after_b.state.at(name);
    ASSERT_EQ(tensor.byte_size(), other.byte_size()) << name;
    EXPECT_EQ(std::memcmp(tensor.raw(), other.raw(), tensor.byte_size()), 0) << name;
  }
}

// fold-batchnorm-casts (passes/training_graph.cc): the ResNet's
// BatchNormalizations between 16-bit neighbours (all eight: each reads a
// Conv's 16-bit output and hands its own on in 16 bits) read and write
// that type (no Casts around them), and training gives the same bits as
// with the Casts: losses, weights and running statistics over 4 steps, for
// both 16-bit types.
TEST(AutocastTrainingFormTest, FoldedBatchNormCastsTrainTheSameBits) {
  for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
    SCOPED_TRACE(policy);
    TrainingGraphOptions unfolded_options;
    unfolded_options.fold_batchnorm_casts = false;
    std::unique_ptr<training::Trainer> folded = MakeTrainer(policy, "resnet_opset17");
    std::unique_ptr<training::Trainer> unfolded =
        MakeTrainer(policy, "resnet_opset17", unfolded_options);
    EXPECT_EQ(folded->training_graph().folded_batchnorm_casts, 8);
    EXPECT_EQ(unfolded->training_graph().folded_batchnorm_casts, 0);
    int low_precision_bns = 0;
    for (const Node* node : folded->model().graph->nodes()) {
      if (node->op_type() != "BatchNormalizationTraining") continue;
      if (node->input(0)->dtype() == DType::kFloat32) continue;
      ++low_precision_bns;
      EXPECT_EQ(node->output(0)->dtype(), node->input(0)->dtype()) << node->name();
      EXPECT_EQ(node->input(1)->dtype(), DType::kFloat32) << node->name();
      EXPECT_EQ(node->output(1)->dtype(), DType::kFloat32) << node->name();
    }
    EXPECT_EQ(low_precision_bns, 8);
    ExpectTheSameTrainingBits(*folded, *unfolded, 5);
  }
}

// fold-layernorm-casts (passes/training_graph.cc): the transformer's
// LayerNormalizations between 16-bit neighbours (four of five: each
// encoder layer's two read the residual stream's 16-bit sum and feed
// 16-bit MatMuls; the last one feeds the float32 mean over tokens) run as
// castor's LayerNormalization on the 16-bit values with float32 Scale and
// B, and training gives the same bits as with the Casts: losses, weights
// and Adam moments over 4 steps, for both 16-bit types.
TEST(AutocastTrainingFormTest, FoldedLayerNormCastsTrainTheSameBits) {
  for (const char* policy : {"mixed_bfloat16", "mixed_float16"}) {
    SCOPED_TRACE(policy);
    TrainingGraphOptions unfolded_options;
    unfolded_options.fold_layernorm_casts = false;
    std::unique_ptr<training::Trainer> folded = MakeTrainer(policy, "transformer_opset17");
    std::unique_ptr<training::Trainer> unfolded =
        MakeTrainer(policy, "transformer_opset17", unfolded_options);
    EXPECT_EQ(folded->training_graph().folded_layernorm_casts, 4);
    EXPECT_EQ(unfolded->training_graph().folded_layernorm_casts, 0);
    int castor_forms = 0, onnx_forms = 0, low_precision_grads = 0;
    for (const Node* node : folded->model().graph->nodes()) {
      if (node->op_type() == "LayerNormalizationGrad") {
        low_precision_grads += node->input(1)->dtype() != DType::kFloat32;
        continue;
      }
      if (node->op_type() != "LayerNormalization") continue;
      if (node->domain().empty()) {
        ++onnx_forms;
        EXPECT_EQ(node->input(0)->dtype(), DType::kFloat32) << node->name();
        continue;
      }
      ++castor_forms;
      EXPECT_EQ(node->domain(), kCastorDomain) << node->name();
      EXPECT_NE(node->input(0)->dtype(), DType::kFloat32) << node->name();
      EXPECT_EQ(node->output(0)->dtype(), node->input(0)->dtype()) << node->name();
      EXPECT_EQ(node->input(1)->dtype(), DType::kFloat32) << node->name();
      EXPECT_EQ(node->input(2)->dtype(), DType::kFloat32) << node->name();
      const Node* producer = node->input(0)->producer();
      ASSERT_NE(producer, nullptr) << node->name();
      EXPECT_NE(producer->op_type(), "Cast") << node->name();
      for (const Use& use : node->output(0)->uses()) {
        EXPECT_NE(use.node->op_type(), "Cast") << node->name() << " read by " << use.node->name();
      }
    }
    EXPECT_EQ(castor_forms, 4);
    EXPECT_EQ(onnx_forms, 1);
    EXPECT_EQ(low_precision_grads, 4);
    ExpectTheSameTrainingBits(*folded, *unfolded, 5);
  }
}

// fuse-batchnorm-relu (passes/training_graph.cc): the ResNet's four
// BatchNormalization -> Relu pairs (the stem and each block's first; the
// second BatchNormalization of a block feeds the residual Add) run as
// BatchNormalizationTraining with relu = 1, and training gives the same
// bits as with the Relus: losses, weights, Adam moments and running
// statistics over 4 steps, in float32 and both 16-bit policies.
TEST(AutocastTrainingFormTest, FusedBatchNormReluTrainsTheSameBits) {
  for (const char* policy : {"float32", "mixed_bfloat16", "mixed_float16"}) {
    SCOPED_TRACE(policy);
    TrainingGraphOptions unfused_options;
    unfused_options.fuse_batchnorm_relu = false;
    std::unique_ptr<training::Trainer> fused = MakeTrainer(policy, "resnet_opset17");
    std::unique_ptr<training::Trainer> unfused =
        MakeTrainer(policy, "resnet_opset17", unfused_options);
    EXPECT_EQ(fused->training_graph().fused_batchnorm_relus, 4);
    EXPECT_EQ(unfused->training_graph().fused_batchnorm_relus, 0);
    int relus = 0, fused_nodes = 0, relu_grads = 0, masked_grads = 0;
    for (const Node* node : fused->model().graph->nodes()) {
      relus += node->op_type() == "Relu";
      fused_nodes += node->op_type() == "BatchNormalizationTraining" && node->GetInt("relu", 0);
      relu_grads += node->op_type() == "ReluGrad";
      masked_grads += node->op_type() == "BatchNormalizationGrad" && node->num_inputs() > 4 &&
                      node->input(4) != nullptr;
    }
    EXPECT_EQ(relus, 3);  // after the residual Adds
    EXPECT_EQ(fused_nodes, 4);
    // Their gradients: the Relu's applied inside BatchNormalizationGrad.
    EXPECT_EQ(relu_grads, 3);
    EXPECT_EQ(masked_grads, 4);
    ExpectTheSameTrainingBits(*fused, *unfused, 6);
  }
}

}  // namespace
}  // namespace castor
