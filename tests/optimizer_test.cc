// Tests for training/optimizer.h: SGD (plain, momentum with weight decay,
// Nesterov), Adam (with L2 weight decay, with clipping) and AdamW against
// PyTorch's trajectories (tests/data/optimizer_golden.json, written by
// generate_optimizer_golden.py beside it with Debian's torch 1.13); the
// learning-rate schedules; option and parameter errors.
#include "training/optimizer.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "graph/json.h"
#include "gtest/gtest.h"

namespace castor {
namespace {

using ::testing::HasSubstr;

Json Golden() {
  std::ifstream in(std::string(CASTOR_SOURCE_DIR) + "/tests/data/optimizer_golden.json");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Json> json = Json::Parse(text.str());
  EXPECT_TRUE(json.ok()) << json.status();
  return json.ok() ? *json : Json::Object();
}

std::vector<float> Floats(const Json& array) {
  std::vector<float> values;
  for (const Json& item : array.items()) values.push_back(static_cast<float>(item.as_number()));
  return values;
}

double OptionOr(const Json& options, const char* key, double fallback) {
  const Json* value = options.Find(key);
  return value == nullptr ? fallback : value->is_bool() ? value->as_bool() : value->as_number();
}

TEST(OptimizerTest, MatchesPyTorchTrajectories) {
  const Json golden = Golden();
  const Json* cases = golden.Find("cases");
  ASSERT_NE(cases, nullptr);
  ASSERT_EQ(cases->members().size(), 7u);
  for (const auto& [name, spec] : cases->members()) {
    SCOPED_TRACE(name);
    const Json& options_json = *spec.Find("options");
    OptimizerOptions options;
    options.kind = *ParseOptimizerKind(spec.Find("optimizer")->as_string());
    options.momentum = OptionOr(options_json, "momentum", 0.0);
    options.nesterov = OptionOr(options_json, "nesterov", 0.0) != 0.0;
    // PyTorch's AdamW defaults weight_decay to 1e-2; every case here sets it.
    options.weight_decay = OptionOr(options_json, "weight_decay", 0.0);
    options.clip_norm = spec.Find("clip_norm")->as_number();
    const double lr = OptionOr(options_json, "lr", 0.0);
    absl::StatusOr<Optimizer> optimizer = Optimizer::Create(options);
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();

    const std::vector<float> start = Floats(*golden.Find("start"));
    Tensor weight = Tensor::FromVector<float>(DType::kFloat32, {2, 3}, start);
    const std::vector<Json>& gradients = golden.Find("gradients")->items();
    const std::vector<Json>& expected = spec.Find("weights")->items();
    for (size_t step = 0; step < expected.size(); ++step) {
      Tensor gradient = Tensor::FromVector<float>(DType::kFloat32, {2, 3}, Floats(gradients[step]));
      ASSERT_TRUE(optimizer->Step({{"w", &weight, &gradient}}, lr).ok());
      const std::vector<float> want = Floats(expected[step]);
      for (int i = 0; i < 6; ++i) {
        EXPECT_NEAR(weight.data<float>()[i], want[i], 2e-6 + 2e-6 * std::fabs(want[i]))
            << "step " << step + 1 << " element " << i;
      }
    }
    EXPECT_EQ(optimizer->step(), static_cast<int64_t>(expected.size()));
  }
}

TEST(OptimizerTest, ClippingReturnsTheNormBeforeClipping) {
  OptimizerOptions options;
  options.kind = OptimizerKind::kSgd;
  options.clip_norm = 1.0;
  Optimizer optimizer = *Optimizer::Create(options);
  Tensor w = Tensor::FromVector<float>(DType::kFloat32, {2}, {0.0f, 0.0f});
  Tensor g = Tensor::FromVector<float>(DType::kFloat32, {2}, {3.0f, 4.0f});
  absl::StatusOr<double> norm = optimizer.Step({{"w", &w, &g}}, 1.0);
  ASSERT_TRUE(norm.ok());
  EXPECT_DOUBLE_EQ(*norm, 5.0);
  EXPECT_NEAR(w.data<float>()[0], -0.6f, 1e-6);  // clipped to norm 1: (0.6, 0.8)
  EXPECT_NEAR(w.data<float>()[1], -0.8f, 1e-6);
}

TEST(OptimizerTest, LearningRateSchedules) {
  LrSchedule constant;
  constant.base_lr = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(constant, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(constant, 1000), 0.1);

  LrSchedule step;
  step.kind = LrSchedule::Kind::kStep;
  step.base_lr = 1.0;
  step.step_size = 10;
  step.gamma = 0.5;
  EXPECT_DOUBLE_EQ(LearningRate(step, 1), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(step, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(step, 11), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(step, 21), 0.25);

  LrSchedule cosine;
  cosine.kind = LrSchedule::Kind::kCosine;
  cosine.base_lr = 1.0;
  cosine.warmup_steps = 10;
  cosine.total_steps = 110;
  cosine.min_lr = 0.0;
  EXPECT_DOUBLE_EQ(LearningRate(cosine, 1), 0.1);   // warmup is linear
  EXPECT_DOUBLE_EQ(LearningRate(cosine, 10), 1.0);
  EXPECT_NEAR(LearningRate(cosine, 60), 0.5, 1e-12);  // half way down
  EXPECT_NEAR(LearningRate(cosine, 110), 0.0, 1e-12);
  EXPECT_NEAR(LearningRate(cosine, 500), 0.0, 1e-12);  // stays at min_lr
}

TEST(OptimizerTest, ErrorsNameTheOptionOrParameter) {
  OptimizerOptions options;
  options.beta1 = 1.0;
  EXPECT_THAT(std::string(Optimizer::Create(options).status().message()),
              HasSubstr("betas must be in [0, 1)"));
  options = {};
  options.nesterov = true;
  EXPECT_THAT(std::string(Optimizer::Create(options).status().message()),
              HasSubstr("nesterov needs sgd with momentum > 0"));
  EXPECT_THAT(std::string(ParseOptimizerKind("lamb").status().message()),
              HasSubstr("unknown optimizer 'lamb'; expected sgd, adam or adamw"));
  Optimizer optimizer = *Optimizer::Create({});
  Tensor w(DType::kFloat32, {2});
  Tensor g(DType::kFloat32, {3});
  EXPECT_THAT(std::string(optimizer.Step({{"fc.weight", &w, &g}}, 0.1).status().message()),
              HasSubstr("parameter 'fc.weight' is float32[2] with a float32[3] gradient"));
}

}  // namespace
}  // namespace castor
