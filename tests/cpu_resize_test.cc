// CPU kernels of Resize and com.castor ResizeGrad (backend/cpu/resize.cc):
// forward values and the adjoint against PyTorch's F.interpolate forward
// and backward (tests/data/resize_torch_reference.txt, generated once by
// tests/data/make_resize_reference.py) for the forms torch.onnx.export
// writes (nearest: asymmetric + floor; bilinear: half_pixel or
// align_corners; scales or sizes); the nearest modes and coordinate modes
// against values worked out here from the ONNX definitions; 16-bit and
// integer dtypes; opset 10's form; and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "graph/gradient_builder.h"
#include "tests/kernel_test_util.h"

namespace castor {
namespace {

using testing::Cpu;
using testing::F32;
using testing::I64;
using testing::RunNodeOf;
using testing::RunOk;
using testing::SingleNode;

struct TorchCase {
  std::string name, mode, transform, nearest_mode, arg_kind;
  std::vector<int64_t> in_dims, out_dims;
  std::vector<float> x, y, r, dx;
  std::vector<double> arg;
};

std::vector<double> ReadNumbers(std::istream& in) {
  std::string line;
  std::getline(in, line);
  std::istringstream words(line);
  std::vector<double> values;
  double v;
  while (words >> v) values.push_back(v);
  return values;
}

std::vector<float> AsFloats(const std::vector<double>& values) {
  return std::vector<float>(values.begin(), values.end());
}

// Reads the "<word> v1 v2 ..." line as int64 dims.
std::vector<int64_t> ReadDims(std::istream& in, const std::string& word) {
  std::string line;
  std::getline(in, line);
  std::istringstream words(line);
  std::string head;
  words >> head;
  EXPECT_EQ(head, word);
  std::vector<int64_t> dims;
  int64_t d;
  while (words >> d) dims.push_back(d);
  return dims;
}

std::vector<TorchCase> LoadTorchCases() {
  std::ifstream in(std::string(CASTOR_SOURCE_DIR) + "/tests/data/resize_torch_reference.txt");
  std::vector<TorchCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("case ", 0) != 0) continue;
    TorchCase c;
    std::istringstream words(line.substr(5));
    words >> c.name >> c.mode >> c.transform >> c.nearest_mode >> c.arg_kind;
    c.in_dims = ReadDims(in, "in");
    c.x = AsFloats(ReadNumbers(in));
    c.out_dims = ReadDims(in, "out");
    c.y = AsFloats(ReadNumbers(in));
    c.r = AsFloats(ReadNumbers(in));
    c.dx = AsFloats(ReadNumbers(in));
    std::getline(in, line);
    std::istringstream arg(line.substr(4));
    double v;
    while (arg >> v) c.arg.push_back(v);
    cases.push_back(std::move(c));
  }
  return cases;
}

void ExpectNear(const Tensor& got, const std::vector<float>& expected, double tolerance,
                const std::string& what) {
  ASSERT_EQ(got.num_elements(), static_cast<int64_t>(expected.size())) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(got.GetDouble(static_cast<int64_t>(i)), expected[i], tolerance)
        << what << " element " << i;
  }
}

std::vector<Attribute> Attributes(const TorchCase& c) {
  return {Attribute::String("mode", c.mode),
          Attribute::String("coordinate_transformation_mode", c.transform),
          Attribute::String("nearest_mode", c.nearest_mode)};
}

TEST(CpuResize, MatchesPyTorchInterpolateForwardAndBackward) {
  const std::vector<TorchCase> cases = LoadTorchCases();
  ASSERT_EQ(cases.size(), 8u) << "tests/data/resize_torch_reference.txt";
  for (const TorchCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor x = F32(c.in_dims, c.x);
    Tensor scales, sizes;
    if (c.arg_kind == "scales") {
      scales = F32({static_cast<int64_t>(c.arg.size())}, AsFloats(c.arg));
    } else {
      sizes = I64({static_cast<int64_t>(c.arg.size())},
                  std::vector<int64_t>(c.arg.begin(), c.arg.end()));
    }
    const std::vector<Tensor> y = RunOk("Resize", {x, Tensor(), scales, sizes}, Attributes(c), 17);
    EXPECT_EQ(y[0].dims(), c.out_dims);
    ExpectNear(y[0], c.y, 1e-5, "Y");
    // The adjoint: d sum(Y * R) / dX = ResizeGrad(R, X, scales, sizes).
    SingleNode grad("ResizeGrad", {F32(c.out_dims, c.r), x, scales, sizes}, Attributes(c), 1, 1,
                    kCastorDomain);
    absl::StatusOr<std::vector<Tensor>> dx = grad.Run(Cpu());
    ASSERT_TRUE(dx.ok()) << dx.status();
    EXPECT_EQ((*dx)[0].dims(), c.in_dims);
    ExpectNear((*dx)[0], c.dx, 1e-5, "dX");
  }
}

// One axis [0, 1, 2, 3] resized to `out` elements (scales input).
std::vector<double> Resize1D(const std::vector<Attribute>& attributes, float scale,
                             int64_t opset = 17) {
  const Tensor x = F32({4}, {0, 1, 2, 3});
  const Tensor scales = F32({1}, {scale});
  std::vector<Tensor> inputs = opset < 11 ? std::vector<Tensor>{x, scales}
                                          : std::vector<Tensor>{x, Tensor(), scales};
  const Tensor y = RunOk("Resize", inputs, attributes, opset)[0];
  std::vector<double> values;
  for (int64_t i = 0; i < y.num_elements(); ++i) values.push_back(y.GetDouble(i));
  return values;
}

TEST(CpuResize, NearestModesAndCoordinateModesFollowTheOnnxDefinitions) {
  auto nearest = [](const std::string& transform, const std::string& rounding) {
    return std::vector<Attribute>{Attribute::String("coordinate_transformation_mode", transform),
                                  Attribute::String("nearest_mode", rounding)};
  };
  // x 4 -> 6 (scale 1.5), half_pixel: source (o + 0.5) / 1.5 - 0.5 =
  // -1/6, 0.5, 7/6, 11/6, 2.5, 19/6.
  EXPECT_EQ(Resize1D(nearest("half_pixel", "round_prefer_floor"), 1.5f),
            (std::vector<double>{0, 0, 1, 2, 2, 3}));
  EXPECT_EQ(Resize1D(nearest("half_pixel", "round_prefer_ceil"), 1.5f),
            (std::vector<double>{0, 1, 1, 2, 3, 3}));
  EXPECT_EQ(Resize1D(nearest("half_pixel", "floor"), 1.5f),
            (std::vector<double>{0, 0, 1, 1, 2, 3}));
  EXPECT_EQ(Resize1D(nearest("half_pixel", "ceil"), 1.5f),
            (std::vector<double>{0, 1, 2, 2, 3, 3}));
  // asymmetric: o / 1.5 = 0, 2/3, 4/3, 2, 8/3, 10/3 (clamped to 3).
  EXPECT_EQ(Resize1D(nearest("asymmetric", "ceil"), 1.5f), (std::vector<double>{0, 1, 2, 2, 3, 3}));
  // align_corners: o * 3 / 5 = 0, 0.6, 1.2, 1.8, 2.4, 3.
  EXPECT_EQ(Resize1D(nearest("align_corners", "round_prefer_floor"), 1.5f),
            (std::vector<double>{0, 1, 1, 2, 2, 3}));
  // tf_half_pixel_for_nn: (o + 0.5) / 1.5 = 1/3, 1, 5/3, 7/3, 3, 11/3.
  EXPECT_EQ(Resize1D(nearest("tf_half_pixel_for_nn", "floor"), 1.5f),
            (std::vector<double>{0, 1, 1, 2, 3, 3}));
  // Linear, 4 -> 6: half_pixel clamps below 0 and above 3; align_corners.
  const std::vector<double> half_pixel =
      Resize1D({Attribute::String("mode", "linear")}, 1.5f);
  const std::vector<double> expected_half = {0, 0.5, 7.0 / 6, 11.0 / 6, 2.5, 3};
  const std::vector<double> aligned =
      Resize1D({Attribute::String("mode", "linear"),
                Attribute::String("coordinate_transformation_mode", "align_corners")},
               1.5f);
  const std::vector<double> expected_aligned = {0, 0.6, 1.2, 1.8, 2.4, 3};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(half_pixel[i], expected_half[i], 1e-6) << i;
    EXPECT_NEAR(aligned[i], expected_aligned[i], 1e-6) << i;
  }
  // pytorch_half_pixel to one element reads index 0; half_pixel reads 1.5.
  EXPECT_NEAR(Resize1D({Attribute::String("mode", "linear"),
                        Attribute::String("coordinate_transformation_mode", "pytorch_half_pixel")},
                       0.25f)[0],
              0.0, 1e-6);
  EXPECT_NEAR(Resize1D({Attribute::String("mode", "linear")}, 0.25f)[0], 1.5, 1e-6);
  // Opset 10 (X, scales): asymmetric; nearest rounds down upsampling, up
  // downsampling (x 4 -> 2: sources 0, 2 -> ceil 0, 2).
  EXPECT_EQ(Resize1D({}, 1.5f, 10), (std::vector<double>{0, 0, 1, 2, 2, 3}));
  EXPECT_EQ(Resize1D({}, 0.5f, 10), (std::vector<double>{0, 2}));
}

TEST(CpuResize, SixteenBitLinearAndIntegerNearest) {
  const Tensor x = F32({1, 1, 2, 3}, {1, 2, 4, -8, 16, 0.5f});
  const Tensor scales = F32({4}, {1, 1, 2, 2});
  const std::vector<Attribute> linear = {Attribute::String("mode", "linear")};
  const Tensor reference = RunOk("Resize", {x, Tensor(), scales}, linear, 17)[0];
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<float> values = {1, 2, 4, -8, 16, 0.5f};  // exact in 16 bits
    const Tensor narrow = dtype == DType::kFloat16 ? testing::F16(x.dims(), values)
                                                   : testing::BF16(x.dims(), values);
    const Tensor y = RunOk("Resize", {narrow, Tensor(), scales}, linear, 17)[0];
    ASSERT_EQ(y.dtype(), dtype);
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      // One rounding of the float32 result.
      const double r = reference.GetDouble(i);
      EXPECT_NEAR(y.GetDouble(i), r, std::fabs(r) * (dtype == DType::kFloat16 ? 1e-3 : 8e-3))
          << i;
    }
  }
  // Nearest moves elements of any dtype: int64 and bool (sizes input).
  const Tensor sizes = I64({2}, {3, 4});
  const std::vector<Attribute> nearest = {
      Attribute::String("coordinate_transformation_mode", "asymmetric"),
      Attribute::String("nearest_mode", "floor")};
  EXPECT_EQ(RunOk("Resize", {I64({2, 2}, {7, -9, 5, 1}), Tensor(), Tensor(), sizes}, nearest,
                  13)[0],
            I64({3, 4}, {7, 7, -9, -9, 7, 7, -9, -9, 5, 5, 1, 1}));
}

TEST(CpuResize, ErrorsNameWhatIsWrong) {
  const Tensor x = F32({1, 1, 2, 2}, {1, 2, 3, 4});
  auto expect_error = [&](std::vector<Tensor> inputs, std::vector<Attribute> attributes,
                          int64_t opset, const std::string& needle) {
    absl::StatusOr<std::vector<Tensor>> result =
        RunNodeOf("Resize", std::move(inputs), std::move(attributes), opset);
    ASSERT_FALSE(result.ok()) << needle;
    EXPECT_NE(std::string(result.status().message()).find(needle), std::string::npos)
        << result.status();
  };
  expect_error({x, Tensor(), F32({4}, {1, 1, 2, 2})}, {Attribute::String("mode", "cubic")}, 13,
               "cubic");
  expect_error({x, Tensor(), F32({4}, {1, 1, 2, 2}), I64({4}, {1, 1, 4, 4})}, {}, 13,
               "not both");
  expect_error({x, Tensor(), F32({3}, {1, 2, 2})}, {}, 13, "scales has 3 values; expected 4");
  expect_error({x, Tensor(), F32({4}, {1, 1, 2, 2})},
               {Attribute::String("nearest_mode", "nearest")}, 13, "nearest_mode");
}

}  // namespace
}  // namespace castor
