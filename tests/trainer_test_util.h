// Test helper: a Trainer's state copied from its backend.
#pragma once

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "training/trainer.h"

namespace castor::tools {

// The weights and running statistics by name; empty (and a test failure)
// when the copy fails.
inline std::map<std::string, Tensor> StateOf(const training::Trainer& trainer) {
  absl::StatusOr<training::Trainer::Snapshot> snapshot = trainer.TakeSnapshot();
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  return snapshot.ok() ? std::move(snapshot->state) : std::map<std::string, Tensor>{};
}

}  // namespace castor::tools
