// Tests for training/loss_scaler.h: PyTorch GradScaler's defaults and update
// rule (backoff on overflow, growth after the interval), the floor and its
// diagnosis, the disabled form, option validation and the JSON state round
// trip. The fused unscale-and-check is a step kernel (step_kernels_test).
#include "training/loss_scaler.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace castor {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(LossScalerTest, DefaultsAreGradScalers) {
  const LossScalerOptions options;
  EXPECT_EQ(options.initial_scale, 65536.0);
  EXPECT_EQ(options.growth_factor, 2.0);
  EXPECT_EQ(options.backoff_factor, 0.5);
  EXPECT_EQ(options.growth_interval, 2000);
  EXPECT_EQ(options.min_scale, 1.0);
  EXPECT_EQ(LossScaler().scale(), 65536.0);
}

TEST(LossScalerTest, OverflowSkipsAndHalvesGoodStepsGrowAfterTheInterval) {
  LossScalerOptions options;
  options.growth_interval = 3;
  LossScaler scaler(options);
  ScalerStep step = scaler.Update(/*all_finite=*/false);
  EXPECT_TRUE(step.skipped);
  EXPECT_EQ(step.scale_used, 65536.0);
  EXPECT_EQ(step.next_scale, 32768.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  for (int i = 0; i < 2; ++i) {
    step = scaler.Update(true);
    EXPECT_FALSE(step.skipped);
    EXPECT_EQ(step.next_scale, 32768.0);
  }
  step = scaler.Update(true);  // third good step in a row: grow
  EXPECT_EQ(step.next_scale, 65536.0);
  EXPECT_EQ(scaler.good_steps(), 0);
  // An overflow restarts the count: two good steps then one bad, no growth.
  scaler.Update(true);
  scaler.Update(true);
  step = scaler.Update(false);
  EXPECT_EQ(step.next_scale, 32768.0);
  EXPECT_EQ(scaler.good_steps(), 0);
  EXPECT_EQ(scaler.skipped_steps(), 2);
}

TEST(LossScalerTest, FloorHoldsAndRepeatedOverflowAtItIsDiagnosed) {
  LossScalerOptions options;
  options.initial_scale = 4.0;
  options.min_scale = 1.0;
  options.floor_patience = 3;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.Update(false).next_scale, 2.0);
  EXPECT_EQ(scaler.Update(false).next_scale, 1.0);
  ScalerStep step;
  for (int i = 0; i < 2; ++i) {
    step = scaler.Update(false);
    EXPECT_EQ(step.next_scale, 1.0);  // never below the floor
    EXPECT_THAT(step.diagnosis, IsEmpty());
  }
  step = scaler.Update(false);
  EXPECT_TRUE(step.skipped);
  EXPECT_THAT(step.diagnosis, HasSubstr("3 steps in a row overflowed with the loss scale at its "
                                        "floor (1)"));
  EXPECT_THAT(step.diagnosis, HasSubstr("mixed_bfloat16"));
  // A good step clears it.
  EXPECT_THAT(scaler.Update(true).diagnosis, IsEmpty());
  EXPECT_THAT(scaler.Update(false).diagnosis, IsEmpty());
}

TEST(LossScalerTest, DisabledKeepsScaleOneButStillSkipsNonFiniteSteps) {
  LossScalerOptions options;
  options.enabled = false;
  options.floor_patience = 2;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.scale(), 1.0);
  ScalerStep step = scaler.Update(false);
  EXPECT_TRUE(step.skipped);
  EXPECT_EQ(step.next_scale, 1.0);
  step = scaler.Update(false);
  EXPECT_THAT(step.diagnosis, HasSubstr("2 steps in a row overflowed"));
  for (int i = 0; i < 5000; ++i) scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 1.0);  // never grows
}

TEST(LossScalerTest, OptionsAreValidatedWithTheirNames) {
  auto error = [](LossScalerOptions options) {
    absl::StatusOr<LossScaler> scaler = LossScaler::Create(options);
    return scaler.ok() ? std::string() : std::string(scaler.status().message());
  };
  LossScalerOptions options;
  EXPECT_EQ(error(options), "");
  options.growth_factor = 1.0;
  EXPECT_THAT(error(options), HasSubstr("growth factor must be > 1"));
  options = {};
  options.backoff_factor = 1.0;
  EXPECT_THAT(error(options), HasSubstr("backoff factor must be in (0, 1)"));
  options = {};
  options.min_scale = 1e9;
  EXPECT_THAT(error(options), HasSubstr("floor must be in (0, initial scale 65536]"));
  options = {};
  options.growth_interval = 0;
  EXPECT_THAT(error(options), HasSubstr("growth interval must be >= 1"));
}

TEST(LossScalerTest, StateRoundTripsThroughJson) {
  LossScalerOptions options;
  options.growth_interval = 7;
  LossScaler scaler(options);
  scaler.Update(false);
  scaler.Update(true);
  scaler.Update(true);
  absl::StatusOr<LossScaler> restored = LossScaler::FromJson(scaler.ToJson());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->scale(), scaler.scale());
  EXPECT_EQ(restored->good_steps(), 2);
  EXPECT_EQ(restored->skipped_steps(), 1);
  EXPECT_EQ(restored->options().growth_interval, 7);
  EXPECT_TRUE(restored->ToJson() == scaler.ToJson());
  // Both continue identically.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(restored->Update(i % 4 != 3).next_scale, scaler.Update(i % 4 != 3).next_scale);
  }
  Json broken = scaler.ToJson();
  broken.Set("scale", Json::String("big"));
  absl::StatusOr<LossScaler> rejected = LossScaler::FromJson(broken);
  ASSERT_FALSE(rejected.ok());
  EXPECT_THAT(rejected.status().message(), HasSubstr("field 'scale'"));
}

}  // namespace
}  // namespace castor
