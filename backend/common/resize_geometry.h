// Resize's geometry, which the CPU and CUDA kernels of Resize and its
// gradient ResizeGrad (com.castor) share: the output dims from the scales
// or sizes input, and per axis and output index the one or two input
// indices it reads and their weights (nearest: one index, weight 1;
// linear: two neighbours), resolved on the host from the node's
// coordinate_transformation_mode and nearest_mode exactly as ONNX's
// reference (onnx/reference/ops/op_resize.py) defines them. Linear on
// several axes is the product of the per-axis weights (bilinear for NCHW
// with scales [1, 1, sh, sw]). Both backends walk the same taps, so they
// compute the same weights; ResizeGrad scatters dY with them (the
// adjoint).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/kernel.h"
#include "graph/half.h"  // CASTOR_HOST_DEVICE

namespace castor::common {

inline constexpr int kMaxResizeRank = 8;

// Output index o along an axis reads input `first` with weight 1 - frac and
// input `second` with weight frac (frac 0: only `first`).
struct ResizeTap {
  int64_t first = 0;
  int64_t second = 0;
  float frac = 0.0f;
};

// The taps of every axis and the strides to address the input: a plain
// struct CUDA kernels take by value (`taps` then points to device memory).
struct ResizeIndexer {
  int rank = 0;
  int64_t out_dims[kMaxResizeRank] = {};
  int64_t in_strides[kMaxResizeRank] = {};
  int64_t tap_offsets[kMaxResizeRank] = {};  // axis a's taps start here
  const ResizeTap* taps = nullptr;

  // Calls visit(input offset, weight) for each input element output
  // element `o` reads (at most 2^rank; weights sum to 1).
  template <typename Visit>
  CASTOR_HOST_DEVICE void ForEachSource(int64_t o, Visit&& visit) const {
    int64_t coords[kMaxResizeRank];
    for (int a = rank - 1; a >= 0; --a) {
      coords[a] = o % out_dims[a];
      o /= out_dims[a];
    }
    for (int corner = 0; corner < (1 << rank); ++corner) {
      float weight = 1.0f;
      int64_t offset = 0;
      bool used = true;
      for (int a = 0; a < rank && used; ++a) {
        const ResizeTap& tap = taps[tap_offsets[a] + coords[a]];
        if ((corner >> a) & 1) {
          used = tap.frac != 0.0f;
          weight *= tap.frac;
          offset += tap.second * in_strides[a];
        } else {
          weight *= 1.0f - tap.frac;
          offset += tap.first * in_strides[a];
        }
      }
      if (used) visit(offset, weight);
    }
  }
};

struct ResizeGeometry {
  std::vector<int64_t> out_dims;
  std::vector<ResizeTap> taps;  // every axis' taps, axis after axis
  ResizeIndexer indexer;        // taps pointer unset: the backend sets it
  // The leading axes that map each index to itself: output blocks of
  // `out_block` elements read only the matching input block of `in_block`
  // (ResizeGrad scatters blocks in parallel).
  int64_t blocks = 1, out_block = 1, in_block = 1;
};

// Resize of an input of `in_dims` by the node's attributes (mode nearest
// or linear; coordinate_transformation_mode half_pixel, pytorch_half_pixel,
// align_corners, asymmetric, tf_half_pixel_for_nn; nearest_mode
// round_prefer_floor, round_prefer_ceil, floor, ceil; opset 18's axes and
// keep_aspect_ratio_policy "stretch") and `scales` or `sizes` (as the
// backend read them, empty when absent; one per input axis or per `axes`
// entry). `opset10` selects Resize-10's rule (asymmetric; nearest rounds
// down when upsampling and up when downsampling, as ONNX Runtime does).
// Errors for cubic mode, tf_crop_and_resize, antialias, both or neither of
// scales and sizes, counts that differ from the axes, non-positive scales
// or negative sizes, and unknown attribute values.
absl::StatusOr<ResizeGeometry> PlanResize(const KernelContext& ctx,
                                          const std::vector<int64_t>& in_dims,
                                          const std::vector<float>& scales,
                                          const std::vector<int64_t>& sizes, bool opset10);

}  // namespace castor::common
