// The unroll-recurrent pass: rewrites every LSTM, GRU and RNN node (what
// torch.onnx.export writes for nn.LSTM, nn.GRU, nn.RNN) into primitive ops
// castor already runs and differentiates on both backends (MatMul, Add,
// Sub, Mul, the activations, Clip, Gather, Transpose, Unsqueeze, Concat,
// Constant; Less and Where for sequence_lens), so forward, gradient and
// autocast need nothing of their own.
// It runs first on an imported model, before canonicalize (which then
// removes what nobody reads, e.g. an unread Y).
//
// Per node and direction d (formulas and gate order as ONNX defines them):
//   1. Wd = W[d], Rd = R[d] (Gather), transposed once.
//   2. The input projection for all time steps at once:
//      P = X @ Wd^T + Wb (+ Rb, except GRU's h block with
//      linear_before_reset = 1), one MatMul over [seq, batch, input].
//   3. Per time step t (reversed for direction "reverse" and the second
//      direction of "bidirectional"): P[t] (Gather on the time axis), the
//      recurrent MatMul with Rd^T, the gates (Gather of column blocks),
//      `clip` on the gate inputs, the activations f, g, h (with their
//      alpha/beta), LSTM peepholes P and input_forget, GRU
//      linear_before_reset. A missing initial_h / initial_c is zeros: the
//      first step leaves out the terms that read it.
//   3b. sequence_lens (unless absent or a constant equal to the length):
//      at steps t >= sequence_lens[b] batch entry b keeps its state and
//      writes zeros to Y (Less + Where), which is ONNX's rule for both
//      directions (a reverse pass meets the padding first); a length-0
//      entry gets zero Y_h / Y_c, as ONNX Runtime gives.
//   4. Y stacks the h of every step (Unsqueeze + Concat) in ONNX's layout
//      (0: [seq, D, batch, H], 1: [batch, seq, D, H]); Y_h (and LSTM's Y_c)
//      is the last step's state per direction. The outputs keep their
//      names, so graph outputs and readers are unchanged.
// The nodes emitted are valid at the model's opset (Unsqueeze's axes and
// Clip's bounds as attributes or inputs).
//
// Refused, naming the node and what to do: a sequence length that is not
// a static number (export with a fixed sequence length), sequence_lens
// that needs masking below opset 9 or holds a length outside [0, seq],
// the activations Affine and ScaledTanh, a wrong number of activations.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "passes/pass.h"

namespace castor {

struct UnrollRecurrentReport {
  int lstm_nodes = 0;
  int gru_nodes = 0;
  int rnn_nodes = 0;
  int nodes_added = 0;
  bool changed() const { return lstm_nodes + gru_nodes + rnn_nodes > 0; }
};

// Runs the pass directly (types must be inferred, as LoadAndCheckModel
// leaves them); infers the types of the new nodes.
absl::StatusOr<UnrollRecurrentReport> UnrollRecurrent(Model& model);

// True when the model's main graph has an LSTM, GRU or RNN node.
bool HasRecurrentNodes(const Model& model);

// The pass for a PassManager; fills `*report` when given, and adds a note
// to the context when it changed the graph.
std::unique_ptr<Pass> MakeUnrollRecurrentPass(UnrollRecurrentReport* report = nullptr);

// For the commands that run an imported model as it is (`castor run`,
// `castor conformance`): runs the pass through a PassManager (verified
// after) when the model has a recurrent node; otherwise leaves it alone.
absl::Status UnrollRecurrentIfAny(Model& model);

}  // namespace castor
