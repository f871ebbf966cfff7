// Builds the training graph of a (converted) model: the loss attached to a
// named output, every BatchNormalization replaced by castor's
// BatchNormalizationTraining (batch statistics, running statistics updated
// as PyTorch's train() updates them: the variance unbiased) with castor's
// running-statistic outputs (whatever form and opset the exporter wrote:
// inference form, training_mode=1 with one or three outputs, or five
// outputs below opset 14), and the backward
// graph from the autodiff pass seeded with the loss scale. The parameters
// are the float32 initializers with a differentiable path to the loss
// (not the running statistics, not an op's settings such as Dropout's
// ratio).
//
// The result is one ONNX graph a backend runs per step:
//   inputs   the model's inputs, the labels (castor.labels: int64 [N] for
//            cross-entropy on [N, C] logits, [N, d1, ...] on [N, d1, ..., C]
//            logits, float32 shaped like the output for mse and bce), the loss scale
//            (castor.loss_scale, float32 scalar, an input with initializer
//            1: the trainer's step kernels write each step's scale into the
//            backend's copy, so it is not fed), and where a Dropout can draw
//            (opset 12 or later with a training_mode input) the RNG state
//            (castor.rng, int64 [seed, counter], an input with initializer
//            the trainer overwrites before each run: the masks are a
//            function of the run seed, the node, the counter and the
//            element, backend/common/philox.h)
//   outputs  the loss (castor.loss, float32 scalar, unscaled), the model
//            output it is attached to, the gradient of every parameter
//            (scaled by the loss scale: the trainer's step kernels unscale
//            and check them in one pass, in place, so each is a value of
//            its own), and each BatchNormalization's new
//            running mean/variance (committed only by steps not skipped).
//
// A Relu read only by a MaxPool (none of whose windows is all padding)
// runs after it instead, on the pooled, smaller tensor: the same values and
// gradients to the bit, in both graphs.
//
// A float32 value that the forward pass widened from a 16-bit one and the
// backward pass reads again (BatchNormalization's X behind a 16-bit Conv)
// is widened a second time just before its first backward reader, so the
// step keeps the 16-bit value alive instead of the float32 one.
//
// Alongside it, the evaluation graph: the same model forward only, with the
// loss attached, as PyTorch's eval() runs it: BatchNormalization in
// inference form (it reads the running statistics) and Dropout as identity. Inputs: the model's inputs and the labels; outputs:
// the loss and the model output.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "passes/pass_manager.h"

namespace castor {

inline constexpr const char* kLabelsInput = "castor.labels";
inline constexpr const char* kLossScaleInput = "castor.loss_scale";
inline constexpr const char* kLossOutput = "castor.loss";
// The RNG state of the step's Dropout draws: int64 [seed, counter], an
// input with initializer [0, 0] that the trainer overwrites before each run
// (training/trainer.h); input 2 of every com.castor DropoutTraining, which
// the training graph runs in place of each Dropout that draws.
inline constexpr const char* kRngStateInput = "castor.rng";

enum class LossKind {
  // Integer labels [N] against logits [N, C], or [N, d1, ...] against
  // [N, d1, ..., C] (class axis last, as torch's [N, T, V] sequence
  // logits: the logits are transposed to ONNX's [N, C, d1, ...]); the mean
  // over every position whose label is not the ignore index.
  kSoftmaxCrossEntropy,
  kMeanSquaredError,     // float targets shaped like the output (mean)
  // Binary cross-entropy with logits, multi-label (torch's
  // BCEWithLogitsLoss): float targets shaped like the output, the mean over
  // every element of max(x, 0) - x * y + log(1 + exp(-|x|)).
  kBinaryCrossEntropy,
  kModelOutput,          // the named output already is a scalar loss
};

// "cross-entropy" (also "softmax-cross-entropy", "sce"), "mse", "bce", "output".
absl::StatusOr<LossKind> ParseLossKind(const std::string& name);

struct TrainingGraphOptions {
  std::string output = "logits";  // the model output the loss is attached to
  LossKind loss = LossKind::kSoftmaxCrossEntropy;
  // Cross-entropy: labels equal to it count neither in the loss nor in the
  // mean (SoftmaxCrossEntropyLoss's ignore_index; torch's default is -100).
  std::optional<int64_t> ignore_index;
  // Swap Relu -> MaxPool into MaxPool -> Relu (off only to compare).
  bool pool_before_relu = true;
  // Fold 16-bit -> float32 -> 16-bit Casts around a BatchNormalization
  // into it (off only to compare: the values are the same bits).
  bool fold_batchnorm_casts = true;
  // The same around a LayerNormalization (off only to compare: the
  // values are the same bits).
  bool fold_layernorm_casts = true;
  // Have a BatchNormalization apply the Relu after it (off only to
  // compare: the values are the same bits).
  bool fuse_batchnorm_relu = true;
  // Run the erf form of GELU as castor's Gelu (off only to compare).
  bool fuse_gelu = true;
  // Fine-tuning (ECMAScript regular expressions, matched anywhere in the
  // name as std::regex_search does; anchor with ^...$ for a whole name):
  // parameters whose initializer name matches `freeze`, or does not match
  // `train_only`, stay fixed: no gradient is built for them. "" = unset.
  // A pattern that is invalid, or matches no parameter, is an error
  // naming it.
  std::string freeze;
  std::string train_only;
};

struct TrainingGraph {
  // Parameters (float32 initializers) and their gradient outputs, in
  // initializer order.
  std::vector<std::pair<std::string, std::string>> gradients;
  // Parameters kept fixed by `freeze` / `train_only` (initializer order):
  // they would train otherwise.
  std::vector<std::string> frozen;
  // BatchNormalization running statistics: (initializer, output holding
  // its value after the step).
  std::vector<std::pair<std::string, std::string>> running_stats;
  std::string model_output;  // the output the loss is attached to
  LossKind loss = LossKind::kSoftmaxCrossEntropy;
  std::optional<int64_t> ignore_index;  // as the options gave it
  int backward_nodes = 0;  // the recasts included
  // Widening Casts repeated for the backward pass (its readers read a new
  // Cast of the 16-bit value, so the float32 copy is not kept across the
  // step).
  int backward_recasts = 0;
  // Relu -> MaxPool pairs of the training graph run as MaxPool -> Relu.
  int pooled_relus = 0;
  // BatchNormalizations that read and write their 16-bit neighbours'
  // values directly (fold-batchnorm-casts).
  int folded_batchnorm_casts = 0;
  // LayerNormalizations that read and write their 16-bit neighbours'
  // values directly, as castor's LayerNormalization (fold-layernorm-casts).
  int folded_layernorm_casts = 0;
  // Relus applied by the BatchNormalization before them
  // (fuse-batchnorm-relu).
  int fused_batchnorm_relus = 0;
  // Erf-form GELU chains run as one castor Gelu (fuse-gelu).
  int fused_gelus = 0;
  // Dropout nodes that read the RNG state (kRngStateInput; the input
  // exists only when there is one).
  int rng_dropouts = 0;
  // The forward-only evaluation graph (types inferred). Its initializers
  // carry the same names as the training graph's, so the trainer updates
  // both from one state.
  std::shared_ptr<const Model> evaluation;
};

// The training rewrites as passes, in order (pass_manager.h): evaluation-
// graph, batchnorm-training, then as asked pool-before-relu,
// fold-batchnorm-casts, fold-layernorm-casts, fuse-batchnorm-relu and
// fuse-gelu, attach-loss (with Dropout's RNG state), autodiff, step-outputs.
// Running them fills `*result`, which must outlive the manager's run.
void AddTrainingPasses(PassManager& manager, const TrainingGraphOptions& options,
                       TrainingGraph* result);

// Rewrites `model` (types inferred) into its training graph by running those
// passes, the graph verified after each. Errors name the output, the node
// or the op (e.g. a BatchNormalization below opset 14, an op without a
// gradient on the way to a parameter).
absl::StatusOr<TrainingGraph> BuildTrainingGraph(Model& model,
                                                 const TrainingGraphOptions& options,
                                                 const PassManagerOptions& manager_options = {});

}  // namespace castor
