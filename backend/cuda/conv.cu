// CUDA kernels: Conv and ConvTranspose (ops of graph/ops/conv.cc) and
// com.castor ConvGrad (graph/gradient_builder.h) through cuDNN 9's legacy
// convolution API (ConvTranspose as the backward data pass of the Conv it
// transposes), for float32, float16 and bfloat16 (bfloat16 on compute
// capability 8.0+). The CPU kernels (backend/cpu/conv.cc and conv_grad.cc)
// are the reference.
//
// NCHW tensors with 1 to 3 spatial axes (1-D runs as 2-D with H = 1);
// group, strides, dilations, pads and auto_pad resolve exactly as on the CPU
// (common::ForwardWindowGeometry). cuDNN pads each axis symmetrically, so an
// asymmetric axis (explicit pads or SAME_* with an odd total) pads by
// min(begin, end) in cuDNN and the rest explicitly: X is copied into a
// zero-padded scratch tensor, and ConvGrad's dX is computed for that padded
// tensor and cropped.
//
// Arithmetic: float32 accumulation (CUDNN_DATA_FLOAT compute) for every
// dtype; tensor-core math for 16-bit data, and for float32 only when the
// backend allows TF32 (else CUDNN_FMA_MATH, which rules TF32 out). The
// algorithm is the first of cuDNN's heuristics (cudnnGet*Algorithm_v7)
// whose workspace can be allocated and that runs, deterministic ones first
// and, for float32 without TF32, exact ones before FFT and Winograd; the
// backend remembers it per shape (see RunConvolution). The bias is
// broadcast into Y first and the convolution adds onto it (beta = 1), so a
// 16-bit Y is rounded once, from conv + bias in float32, as on the CPU.
// ConvGrad's dB is a per-channel float32 block reduction of dY. ConvGrad
// computes only the outputs its node has.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backend/common/op_geometry.h"
#include "backend/common/window_geometry.h"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "graph/gradient_builder.h"

namespace castor::cuda {
namespace {

int64_t Product(const std::vector<int64_t>& dims, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < dims.size(); ++i) p *= dims[i];
  return p;
}

// ---- device kernels ---------------------------------------------------------------

// y[n, c, ...] = bias[c] over y [batch, channels, spatial].
template <typename T>
__global__ void BroadcastChannelBias(const T* bias, int64_t channels, int64_t spatial, T* y,
                                     int64_t count) {
  CASTOR_GRID_STRIDE(i, count) { y[i] = bias[(i / spatial) % channels]; }
}

// db[c] = sum over n and the spatial positions of dy [batch, channels,
// spatial], in float32; one block per channel (grid-stride over channels).
template <typename T>
__global__ void SumPerChannel(const T* dy, int64_t batch, int64_t channels, int64_t spatial,
                              T* db) {
  const int64_t count = batch * spatial;
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t n = i / spatial, p = i - n * spatial;
      sum += ToFloat(dy[(n * channels + c) * spatial + p]);
    }
    sum = BlockSum(sum);
    if (threadIdx.x == 0) db[c] = FromFloat<T>(sum);
  }
}

// A tensor `inner` placed at offset `begin` inside a larger tensor `outer`
// of the same rank (N and C offsets 0).
constexpr int kMaxPadRank = 5;  // N, C and up to 3 spatial axes
struct PadLayout {
  int rank = 0;
  int64_t inner[kMaxPadRank] = {};
  int64_t outer[kMaxPadRank] = {};
  int64_t begin[kMaxPadRank] = {};
};

// pad: dst (outer, `count` elements) = src (inner) placed at `begin`, zeros
// around it. Otherwise crop: dst (inner, `count` elements) = the inner
// window of src (outer).
template <typename T>
__global__ void PadOrCrop(PadLayout layout, bool pad, const T* src, T* dst, int64_t count) {
  CASTOR_GRID_STRIDE(i, count) {
    int64_t rest = i, source = 0, source_stride = 1;
    bool inside = true;
    for (int r = layout.rank - 1; r >= 0; --r) {
      const int64_t dim = pad ? layout.outer[r] : layout.inner[r];
      const int64_t index = rest % dim;
      rest /= dim;
      const int64_t source_index = pad ? index - layout.begin[r] : index + layout.begin[r];
      const int64_t source_dim = pad ? layout.inner[r] : layout.outer[r];
      inside = inside && source_index >= 0 && source_index < source_dim;
      source += source_index * source_stride;
      source_stride *= source_dim;
    }
    dst[i] = inside ? src[source] : FromFloat<T>(0.0f);
  }
}

// ---- cuDNN descriptors ------------------------------------------------------------

// Owns one cuDNN descriptor; destroys it on every path.
template <typename Descriptor, cudnnStatus_t (*kCreate)(Descriptor*),
          cudnnStatus_t (*kDestroy)(Descriptor)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() = default;
  ~CudnnDescriptor() {
    if (descriptor_ != nullptr) kDestroy(descriptor_);
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  absl::Status Create() {
    CASTOR_CUDNN_CALL(kCreate(&descriptor_));
    return absl::OkStatus();
  }
  Descriptor get() const { return descriptor_; }

 private:
  Descriptor descriptor_ = nullptr;
};

using TensorDescriptor = CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                                         cudnnDestroyTensorDescriptor>;
using FilterDescriptor = CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                                         cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                    cudnnDestroyConvolutionDescriptor>;

// ---- the convolution, resolved ----------------------------------------------------

// One convolution of a node's X [N, C, D...] and W [M, C/group, k...], as
// the CPU resolves it, plus what cuDNN needs: X's dims after the explicit
// part of the padding and the symmetric pads cuDNN applies itself.
struct ConvPlan {
  DType dtype = DType::kUndefined;
  int64_t group = 1;
  common::WindowGeometry geometry;
  std::vector<int64_t> w_dims;
  std::vector<int64_t> y_dims;
  // X as cuDNN reads it (X itself unless explicit_padding): X placed at
  // padding.begin inside padded_x_dims.
  bool explicit_padding = false;
  std::vector<int64_t> padded_x_dims;
  PadLayout padding;
  std::vector<int64_t> cudnn_pads;  // per spatial axis
};

// The plan of the convolution of X (dims x_dims) with W (w_dims) over the
// resolved `geometry`.
ConvPlan PlanConvOver(DType dtype, int64_t group, common::WindowGeometry geometry,
                      const std::vector<int64_t>& x_dims, const std::vector<int64_t>& w_dims) {
  ConvPlan plan;
  plan.dtype = dtype;
  plan.group = group;
  plan.w_dims = w_dims;
  plan.geometry = std::move(geometry);
  const common::WindowGeometry& g = plan.geometry;
  plan.y_dims = {x_dims[0], w_dims[0]};
  plan.y_dims.insert(plan.y_dims.end(), g.output.begin(), g.output.end());
  plan.padded_x_dims = x_dims;
  plan.padding.rank = static_cast<int>(std::min<size_t>(x_dims.size(), kMaxPadRank));
  for (int r = 0; r < plan.padding.rank; ++r) plan.padding.inner[r] = x_dims[r];
  for (int d = 0; d < g.num_spatial; ++d) {
    const int64_t common = std::min(g.pad_begin[d], g.pad_end[d]);
    plan.cudnn_pads.push_back(common);
    if (g.pad_begin[d] != g.pad_end[d]) {
      plan.explicit_padding = true;
      plan.padded_x_dims[d + 2] += g.pad_begin[d] + g.pad_end[d] - 2 * common;
      if (d + 2 < kMaxPadRank) plan.padding.begin[d + 2] = g.pad_begin[d] - common;
    }
  }
  for (int r = 0; r < plan.padding.rank; ++r) plan.padding.outer[r] = plan.padded_x_dims[r];
  return plan;
}

// The plan of a Conv or ConvGrad node's convolution (its attributes read as
// the CPU reads them).
absl::StatusOr<ConvPlan> PlanConv(const KernelContext& ctx, const TensorView& x,
                                  const TensorView& w, int64_t group) {
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  CASTOR_ASSIGN_OR_RETURN(common::WindowGeometry geometry,
                          common::ForwardWindowGeometry(ctx, spatial, kernel, false));
  return PlanConvOver(x.dtype, group, std::move(geometry), x.dims, w.dims);
}

// `dims` ([N, C, D...] or [M, C/group, k...]) as cuDNN's int dims: 1-D gets
// H = 1 inserted before W. cuDNN's legacy API limits dims and element
// counts to int.
absl::StatusOr<std::vector<int>> CudnnDims(const KernelContext& ctx,
                                           const std::vector<int64_t>& dims, const char* what) {
  if (Product(dims) > INT_MAX) {
    return ctx.Unimplemented(absl::StrCat(what, " ", DimsToString(dims), " has more than ",
                                          INT_MAX, " elements, beyond cuDNN's legacy API"));
  }
  std::vector<int> result(dims.begin(), dims.end());
  if (dims.size() == 3) result.insert(result.begin() + 2, 1);
  return result;
}

// Per spatial axis `values` as ints, with `one_d_fill` prepended for 1-D.
absl::StatusOr<std::vector<int>> CudnnAxisInts(const KernelContext& ctx,
                                               const std::vector<int64_t>& values,
                                               int one_d_fill, const char* what) {
  std::vector<int> result;
  if (values.size() == 1) result.push_back(one_d_fill);
  for (int64_t v : values) {
    if (v < 0 || v > INT_MAX) {
      return ctx.Unimplemented(absl::StrCat(what, " ", DimsToString(values),
                                            " cannot be expressed for cuDNN (each must be in [0, ",
                                            INT_MAX, "])"));
    }
    result.push_back(static_cast<int>(v));
  }
  return result;
}

cudnnDataType_t CudnnDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

// The descriptors of one convolution: x (as cuDNN reads X, i.e. padded),
// w, y (the output, or dY), and the convolution with the math type its
// algorithms start from.
struct ConvDescriptors {
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  bool fma_only = false;  // float32 without TF32: every algorithm runs CUDNN_FMA_MATH
  // Everything the descriptors say, for CudaBackend::conv_algorithms.
  std::vector<int64_t> key;
};

absl::Status Describe(const KernelContext& ctx, const ConvPlan& plan, ConvDescriptors& d) {
  const common::WindowGeometry& g = plan.geometry;
  if (g.num_spatial < 1 || g.num_spatial > 3) {
    return ctx.Unimplemented(absl::StrCat(
        "cuDNN convolutions have 1 to 3 spatial axes; this one has ", g.num_spatial));
  }
  if (plan.dtype == DType::kBFloat16 && !Cuda(ctx).device().has_bf16_tensor_cores()) {
    const DeviceInfo& device = Cuda(ctx).device();
    return ctx.Unimplemented(absl::StrCat("bfloat16 convolutions need compute capability 8.0 or "
                                          "newer; ", device.name, " has ", device.major, ".",
                                          device.minor));
  }
  for (int i = 0; i < g.num_spatial; ++i) {
    if (g.pad_begin[i] < 0 || g.pad_end[i] < 0) {
      return ctx.Unimplemented(absl::StrCat("negative pads (axis ", i, ": ", g.pad_begin[i],
                                            ", ", g.pad_end[i], ") are not supported by cuDNN"));
    }
  }
  if (plan.group > INT_MAX) return ctx.Unimplemented("attribute 'group' is too large for cuDNN");
  const cudnnDataType_t type = CudnnDataType(plan.dtype);
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int> x_dims,
                          CudnnDims(ctx, plan.padded_x_dims, "X (padded)"));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int> w_dims, CudnnDims(ctx, plan.w_dims, "W"));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int> y_dims, CudnnDims(ctx, plan.y_dims, "Y"));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int> pads,
                          CudnnAxisInts(ctx, plan.cudnn_pads, 0, "pads"));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int> strides,
                          CudnnAxisInts(ctx, g.strides, 1, "strides"));
  CASTOR_ASSIGN_OR_RETURN(const std::vector<int> dilations,
                          CudnnAxisInts(ctx, g.dilations, 1, "dilations"));
  const int rank = static_cast<int>(x_dims.size());

  CASTOR_RETURN_IF_ERROR(d.x.Create());
  CASTOR_RETURN_IF_ERROR(d.y.Create());
  CASTOR_RETURN_IF_ERROR(d.w.Create());
  CASTOR_RETURN_IF_ERROR(d.conv.Create());
  CASTOR_CUDNN_CALL(
      cudnnSetTensorNdDescriptorEx(d.x.get(), CUDNN_TENSOR_NCHW, type, rank, x_dims.data()));
  CASTOR_CUDNN_CALL(
      cudnnSetTensorNdDescriptorEx(d.y.get(), CUDNN_TENSOR_NCHW, type, rank, y_dims.data()));
  CASTOR_CUDNN_CALL(
      cudnnSetFilterNdDescriptor(d.w.get(), type, CUDNN_TENSOR_NCHW, rank, w_dims.data()));
  CASTOR_CUDNN_CALL(cudnnSetConvolutionNdDescriptor(d.conv.get(), rank - 2, pads.data(),
                                                    strides.data(), dilations.data(),
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CASTOR_CUDNN_CALL(cudnnSetConvolutionGroupCount(d.conv.get(), static_cast<int>(plan.group)));
  d.fma_only = plan.dtype == DType::kFloat32 && !Cuda(ctx).allow_tf32();
  d.math = d.fma_only ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
  CASTOR_CUDNN_CALL(cudnnSetConvolutionMathType(d.conv.get(), d.math));
  d.key = {static_cast<int64_t>(plan.dtype), rank, plan.group, d.fma_only ? 1 : 0};
  for (const std::vector<int>* ints : {&x_dims, &w_dims, &y_dims, &pads, &strides, &dilations}) {
    d.key.insert(d.key.end(), ints->begin(), ints->end());
  }

  // cuDNN must agree with the CPU geometry on the output dims.
  std::vector<int> cudnn_y(rank);
  CASTOR_CUDNN_CALL(cudnnGetConvolutionNdForwardOutputDim(d.conv.get(), d.x.get(), d.w.get(),
                                                          rank, cudnn_y.data()));
  if (cudnn_y != y_dims) {
    return ctx.Error(absl::StrCat("cuDNN computes output dims [", absl::StrJoin(cudnn_y, ","),
                                  "] where the ONNX geometry gives ", DimsToString(plan.y_dims)));
  }
  return absl::OkStatus();
}

// Whether an algorithm computes a float32 convolution only approximately:
// the FFT and Winograd transforms round intermediate values. (On an H200,
// Winograd's weight gradient moved ResNet weights by 1.4e-3 relative
// against the CPU backend in five SGD steps; an implicit-GEMM one by
// rounding only.)
bool Approximate(cudnnConvolutionFwdAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
         algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool Approximate(cudnnConvolutionBwdDataAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool Approximate(cudnnConvolutionBwdFilterAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// The three cuDNN calls of a convolution, as RunConvolution drives them.
enum class ConvDirection : int64_t { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };

// Runs the convolution `direction` with cuDNN's algorithm for its shape.
// cuDNN's ranking comes from max_count(&n) (cudnnGet*AlgorithmMaxCount) and
// query(n, &count, perfs) (cudnnGet*Algorithm_v7 bound to the descriptors);
// all four callables return cuDNN statuses, workspace_size(algo, &bytes)
// and run(algo, workspace, bytes) the same.
//
// The first call for a shape tries the ranked candidates whose workspace
// can be allocated and that cuDNN accepts, each with its own math type
// (CUDNN_FMA_MATH when fma_only), skipping those that would down-convert
// data, in tiers, each in ranking order:
//   0. deterministic and, for float32 without TF32, exact;
//   1. the other exact ones (backward algorithms that add with atomics);
//   2. the rest (float32 FFT and Winograd), when nothing else runs.
// So a float32 step matches the CPU backend to rounding and, as long as
// tier 0 has an algorithm that runs (it had for every convolution of the
// sample models on an H200), a step gives the same bits every time: a
// replayed step equals its node-by-node run. With TF32 allowed the tiers
// go by determinism alone.
//
// The backend remembers the algorithm that ran (CudaBackend::
// conv_algorithms, keyed by the descriptors, the direction and `beta`);
// later calls for the shape run it directly, and search again only when it
// fails. A search remembers its choice only when no better-ranked
// candidate was passed over for want of workspace memory, so a moment of
// memory pressure does not pin a lesser algorithm for the rest of the run.
template <typename Perf, typename MaxCount, typename Query, typename WorkspaceSize,
          typename Run>
absl::Status RunConvolution(KernelContext& ctx, const ConvDescriptors& d, ConvDirection direction,
                            float beta, const char* what, MaxCount&& max_count, Query&& query,
                            WorkspaceSize&& workspace_size, Run&& run) {
  using Algo = decltype(Perf::algo);
  std::vector<int64_t> key = d.key;
  key.insert(key.begin(), {static_cast<int64_t>(direction), beta == 0.0f ? 0 : 1});
  auto& remembered = Cuda(ctx).conv_algorithms();

  // Runs `algo` with `math`; bytes < 0 asks cuDNN for the workspace size.
  std::string last_failure = "cuDNN's heuristics returned no usable algorithm";
  bool short_of_memory = false;  // a candidate's workspace could not be allocated
  auto attempt = [&](Algo algo, cudnnMathType_t math, int64_t bytes) -> absl::StatusOr<bool> {
    CASTOR_CUDNN_CALL(cudnnSetConvolutionMathType(d.conv.get(), math));
    size_t workspace_bytes = static_cast<size_t>(std::max<int64_t>(bytes, 0));
    if (bytes < 0) {
      if (const cudnnStatus_t code = workspace_size(algo, &workspace_bytes);
          code != CUDNN_STATUS_SUCCESS) {
        last_failure = std::string(CudnnStatus(code, "workspace size").message());
        return false;
      }
    }
    void* workspace = nullptr;
    if (workspace_bytes > 0) {
      absl::StatusOr<void*> scratch = ctx.Scratch(workspace_bytes);
      if (!scratch.ok()) {
        last_failure = std::string(scratch.status().message());
        short_of_memory = true;
        return false;
      }
      workspace = *scratch;
    }
    const cudnnStatus_t code = run(algo, workspace, workspace_bytes);
    if (code != CUDNN_STATUS_SUCCESS) {
      last_failure = std::string(CudnnStatus(code, what).message());
      return false;
    }
    if (!short_of_memory) remembered[key] = {static_cast<int>(algo), math, workspace_bytes};
    return true;
  };

  if (auto it = remembered.find(key); it != remembered.end()) {
    const CudaBackend::ConvAlgorithm known = it->second;
    CASTOR_ASSIGN_OR_RETURN(const bool ran,
                            attempt(static_cast<Algo>(known.algo), known.math,
                                    static_cast<int64_t>(known.workspace_bytes)));
    if (ran) return absl::OkStatus();
    remembered.erase(key);
    short_of_memory = false;  // the search below starts from cuDNN's ranking again
  }

  CASTOR_CUDNN_CALL(cudnnSetConvolutionMathType(d.conv.get(), d.math));
  int capacity = 0;
  CASTOR_CUDNN_CALL(max_count(&capacity));
  std::vector<Perf> perfs(std::max(capacity, 1));
  int count = 0;
  CASTOR_CUDNN_CALL(query(static_cast<int>(perfs.size()), &count, perfs.data()));
  auto tier = [&](const Perf& perf) {
    if (d.fma_only && Approximate(perf.algo)) return 2;
    return perf.determinism == CUDNN_DETERMINISTIC ? 0 : 1;
  };
  for (int wanted_tier = 0; wanted_tier <= 2; ++wanted_tier) {
    for (int i = 0; i < count; ++i) {
      const Perf& perf = perfs[i];
      if (perf.status != CUDNN_STATUS_SUCCESS ||
          perf.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION || tier(perf) != wanted_tier) {
        continue;
      }
      CASTOR_ASSIGN_OR_RETURN(
          const bool ran, attempt(perf.algo, d.fma_only ? CUDNN_FMA_MATH : perf.mathType, -1));
      if (ran) return absl::OkStatus();
    }
  }
  return ctx.Unimplemented(absl::StrCat("no cuDNN algorithm ran the ", what,
                                        " of this convolution; last failure: ", last_failure));
}

// y = conv(x, w) + beta * y, x as cuDNN reads it (padded); beta is 0 or 1.
absl::Status RunForward(KernelContext& ctx, const ConvDescriptors& d, const void* x,
                        const void* w, float beta, void* y) {
  const cudnnHandle_t handle = Cuda(ctx).cudnn();
  const float one = 1.0f;
  return RunConvolution<cudnnConvolutionFwdAlgoPerf_t>(
      ctx, d, ConvDirection::kForward, beta, "forward pass",
      [&](int* n) { return cudnnGetConvolutionForwardAlgorithmMaxCount(handle, n); },
      [&](int n, int* count, cudnnConvolutionFwdAlgoPerf_t* out) {
        return cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                      d.y.get(), n, count, out);
      },
      [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                       d.y.get(), algo, bytes);
      },
      [&](cudnnConvolutionFwdAlgo_t algo, void* workspace, size_t bytes) {
        return cudnnConvolutionForward(handle, &one, d.x.get(), x, d.w.get(), w, d.conv.get(),
                                       algo, workspace, bytes, &beta, d.y.get(), y);
      });
}

// dx = the gradient of conv(x, w) with respect to x (x's padded dims) +
// beta * dx; beta is 0 or 1.
absl::Status RunBackwardData(KernelContext& ctx, const ConvDescriptors& d, const void* w,
                             const void* dy, float beta, void* dx) {
  const cudnnHandle_t handle = Cuda(ctx).cudnn();
  const float one = 1.0f;
  return RunConvolution<cudnnConvolutionBwdDataAlgoPerf_t>(
      ctx, d, ConvDirection::kBackwardData, beta, "input gradient",
      [&](int* n) { return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, n); },
      [&](int n, int* count, cudnnConvolutionBwdDataAlgoPerf_t* out) {
        return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d.w.get(), d.y.get(),
                                                           d.conv.get(), d.x.get(), n, count, out);
      },
      [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w.get(), d.y.get(),
                                                            d.conv.get(), d.x.get(), algo, bytes);
      },
      [&](cudnnConvolutionBwdDataAlgo_t algo, void* workspace, size_t bytes) {
        return cudnnConvolutionBackwardData(handle, &one, d.w.get(), w, d.y.get(), dy,
                                            d.conv.get(), algo, workspace, bytes, &beta,
                                            d.x.get(), dx);
      });
}

// dw = the gradient of conv(x, w) with respect to w.
absl::Status RunBackwardFilter(KernelContext& ctx, const ConvDescriptors& d, const void* x,
                               const void* dy, void* dw) {
  const cudnnHandle_t handle = Cuda(ctx).cudnn();
  const float one = 1.0f, zero = 0.0f;
  return RunConvolution<cudnnConvolutionBwdFilterAlgoPerf_t>(
      ctx, d, ConvDirection::kBackwardFilter, zero, "weight gradient",
      [&](int* n) { return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, n); },
      [&](int n, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* out) {
        return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, d.x.get(), d.y.get(),
                                                             d.conv.get(), d.w.get(), n, count,
                                                             out);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), algo, bytes);
      },
      [&](cudnnConvolutionBwdFilterAlgo_t algo, void* workspace, size_t bytes) {
        return cudnnConvolutionBackwardFilter(handle, &one, d.x.get(), x, d.y.get(), dy,
                                              d.conv.get(), algo, workspace, bytes, &zero,
                                              d.w.get(), dw);
      });
}

// ---- launches ---------------------------------------------------------------------------

// Copies `src` (dims `layout.inner` when padding, `layout.outer` when
// cropping) into `dst` (the other), zero-filling the padding.
absl::Status LaunchPadOrCrop(const KernelContext& ctx, DType dtype, const PadLayout& layout,
                             bool pad, const void* src, void* dst) {
  int64_t count = 1;
  for (int r = 0; r < layout.rank; ++r) count *= pad ? layout.outer[r] : layout.inner[r];
  return DispatchFloat(ctx, dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    PadOrCrop<T><<<Blocks(count), kThreads, 0, Stream(ctx)>>>(
        layout, pad, static_cast<const T*>(src), static_cast<T*>(dst), count);
    return CheckLaunch(ctx);
  });
}

// X as cuDNN reads it: X itself, or a zero-padded copy in scratch memory.
absl::StatusOr<const void*> CudnnInput(KernelContext& ctx, const ConvPlan& plan,
                                       const TensorView& x) {
  if (!plan.explicit_padding) return x.data;
  const size_t bytes = static_cast<size_t>(Product(plan.padded_x_dims)) * DTypeSize(x.dtype);
  CASTOR_ASSIGN_OR_RETURN(void* padded, ctx.Scratch(bytes));
  CASTOR_RETURN_IF_ERROR(LaunchPadOrCrop(ctx, x.dtype, plan.padding, true, x.data, padded));
  return static_cast<const void*>(padded);
}

// Fills y [N, M, ...] with the bias [M] of each channel.
absl::Status FillWithBias(const KernelContext& ctx, const TensorView& bias, const TensorView& y) {
  const int64_t count = y.num_elements();
  const int64_t channels = y.dims[1];
  const int64_t spatial = Product(y.dims, 2);
  return DispatchFloat(ctx, y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    BroadcastChannelBias<T><<<Blocks(count), kThreads, 0, Stream(ctx)>>>(
        bias.as<T>(), channels, spatial, y.as<T>(), count);
    return CheckLaunch(ctx);
  });
}

absl::Status ZeroFill(const KernelContext& ctx, const TensorView& t) {
  if (t.byte_size() > 0) {
    CASTOR_CUDA_CALL(cudaMemsetAsync(t.data, 0, t.byte_size(), Stream(ctx)));
  }
  return absl::OkStatus();
}

// ---- Conv --------------------------------------------------------------------------

absl::Status ConvKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t group = ctx.GetInt("group", 1);
  CASTOR_RETURN_IF_ERROR(common::CheckConv(ctx, group));
  CASTOR_ASSIGN_OR_RETURN(const ConvPlan plan, PlanConv(ctx, x, w, group));
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, plan.y_dims));
  if (y->num_elements() == 0) return absl::OkStatus();
  const bool has_bias = ctx.has_input(2);
  if (has_bias) {
    CASTOR_RETURN_IF_ERROR(FillWithBias(ctx, ctx.input(2), *y));
  }
  if (x.num_elements() == 0 || w.num_elements() == 0) {
    // Empty sums (no input channels or positions): the bias alone.
    return has_bias ? absl::OkStatus() : ZeroFill(ctx, *y);
  }
  ConvDescriptors descriptors;
  CASTOR_RETURN_IF_ERROR(Describe(ctx, plan, descriptors));
  CASTOR_ASSIGN_OR_RETURN(const void* input, CudnnInput(ctx, plan, x));
  return RunForward(ctx, descriptors, input, w.data, has_bias ? 1.0f : 0.0f, y->data);
}

// ---- ConvGrad ----------------------------------------------------------------------

bool WantsOutput(const KernelContext& ctx, int i) {
  return i < ctx.num_outputs() && ctx.has_output(i);
}

absl::Status ConvGradKernel(KernelContext& ctx) {
  const TensorView& dy = ctx.input(0);
  const TensorView& x = ctx.input(1);
  const TensorView& w = ctx.input(2);
  CASTOR_ASSIGN_OR_RETURN(const int64_t group, common::CheckConvGrad(ctx));
  const int64_t out_channels = w.dims[0];
  CASTOR_ASSIGN_OR_RETURN(const ConvPlan plan, PlanConv(ctx, x, w, group));
  CASTOR_RETURN_IF_ERROR(
      common::RequireDims(ctx, 0, "dY", plan.y_dims, "Conv's output for X and W"));
  TensorView* dx = nullptr;
  TensorView* dw = nullptr;
  TensorView* db = nullptr;
  if (WantsOutput(ctx, 0)) {
    CASTOR_ASSIGN_OR_RETURN(dx, ctx.Output(0, x.dtype, x.dims));
  }
  if (WantsOutput(ctx, 1)) {
    CASTOR_ASSIGN_OR_RETURN(dw, ctx.Output(1, x.dtype, w.dims));
  }
  if (WantsOutput(ctx, 2)) {
    CASTOR_ASSIGN_OR_RETURN(db, ctx.Output(2, x.dtype, {out_channels}));
  }

  if (db != nullptr && db->num_elements() > 0) {
    const int64_t batch = dy.dims[0], spatial = Product(dy.dims, 2);
    if (batch * spatial == 0) {
      CASTOR_RETURN_IF_ERROR(ZeroFill(ctx, *db));
    } else {
      CASTOR_RETURN_IF_ERROR(DispatchFloat(ctx, x.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(out_channels, 65535));
        SumPerChannel<T><<<blocks, kThreads, 0, Stream(ctx)>>>(dy.as<T>(), batch, out_channels,
                                                                spatial, db->as<T>());
        return CheckLaunch(ctx);
      }));
    }
  }
  if (dx == nullptr && dw == nullptr) return absl::OkStatus();
  if (dy.num_elements() == 0 || x.num_elements() == 0) {
    // No products: dX and dW are empty sums.
    if (dx != nullptr) CASTOR_RETURN_IF_ERROR(ZeroFill(ctx, *dx));
    if (dw != nullptr) CASTOR_RETURN_IF_ERROR(ZeroFill(ctx, *dw));
    return absl::OkStatus();
  }
  ConvDescriptors descriptors;
  CASTOR_RETURN_IF_ERROR(Describe(ctx, plan, descriptors));
  if (dw != nullptr) {
    CASTOR_ASSIGN_OR_RETURN(const void* input, CudnnInput(ctx, plan, x));
    CASTOR_RETURN_IF_ERROR(RunBackwardFilter(ctx, descriptors, input, dy.data, dw->data));
  }
  if (dx != nullptr) {
    if (!plan.explicit_padding) {
      return RunBackwardData(ctx, descriptors, w.data, dy.data, 0.0f, dx->data);
    }
    // The gradient of the padded copy of X, cropped to X.
    const size_t bytes = static_cast<size_t>(Product(plan.padded_x_dims)) * DTypeSize(x.dtype);
    CASTOR_ASSIGN_OR_RETURN(void* padded_dx, ctx.Scratch(bytes));
    CASTOR_RETURN_IF_ERROR(RunBackwardData(ctx, descriptors, w.data, dy.data, 0.0f, padded_dx));
    CASTOR_RETURN_IF_ERROR(
        LaunchPadOrCrop(ctx, x.dtype, plan.padding, false, padded_dx, dx->data));
  }
  return absl::OkStatus();
}

// ---- ConvTranspose --------------------------------------------------------------

// Y = ConvTranspose(X, W) + B is the input gradient (cuDNN's backward data)
// of the Conv from Y's space to X's that it is the adjoint of: that Conv's
// input is Y (padded where its pads are asymmetric), its output X, its
// filter W as stored ([C, M/group, k...]: C output channels), with the
// geometry common::TransposeWindowGeometry resolves (input and output
// swapped). The bias is broadcast into Y first and the products added onto
// it (beta = 1), so a 16-bit Y rounds once, as Conv's.
absl::Status ConvTransposeKernel(KernelContext& ctx) {
  const TensorView& x = ctx.input(0);
  const TensorView& w = ctx.input(1);
  const int64_t group = ctx.GetInt("group", 1);
  CASTOR_RETURN_IF_ERROR(common::CheckConvTranspose(ctx, group));
  const std::vector<int64_t> spatial(x.dims.begin() + 2, x.dims.end());
  const std::vector<int64_t> kernel(w.dims.begin() + 2, w.dims.end());
  CASTOR_ASSIGN_OR_RETURN(common::WindowGeometry transpose,
                          common::TransposeWindowGeometry(ctx, spatial, kernel));
  std::vector<int64_t> y_dims = {x.dims[0], w.dims[1] * group};
  y_dims.insert(y_dims.end(), transpose.output.begin(), transpose.output.end());
  CASTOR_ASSIGN_OR_RETURN(TensorView * y, ctx.Output(0, x.dtype, y_dims));
  if (y->num_elements() == 0) return absl::OkStatus();
  const bool has_bias = ctx.has_input(2);
  if (x.num_elements() == 0 || w.num_elements() == 0) {
    return has_bias ? FillWithBias(ctx, ctx.input(2), *y) : ZeroFill(ctx, *y);
  }
  common::WindowGeometry conv = transpose;
  std::swap(conv.input, conv.output);
  const ConvPlan plan = PlanConvOver(x.dtype, group, std::move(conv), y_dims, w.dims);
  if (plan.y_dims != x.dims) {
    return ctx.Error(absl::StrCat("X ", DimsToString(x.dims), " is not the output ",
                                  DimsToString(plan.y_dims), " of the Conv it transposes"));
  }
  ConvDescriptors descriptors;
  CASTOR_RETURN_IF_ERROR(Describe(ctx, plan, descriptors));
  // Y as cuDNN writes it: Y itself, or a padded scratch cropped to Y.
  TensorView target = *y;
  if (plan.explicit_padding) {
    target.dims = plan.padded_x_dims;
    CASTOR_ASSIGN_OR_RETURN(target.data, ctx.Scratch(target.byte_size()));
  }
  if (has_bias) CASTOR_RETURN_IF_ERROR(FillWithBias(ctx, ctx.input(2), target));
  CASTOR_RETURN_IF_ERROR(
      RunBackwardData(ctx, descriptors, w.data, x.data, has_bias ? 1.0f : 0.0f, target.data));
  if (!plan.explicit_padding) return absl::OkStatus();
  return LaunchPadOrCrop(ctx, x.dtype, plan.padding, false, target.data, y->data);
}

}  // namespace

void RegisterConvKernels(KernelTable& table) {
  table.Register({"", "Conv", InputDTypeIn(0, CudaFloatDTypes()), ConvKernel});
  // castor's form (com.castor Conv: the training graph's bfloat16 Conv below
  // opset 22) runs the same kernel.
  table.Register({kCastorDomain, "Conv", InputDTypeIn(0, CudaFloatDTypes()), ConvKernel});
  table.Register({kCastorDomain, "ConvGrad", FloatDTypesIn(CudaFloatDTypes()), ConvGradKernel});
  for (const char* domain : {"", kCastorDomain}) {
    table.Register({domain, "ConvTranspose", InputDTypeIn(0, CudaFloatDTypes()),
                    ConvTransposeKernel});
  }
}

}  // namespace castor::cuda
