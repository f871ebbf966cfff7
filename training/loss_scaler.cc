// LossScaler (see loss_scaler.h): option checks, the update rule
// (backend/common/update_rules.h), the floor diagnosis, and the checkpointed state
// as JSON.
#include "training/loss_scaler.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace castor {

LossScaler::LossScaler(LossScalerOptions options)
    : options_(std::move(options)) {
  state_.scale = options_.initial_scale;
}

absl::StatusOr<LossScaler> LossScaler::Create(LossScalerOptions options) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("loss scaling: ", what));
  };
  if (!(options.initial_scale > 0) || !std::isfinite(options.initial_scale)) {
    return bad(absl::StrFormat("initial scale must be a positive number, got %g",
                               options.initial_scale));
  }
  if (!(options.growth_factor > 1)) {
    return bad(absl::StrFormat("growth factor must be > 1, got %g", options.growth_factor));
  }
  if (!(options.backoff_factor > 0 && options.backoff_factor < 1)) {
    return bad(absl::StrFormat("backoff factor must be in (0, 1), got %g",
                               options.backoff_factor));
  }
  if (options.growth_interval < 1) {
    return bad(absl::StrCat("growth interval must be >= 1, got ", options.growth_interval));
  }
  if (!(options.min_scale > 0) || options.min_scale > options.initial_scale) {
    return bad(absl::StrFormat("floor must be in (0, initial scale %g], got %g",
                               options.initial_scale, options.min_scale));
  }
  if (options.floor_patience < 1) {
    return bad(absl::StrCat("floor patience must be >= 1, got ", options.floor_patience));
  }
  return LossScaler(std::move(options));
}

ScalerStep LossScaler::Update(bool all_finite) {
  ScalerStep step;
  step.scale_used = scale();
  UpdateLossScale(options_, all_finite, state_);
  step.skipped = !all_finite;
  if (step.skipped) step.diagnosis = Diagnosis();
  step.next_scale = scale();
  return step;
}

std::string LossScaler::Diagnosis() const {
  if (!FloorHitRepeatedly(options_, state_)) return "";
  return absl::StrFormat(
      "%d steps in a row overflowed with the loss scale at its floor (%g): the gradients "
      "are inf/NaN even unscaled, so skipping steps cannot help. The run has diverged, or "
      "a value overflows the 16-bit range in the forward pass. Try a lower learning rate, "
      "mixed_bfloat16 (float32's range), or keeping the overflowing ops in float32 "
      "(--fp32-ops); the log names the first non-finite node",
      state_.overflows_at_floor, options_.enabled ? options_.min_scale : 1.0);
}

Json LossScaler::ToJson() const {
  Json json = Json::Object();
  json.Set("enabled", Json::Bool(options_.enabled));
  json.Set("scale", Json::Number(state_.scale));
  json.Set("good_steps", Json::Int(state_.good_steps));
  json.Set("skipped_steps", Json::Int(state_.skipped_steps));
  json.Set("overflows_at_floor", Json::Int(state_.overflows_at_floor));
  json.Set("initial_scale", Json::Number(options_.initial_scale));
  json.Set("growth_factor", Json::Number(options_.growth_factor));
  json.Set("backoff_factor", Json::Number(options_.backoff_factor));
  json.Set("growth_interval", Json::Int(options_.growth_interval));
  json.Set("min_scale", Json::Number(options_.min_scale));
  json.Set("floor_patience", Json::Int(options_.floor_patience));
  return json;
}

absl::StatusOr<LossScaler> LossScaler::FromJson(const Json& json) {
  auto number = [&json](const char* key) -> absl::StatusOr<double> {
    const Json* field = json.Find(key);
    if (field == nullptr || !field->is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss scaler state: field '", key, "' is missing or not a number"));
    }
    return field->as_number();
  };
  auto integer = [&json](const char* key) -> absl::StatusOr<int64_t> {
    const Json* field = json.Find(key);
    if (field == nullptr || !field->is_int()) {
      return absl::InvalidArgumentError(
          absl::StrCat("loss scaler state: field '", key, "' is missing or not an integer"));
    }
    return field->as_int();
  };
  const Json* enabled = json.Find("enabled");
  if (!json.is_object() || enabled == nullptr || !enabled->is_bool()) {
    return absl::InvalidArgumentError(
        "loss scaler state: expected an object with a boolean 'enabled'");
  }
  LossScalerOptions options;
  options.enabled = enabled->as_bool();
  absl::StatusOr<double> initial = number("initial_scale"), growth = number("growth_factor"),
                         backoff = number("backoff_factor"), floor = number("min_scale"),
                         scale = number("scale");
  absl::StatusOr<int64_t> interval = integer("growth_interval"),
                          patience = integer("floor_patience"), good = integer("good_steps"),
                          skipped = integer("skipped_steps"),
                          at_floor = integer("overflows_at_floor");
  for (const absl::Status& s : {initial.status(), growth.status(), backoff.status(),
                                floor.status(), scale.status(), interval.status(),
                                patience.status(), good.status(), skipped.status(),
                                at_floor.status()}) {
    if (!s.ok()) return s;
  }
  options.initial_scale = *initial;
  options.growth_factor = *growth;
  options.backoff_factor = *backoff;
  options.min_scale = *floor;
  options.growth_interval = *interval;
  options.floor_patience = *patience;
  absl::StatusOr<LossScaler> scaler = Create(options);
  if (!scaler.ok()) return scaler.status();
  if (!(*scale >= options.min_scale) || !std::isfinite(*scale) || *good < 0 || *skipped < 0 ||
      *at_floor < 0) {
    return absl::InvalidArgumentError(
        "loss scaler state: scale below the floor or a negative counter");
  }
  scaler->state_ = LossScalerState{*scale, *good, *skipped, *at_floor};
  return scaler;
}

}  // namespace castor
