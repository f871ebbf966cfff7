// Dropout's counter-based masks (backend/common/philox.h): Philox4x32-10
// against Random123's known-answer vectors, the CPU kernel's masks as a
// function of (run seed, node, counter, element) with keep fractions
// within binomial bounds (com.castor DropoutTraining, the op castor's
// training graph runs), ONNX's Dropout refusing a fourth input, and in the
// training graph: every drawing Dropout becomes DropoutTraining reading
// castor.rng (the node's name and outputs kept, a mask output added), each
// step draws a new mask, the same seed draws the same masks, and the
// gradient reads the mask the forward pass drew
// (dX = dY * mask / (1 - ratio), checked through an SGD update against a
// float64 reference, no finite differences). The CUDA kernel's bits are
// checked against the CPU's in tests/cuda_shape_ops_test.cc; resume
// bit-exactness with Dropout in tests/train_command_test.cc.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "backend/common/philox.h"
#include "graph/gradient_builder.h"
#include "passes/verifier.h"
#include "graph/shape_inference.h"
#include "passes/training_graph.h"
#include "tests/kernel_test_util.h"
#include "tests/trainer_test_util.h"
#include "training/trainer.h"

namespace castor {
namespace {

using common::DropoutKey;
using common::DropoutKeeps;
using common::DropoutNodeStream;
using common::DropoutThreshold;
using common::Philox4x32_10;
using common::PhiloxWords;
using testing::Cpu;
using testing::F32;
using testing::I64;
using testing::RunOk;

Tensor True() {
  Tensor t(DType::kBool, {});
  t.data<uint8_t>()[0] = 1;
  return t;
}

// Random123's kat_vectors for philox4x32 with 10 rounds.
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Case {
    PhiloxWords counter;
    uint32_t key0, key1;
    PhiloxWords expected;
  };
  const Case cases[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Case& c : cases) {
    const PhiloxWords got = Philox4x32_10(c.counter, c.key0, c.key1);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got.v[w], c.expected.v[w]) << w;
  }
}

TEST(Philox, ThresholdIsRatioTimesTwoToThe32) {
  EXPECT_EQ(DropoutThreshold(0.0f), 0u);
  EXPECT_EQ(DropoutThreshold(0.5f), 0x80000000u);
  EXPECT_EQ(DropoutThreshold(0.25f), 0x40000000u);
  EXPECT_EQ(DropoutThreshold(0.1f), static_cast<uint32_t>(0.1f * 4294967296.0));
  EXPECT_EQ(DropoutThreshold(std::nextafter(1.0f, 0.0f)), 0xFFFFFF00u);
}

// The mask of the CPU kernel on n elements for (seed, counter), node "node".
Tensor CpuMask(int64_t n, float ratio, int64_t seed, int64_t counter) {
  Tensor x(DType::kFloat32, {n});
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = 1.0f + static_cast<float>(i % 7);
  std::vector<Tensor> out = RunOk("DropoutTraining",
                                  {x, Tensor::Scalar(ratio), I64({2}, {seed, counter})}, {}, 1, 2,
                                  kCastorDomain);
  EXPECT_EQ(out[1].dtype(), DType::kBool);
  const float scale = 1.0f / (1.0f - ratio);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = out[1].data<uint8_t>()[i] != 0;
    EXPECT_EQ(out[0].data<float>()[i], keep ? x.data<float>()[i] * scale : 0.0f) << i;
  }
  return out[1];
}

int64_t Kept(const Tensor& mask) {
  int64_t kept = 0;
  for (int64_t i = 0; i < mask.num_elements(); ++i) kept += mask.data<uint8_t>()[i] != 0;
  return kept;
}

// The kernel keeps exactly the elements philox.h says (key from the seed
// and the node's name, the counter from the state input), for a size that
// ends inside a group of four and one that spans several threads' ranges
// and blocks of drawn groups.
TEST(DropoutRng, CpuKernelDrawsThePhiloxMask) {
  const uint64_t key = DropoutKey(12345, DropoutNodeStream("node"));
  for (const int64_t size : {int64_t{1003}, int64_t{40001}}) {
    const Tensor mask = CpuMask(size, 0.3f, 12345, 7);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < size; ++i) {
      const bool keep = DropoutKeeps(key, 7, i, DropoutThreshold(0.3f));
      mismatches += (mask.data<uint8_t>()[i] != 0) != keep;
    }
    EXPECT_EQ(mismatches, 0) << size << " elements";
  }
  const int64_t n = 1003;
  // Without the state input (outside training graphs) the mask is numpy's
  // (tests/cpu_misc_loss_training_test.cc), not this one.
  Tensor x = F32({n}, std::vector<float>(n, 2.0f));
  std::vector<Tensor> attribute_seeded =
      RunOk("Dropout", {x, Tensor::Scalar(0.3f), True()}, {Attribute::Int("seed", 12345)}, 13, 2);
  EXPECT_NE(attribute_seeded[1], CpuMask(n, 0.3f, 12345, 0));
}

// Keep fractions within 5 standard deviations of the binomial mean, for
// several ratios and states.
TEST(DropoutRng, KeepFractionIsWithinBinomialBounds) {
  const int64_t n = 200000;
  for (const float ratio : {0.1f, 0.5f, 0.9f}) {
    for (const int64_t counter : {0, 1, 1000000007}) {
      const double p = 1.0 - ratio;
      const double sigma = std::sqrt(n * p * (1.0 - p));
      const int64_t kept = Kept(CpuMask(n, ratio, 99, counter));
      EXPECT_LE(std::abs(static_cast<double>(kept) - n * p), 5.0 * sigma)
          << "ratio " << ratio << " counter " << counter << ": kept " << kept;
    }
  }
}

// Same state, same mask; another counter, seed or node, an independent one
// (two independent masks of ratio 0.5 agree on half the elements).
TEST(DropoutRng, MasksDependOnSeedCounterAndNode) {
  const int64_t n = 100000;
  const Tensor base = CpuMask(n, 0.5f, 5, 3);
  EXPECT_EQ(CpuMask(n, 0.5f, 5, 3), base);
  auto agreement = [&](const Tensor& other) {
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += base.data<uint8_t>()[i] == other.data<uint8_t>()[i];
    return static_cast<double>(same) / n;
  };
  const double bound = 5.0 * std::sqrt(0.25 / n);
  EXPECT_NEAR(agreement(CpuMask(n, 0.5f, 5, 4)), 0.5, bound) << "next counter";
  EXPECT_NEAR(agreement(CpuMask(n, 0.5f, 6, 3)), 0.5, bound) << "next seed";
  // Another node name: the same kernel on a node called "other".
  const uint64_t other_key = DropoutKey(5, DropoutNodeStream("other"));
  Tensor other(DType::kBool, {n});
  for (int64_t i = 0; i < n; ++i) {
    other.data<uint8_t>()[i] = DropoutKeeps(other_key, 3, i, DropoutThreshold(0.5f)) ? 1 : 0;
  }
  EXPECT_NEAR(agreement(other), 0.5, bound) << "another node";
}

// castor's DropoutTraining: the ratio defaults to 0.5, ratio 0 keeps every
// element unscaled, and a ratio outside [0, 1) or a missing state is
// refused by name.
TEST(DropoutRng, DropoutTrainingRatioDefaultZeroAndErrors) {
  const int64_t n = 4099;
  Tensor x(DType::kFloat32, {n});
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = 0.5f + static_cast<float>(i % 5);
  const Tensor state = I64({2}, {77, 3});
  std::vector<Tensor> half =
      RunOk("DropoutTraining", {x, Tensor(), state}, {}, 1, 2, kCastorDomain);
  const uint64_t key = DropoutKey(77, DropoutNodeStream("node"));
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = DropoutKeeps(key, 3, i, DropoutThreshold(0.5f));
    ASSERT_EQ(half[1].data<uint8_t>()[i] != 0, keep) << i;
    ASSERT_EQ(half[0].data<float>()[i], keep ? 2.0f * x.data<float>()[i] : 0.0f) << i;
  }
  std::vector<Tensor> none =
      RunOk("DropoutTraining", {x, Tensor::Scalar(0.0f), state}, {}, 1, 2, kCastorDomain);
  EXPECT_EQ(none[0], x);
  EXPECT_EQ(Kept(none[1]), n);
  // A constant ratio outside [0, 1) is refused when the graph is inferred.
  testing::SingleNode bad("DropoutTraining", {x, Tensor::Scalar(1.0f), state}, {}, 1, 2,
                          kCastorDomain, {1});
  EXPECT_FALSE(bad.status().ok());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("ratio 1 is outside [0, 1)"));
  // A fed one, when the kernel runs.
  testing::SingleNode fed("DropoutTraining", {x, Tensor::Scalar(1.5f), state}, {}, 1, 2,
                          kCastorDomain);
  ASSERT_TRUE(fed.status().ok()) << fed.status();
  absl::StatusOr<std::vector<Tensor>> ran = fed.Run(Cpu());
  EXPECT_FALSE(ran.ok());
  EXPECT_THAT(ran.status().message(), ::testing::HasSubstr("ratio 1.5 is outside [0, 1)"));
  testing::SingleNode stateless("DropoutTraining", {x, Tensor::Scalar(0.5f)}, {}, 1, 2,
                                kCastorDomain);
  EXPECT_THAT(stateless.status().message(), ::testing::HasSubstr("input 2 (the RNG state"));
  testing::SingleNode short_state("DropoutTraining", {x, Tensor::Scalar(0.5f), I64({3}, {1, 2, 3})},
                                  {}, 1, 2, kCastorDomain);
  EXPECT_THAT(short_state.status().message(), ::testing::HasSubstr("must be int64 [2]"));
}

// ONNX's Dropout takes one to three inputs: a model giving it a fourth (the
// RNG state castor's training graph once put there) is refused by the
// verifier, naming the node.
TEST(DropoutRng, OnnxDropoutWithAFourthInputIsRefused) {
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", 13});
  Graph& g = *model.graph;
  Value* x = *g.AddInput("x", DType::kFloat32, Shape{Dim(2), Dim(3)});
  Value* ratio = *g.AddInitializer("ratio", Tensor::Scalar(0.5f));
  Value* training = *g.AddInitializer("training", True());
  Value* state = *g.AddInitializer("state", I64({2}, {1, 2}));
  Node* dropout = *g.AddNode("Dropout", {x, ratio, training, state}, {"y", "mask"}, "four_inputs");
  g.AddOutput(dropout->output(0));
  const absl::Status verified = VerifyModel(model, {.check_types = false});
  EXPECT_FALSE(verified.ok());
  EXPECT_THAT(verified.message(), ::testing::HasSubstr("four_inputs"));
  EXPECT_THAT(verified.message(), ::testing::HasSubstr("has 4 inputs; expected 1..3"));
}

// x [4, 6] -> Mul(w [6]) -> Dropout(0.5, training) -> logits; mse loss.
Model DropoutModel() {
  Model model;
  model.ir_version = 8;
  model.opset_imports.push_back({"", 17});
  Graph& g = *model.graph;
  Value* x = *g.AddInput("x", DType::kFloat32, Shape{Dim(4), Dim(6)});
  std::vector<float> w(6);
  for (int i = 0; i < 6; ++i) w[i] = 0.5f + 0.25f * static_cast<float>(i);
  Value* weight = *g.AddInitializer("w", Tensor::FromVector<float>(DType::kFloat32, {6}, w));
  Node* mul = *g.AddNode("Mul", {x, weight}, {"scaled"}, "mul");
  Value* ratio = *g.AddInitializer("ratio", Tensor::Scalar(0.5f));
  Value* training = *g.AddInitializer("training", True());
  Node* dropout =
      *g.AddNode("Dropout", {mul->output(0), ratio, training}, {"logits", "mask"}, "dropout");
  g.AddOutput(dropout->output(0));
  EXPECT_TRUE(InferTypes(model).ok());
  return model;
}

Tensor Batch() {
  Tensor x(DType::kFloat32, {4, 6});
  for (int64_t i = 0; i < 24; ++i) x.data<float>()[i] = 0.1f * static_cast<float>(i % 11) + 0.3f;
  return x;
}

std::unique_ptr<training::Trainer> MakeTrainer(uint64_t seed, double lr) {
  Model model = DropoutModel();
  TrainingGraphOptions options;
  options.loss = LossKind::kMeanSquaredError;
  absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, options);
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return nullptr;
  EXPECT_EQ(graph->rng_dropouts, 1);
  EXPECT_NE(model.graph->FindValue(kRngStateInput), nullptr);
  training::TrainerOptions trainer_options;
  trainer_options.optimizer.kind = OptimizerKind::kSgd;
  trainer_options.lr.base_lr = lr;
  trainer_options.rng_seed = seed;
  absl::StatusOr<std::unique_ptr<training::Trainer>> trainer =
      training::Trainer::Create(std::move(model), *graph, trainer_options, Cpu());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return trainer.ok() ? *std::move(trainer) : nullptr;
}

// The training graph runs the model's Dropout as castor's DropoutTraining:
// the node's name (its masks' stream) and output names, the ratio, the
// state castor.rng as input 2, no ONNX Dropout left; a valid graph. A
// Dropout without a mask output gets one (its gradient reads it) and a
// Dropout with training_mode false stays ONNX's (it never draws).
TEST(DropoutRng, TrainingGraphRunsDropoutTraining) {
  for (const bool with_mask : {true, false}) {
    Model model = DropoutModel();
    Graph& g = *model.graph;
    if (!with_mask) {  // the same Dropout with only its output
      Node* old = g.FindNode("dropout");
      Node* single = *g.AddNode("Dropout", {old->input(0), old->input(1), old->input(2)},
                                {"single"}, "single_output");
      g.ReplaceAllUsesWith(old->output(0), single->output(0));
      ASSERT_TRUE(g.RemoveNode(old).ok());
      ASSERT_TRUE(g.RenameValue(single->output(0), "logits").ok());
      single->set_name("dropout");
    }
    Value* off = *g.AddInitializer("off", Tensor(DType::kBool, {}));
    Node* inference = *g.AddNode("Dropout", {g.FindValue("x"), g.FindValue("ratio"), off},
                                 {"unused"}, "inference_dropout");
    g.AddOutput(inference->output(0));
    ASSERT_TRUE(InferTypes(model).ok());
    TrainingGraphOptions options;
    options.loss = LossKind::kMeanSquaredError;
    options.output = "logits";
    absl::StatusOr<TrainingGraph> graph = BuildTrainingGraph(model, options);
    ASSERT_TRUE(graph.ok()) << graph.status();
    EXPECT_EQ(graph->rng_dropouts, 1);
    const Node* training = g.FindNode("dropout");
    ASSERT_NE(training, nullptr);
    EXPECT_EQ(training->op_type(), "DropoutTraining");
    EXPECT_EQ(training->domain(), kCastorDomain);
    ASSERT_EQ(training->num_inputs(), 3);
    EXPECT_EQ(training->input(0)->name(), "scaled");
    EXPECT_EQ(training->input(1)->name(), "ratio");
    EXPECT_EQ(training->input(2)->name(), kRngStateInput);
    ASSERT_EQ(training->num_outputs(), 2);
    EXPECT_EQ(training->output(0)->name(), "logits");
    EXPECT_EQ(training->output(1)->name(), with_mask ? "mask" : "logits/mask");
    EXPECT_FALSE(training->output(1)->uses().empty()) << "the gradient reads the mask";
    int onnx_dropouts = 0;
    for (const Node* node : g.nodes()) {
      onnx_dropouts += node->domain().empty() && node->op_type() == "Dropout";
    }
    EXPECT_EQ(onnx_dropouts, 1) << "only the inference-mode Dropout stays ONNX's";
    EXPECT_EQ(g.FindNode("inference_dropout")->num_inputs(), 3);
    EXPECT_EQ(model.OpsetVersion(kCastorDomain), 1);
    EXPECT_TRUE(VerifyModel(model).ok()) << VerifyModel(model);
  }
}

// The kept elements of a step's output (all inputs and weights are nonzero).
std::vector<bool> KeptOf(const Tensor& output) {
  std::vector<bool> kept(output.num_elements());
  for (int64_t i = 0; i < output.num_elements(); ++i) kept[i] = output.data<float>()[i] != 0.0f;
  return kept;
}

TEST(DropoutRng, TrainingStepsDrawNewMasksAndTheSameSeedTheSameOnes) {
  const Tensor labels(DType::kFloat32, {4, 6});  // zeros
  std::unique_ptr<training::Trainer> a = MakeTrainer(11, 0.0);
  std::unique_ptr<training::Trainer> b = MakeTrainer(11, 0.0);
  std::unique_ptr<training::Trainer> c = MakeTrainer(12, 0.0);
  ASSERT_TRUE(a && b && c);
  std::vector<std::vector<bool>> masks;
  for (int step = 0; step < 4; ++step) {
    absl::StatusOr<training::StepResult> ra = a->Step({{"x", Batch()}}, labels);
    absl::StatusOr<training::StepResult> rb = b->Step({{"x", Batch()}}, labels);
    absl::StatusOr<training::StepResult> rc = c->Step({{"x", Batch()}}, labels);
    ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok()) << ra.status() << rb.status() << rc.status();
    EXPECT_EQ(ra->output, rb->output) << "step " << step << ": the same seed, the same mask";
    masks.push_back(KeptOf(ra->output));
    if (step == 0) {
      EXPECT_NE(KeptOf(rc->output), masks[0]) << "another seed";
    }
    EXPECT_EQ(a->rng_state().counter, step + 1);
  }
  for (int step = 1; step < 4; ++step) EXPECT_NE(masks[step], masks[0]) << step;
  // Restoring the state replays the masks: b set back to counter 1 draws
  // a's step-2 mask.
  b->set_rng_state({11, 1});
  absl::StatusOr<training::StepResult> again = b->Step({{"x", Batch()}}, labels);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(KeptOf(again->output), masks[1]);
}

// The gradient reads the forward pass's mask: with SGD (lr 1) on
// L = mean(y^2), y = mask * x * w / (1 - r), the update of w_j is
// -sum_n 2 * y_nj * mask_nj * x_nj / (1 - r) / (N * J), computed in float64
// from the mask the step's output shows.
TEST(DropoutRng, GradientUsesTheDrawnMask) {
  std::unique_ptr<training::Trainer> trainer = MakeTrainer(3, 1.0);
  ASSERT_TRUE(trainer);
  const Tensor x = Batch();
  const Tensor labels(DType::kFloat32, {4, 6});
  for (int step = 0; step < 3; ++step) {
    const std::map<std::string, Tensor> before = tools::StateOf(*trainer);
    absl::StatusOr<training::StepResult> result = trainer->Step({{"x", x}}, labels);
    ASSERT_TRUE(result.ok()) << result.status();
    const std::map<std::string, Tensor> after = tools::StateOf(*trainer);
    const std::vector<bool> kept = KeptOf(result->output);
    int64_t dropped = 0;
    for (int j = 0; j < 6; ++j) {
      const double w = before.at("w").data<float>()[j];
      double grad = 0;
      for (int n = 0; n < 4; ++n) {
        const double xv = x.data<float>()[n * 6 + j];
        const double mask = kept[n * 6 + j] ? 1.0 : 0.0;
        dropped += kept[n * 6 + j] ? 0 : 1;
        const double y = mask * xv * w / 0.5;
        grad += 2.0 * y * mask * xv / 0.5 / 24.0;
      }
      const double update = after.at("w").data<float>()[j] - w;
      EXPECT_NEAR(update, -grad, 1e-6 * (1.0 + std::abs(grad))) << "step " << step << " w" << j;
    }
    EXPECT_GT(dropped, 0);
    EXPECT_LT(dropped, 24);
  }
}

}  // namespace
}  // namespace castor
