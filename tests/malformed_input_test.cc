// The malformed-input suite (issue #30): one case per class of hostile
// input, each through the built `castor` binary as a user would run it.
// Every case asserts the exit code (2: the input is bad; 1: a check ran and
// failed), one error line on stderr naming the file, tensor or flag, and
// that nothing partial was written (no output file, no metrics file, no
// new checkpoint). The inputs are crafted here: .npy headers declaring
// 2^62 rows, zip64 .npz members declaring 2^40 and 2^63 bytes (stored and
// deflated), gzip IDX label files claiming 2^32-1 labels, ONNX models with
// oversized dims, escaping or FIFO external data, unknown attributes, bad
// IR versions and negative dims, FIFOs as model, data and policy file,
// checkpoints with edited tensors, state numbers and data-file entries.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "graph/graph.h"
#include "graph/json.h"
#include "graph/onnx_io.h"
#include "graph/shape_inference.h"
#include "tests/cli_test_util.h"
#include "training/checkpoint.h"
#include "training/npy.h"

namespace castor::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Absolute: the commands run in each test's directory (Bazel's source
// dir is relative).
const std::string kMlp =
    std::filesystem::absolute(std::string(CASTOR_SOURCE_DIR) + "/models/mlp_opset17.onnx").string();

void WriteBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Little(uint64_t value, int bytes) {
  std::string out;
  for (int k = 0; k < bytes; ++k) out.push_back(static_cast<char>((value >> (8 * k)) & 0xff));
  return out;
}
std::string Big32(uint32_t value) {
  return {static_cast<char>(value >> 24), static_cast<char>(value >> 16),
          static_cast<char>(value >> 8), static_cast<char>(value)};
}

// A one-member zip (.npz) holding `payload` stored (method 0) or raw-deflated
// (method 8), its uncompressed size declared as `declared_size` in zip64
// extra fields (the 32-bit fields saturated), as a crafted archive would.
std::string Zip64Npz(const std::string& member, const std::string& payload, int method,
                     uint64_t declared_size) {
  std::string data = payload;
  if (method == 8) {
    z_stream stream{};
    EXPECT_EQ(deflateInit2(&stream, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string out(deflateBound(&stream, payload.size()), '\0');
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(payload.data()));
    stream.avail_in = static_cast<uInt>(payload.size());
    stream.next_out = reinterpret_cast<Bytef*>(out.data());
    stream.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
    out.resize(stream.total_out);
    deflateEnd(&stream);
    data = out;
  }
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(payload.data()), static_cast<uInt>(payload.size())));
  const std::string local_extra = Little(1, 2) + Little(16, 2) + Little(declared_size, 8) +
                                  Little(data.size(), 8);
  const std::string local = Little(0x04034b50, 4) + Little(45, 2) + Little(0, 2) +
                            Little(method, 2) + Little(0, 4) + Little(crc, 4) +
                            Little(0xffffffff, 4) + Little(0xffffffff, 4) +
                            Little(member.size(), 2) + Little(local_extra.size(), 2) + member +
                            local_extra;
  const std::string central_extra = Little(1, 2) + Little(24, 2) + Little(declared_size, 8) +
                                    Little(data.size(), 8) + Little(0, 8);
  const std::string central =
      Little(0x02014b50, 4) + Little(45, 2) + Little(45, 2) + Little(0, 2) + Little(method, 2) +
      Little(0, 4) + Little(crc, 4) + Little(0xffffffff, 4) + Little(0xffffffff, 4) +
      Little(member.size(), 2) + Little(central_extra.size(), 2) + Little(0, 2) + Little(0, 2) +
      Little(0, 2) + Little(0, 4) + Little(0xffffffff, 4) + member + central_extra;
  const std::string end = Little(0x06054b50, 4) + Little(0, 2) + Little(0, 2) + Little(1, 2) +
                          Little(1, 2) + Little(central.size(), 4) +
                          Little(local.size() + data.size(), 4) + Little(0, 2);
  return local + data + central + end;
}

void WriteGzip(const fs::path& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(file);
}

onnx::ModelProto ReadProto(const std::string& path) {
  onnx::ModelProto proto;
  absl::StatusOr<std::string> bytes = ReadWholeFile(path, uint64_t{1} << 31, "2 GB");
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(proto.ParseFromString(*bytes));
  return proto;
}
void WriteProto(const fs::path& path, const onnx::ModelProto& proto) {
  WriteBytes(path, proto.SerializeAsString());
}

// The lines of `text` (without the final newline).
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

class MalformedInputTest : public CliTempDirTest {
 protected:
  MalformedInputTest() : CliTempDirTest("malformed") {}

  // 48 images [48, 28, 28] uint8 and labels 0..9, and a run of three steps
  // that saved ckpt-00000002.onnx and ckpt-00000003.onnx, made once.
  static void SetUpTestSuite() {
    shared_ = fs::temp_directory_path() / ("castor_malformed_shared_" + std::to_string(getpid()));
    fs::remove_all(shared_);
    fs::create_directories(shared_);
    Tensor images(DType::kUInt8, {48, 28, 28});
    for (int64_t i = 0; i < images.num_elements(); ++i) {
      images.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
    }
    Tensor labels(DType::kInt64, {48});
    for (int64_t i = 0; i < 48; ++i) labels.data<int64_t>()[i] = i % 10;
    ASSERT_TRUE(training::WriteNpy((shared_ / "x.npy").string(), images).ok());
    ASSERT_TRUE(training::WriteNpy((shared_ / "y.npy").string(), labels).ok());
    const Program trained = RunCastor(
        shared_, absl::StrCat("train ", kMlp, " --data ", Data(), " --batch 16 --save-every 2 ",
                              "--backend cpu --checkpoint-dir ", (shared_ / "ckpt").string()));
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
    ASSERT_TRUE(fs::exists(shared_ / "ckpt" / "ckpt-00000003.onnx"));
  }
  static void TearDownTestSuite() { fs::remove_all(shared_); }

  static std::string Data() {
    return absl::StrCat((shared_ / "x.npy").string(), ",", (shared_ / "y.npy").string());
  }
  // A copy of the shared checkpoint directory in this test's dir_.
  fs::path CopyCheckpoints() {
    const fs::path copy = dir_ / "ckpt";
    fs::copy(shared_ / "ckpt", copy);
    return copy;
  }

  // Runs castor in dir_ (relative paths name its files), with
  // `environment` ("NAME=VALUE") set.
  Program Castor(const std::string& arguments, const std::string& environment = "") {
    return RunCastor(dir_, arguments,
                     absl::StrCat("cd ", dir_.string(), " && ", environment, " ",
                                  fs::absolute(CASTOR_BINARY).string()));
  }

  // The refusal every case expects: `code`, stderr one line ("castor X:
  // error: ...") holding each of `needles`.
  static void ExpectRefused(const Program& p, int code, const std::vector<std::string>& needles) {
    EXPECT_EQ(p.exit_code, code) << p.err;
    const std::vector<std::string> lines = Lines(p.err);
    ASSERT_EQ(lines.size(), 1u) << "expected one error line, got:\n" << p.err;
    EXPECT_THAT(lines[0], HasSubstr(": error: "));
    for (const std::string& needle : needles) EXPECT_THAT(lines[0], HasSubstr(needle));
  }
  // Nothing in `dir` (absent or empty): no partial output.
  static void ExpectNothingWritten(const fs::path& path) {
    EXPECT_TRUE(!fs::exists(path) || (fs::is_directory(path) && fs::is_empty(path)))
        << path << " was written";
  }

  // A .npy header declaring `shape` of float32 with no data.
  std::string HeaderOnlyNpy(const std::string& shape) {
    std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ",
                                       shape, ", }");
    while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
    header.push_back('\n');
    return std::string("\x93NUMPY\x01\x00", 8) + Little(header.size(), 2) + header;
  }

  static fs::path shared_;
};

fs::path MalformedInputTest::shared_;

// ----------------------------------------------------------------- .npy

TEST_F(MalformedInputTest, NpyShapeOverflowIsRefusedBeforeAllocating) {
  WriteBytes(dir_ / "x.npy", HeaderOnlyNpy("(4611686018427387904, 1, 28, 28)"));
  const Program run =
      Castor(absl::StrCat("run ", kMlp, " --input input=x.npy --output-dir ", (dir_ / "out").string()));
  ExpectRefused(run, 2, {"x.npy", "needs more than 2^64 data bytes, the file has 0"});
  ExpectNothingWritten(dir_ / "out");
  const Program train = Castor(absl::StrCat("train ", kMlp, " --data x.npy,", (shared_ / "y.npy").string(),
                                            " --backend cpu --metrics m.jsonl"));
  ExpectRefused(train, 2, {"x.npy", "needs more than 2^64"});
  ExpectNothingWritten(dir_ / "m.jsonl");
  WriteBytes(dir_ / "x.npy", HeaderOnlyNpy("(99999999999999999999,)"));
  ExpectRefused(Castor(absl::StrCat("run ", kMlp, " --input input=x.npy")), 2,
                {"x.npy", "dimension 99999999999999999999 in shape is too large"});
}

// ------------------------------------------------------------- FIFOs

TEST_F(MalformedInputTest, FifosAreRefusedNotWaitedOn) {
  ASSERT_EQ(mkfifo((dir_ / "fifo.npy").c_str(), 0600), 0);
  ExpectRefused(Castor("inspect fifo.npy"), 2, {"fifo.npy: not a regular file"});
  ExpectRefused(Castor(absl::StrCat("run ", kMlp, " --input input=fifo.npy")), 2,
                {"fifo.npy: not a regular file"});
  ExpectRefused(Castor(absl::StrCat("train ", kMlp, " --data fifo.npy,",
                                    (shared_ / "y.npy").string(), " --backend cpu")),
                2, {"fifo.npy: not a regular file"});
  ExpectRefused(Castor(absl::StrCat("convert ", kMlp, " -o out.onnx --policy-file fifo.npy")), 2,
                {"fifo.npy: not a regular file"});
  ExpectNothingWritten(dir_ / "out.onnx");
  // External data that is a FIFO.
  onnx::ModelProto proto = ReadProto(kMlp);
  onnx::TensorProto* weight = proto.mutable_graph()->mutable_initializer(0);
  weight->clear_raw_data();
  weight->set_data_location(onnx::TensorProto::EXTERNAL);
  onnx::StringStringEntryProto* location = weight->add_external_data();
  location->set_key("location");
  location->set_value("fifo.npy");
  WriteProto(dir_ / "external.onnx", proto);
  ExpectRefused(Castor("inspect external.onnx"), 2,
                {weight->name(), "external data file", "fifo.npy is not a regular file"});
}

// ------------------------------------------------------------- .npz

TEST_F(MalformedInputTest, Zip64NpzMembersDeclaringHugeSizesAreRefused) {
  const std::string labels = *training::SerializeNpy(Tensor(DType::kInt64, {48}));
  for (const uint64_t declared : {uint64_t{1} << 40, uint64_t{1} << 63}) {
    for (const int method : {0, 8}) {
      SCOPED_TRACE(absl::StrCat("declared ", declared, ", method ", method));
      WriteBytes(dir_ / "data.npz", Zip64Npz("y.npy", labels, method, declared));
      const Program p = Castor(absl::StrCat("train ", kMlp,
                                            " --data data.npz --backend cpu --metrics m.jsonl"));
      ExpectRefused(p, 2,
                    {"data.npz:y.npy", absl::StrCat(declared),
                     method == 0 ? "stored member sizes differ" : "deflated bytes can hold"});
      ExpectNothingWritten(dir_ / "m.jsonl");
    }
  }
  // Sizes that agree with the bytes but not with the memory budget.
  WriteBytes(dir_ / "data.npz", Zip64Npz("y.npy", labels, 0, labels.size()));
  ExpectRefused(Castor(absl::StrCat("train ", kMlp, " --data data.npz --backend cpu"),
                       "CASTOR_MEMORY_LIMIT=100"),
                2, {"data.npz:y.npy needs 512 bytes, more than the memory budget of 100 bytes"});
}

// ------------------------------------------------------------- IDX

TEST_F(MalformedInputTest, IdxLabelFilesClaimingFourBillionLabelsAreRefused) {
  std::string images = Big32(0x803) + Big32(48) + Big32(28) + Big32(28);
  images += std::string(48 * 28 * 28, '\x10');
  WriteBytes(dir_ / "images-idx3-ubyte", images);
  const std::string labels = Big32(0x801) + Big32(0xffffffffu) + std::string(100, '\0');
  WriteGzip(dir_ / "labels-idx1-ubyte.gz", labels);
  WriteBytes(dir_ / "labels-idx1-ubyte", labels);
  const Program gz = Castor(absl::StrCat(
      "train ", kMlp, " --data images-idx3-ubyte,labels-idx1-ubyte.gz --backend cpu"));
  ExpectRefused(gz, 2, {"labels-idx1-ubyte.gz", "dims [4294967295]",
                        "more than its", "gzip-compressed bytes can hold"});
  const Program plain = Castor(
      absl::StrCat("train ", kMlp, " --data images-idx3-ubyte,labels-idx1-ubyte --backend cpu"));
  ExpectRefused(plain, 2, {"labels-idx1-ubyte", "truncated IDX file: dims [4294967295]"});
  // Plausible sizes past the memory budget.
  ExpectRefused(Castor(absl::StrCat("train ", kMlp,
                                    " --data images-idx3-ubyte,labels-idx1-ubyte.gz --backend cpu"),
                       "CASTOR_MEMORY_LIMIT=30000"),
                2, {"images-idx3-ubyte: IDX dims [48, 28, 28] needs 37632 bytes, more than the "
                    "memory budget of 30000 bytes"});
}

// ------------------------------------------------------------- ONNX

TEST_F(MalformedInputTest, OnnxDeclaredSizesPathsAndVersionsAreChecked) {
  onnx::ModelProto original = ReadProto(kMlp);
  {  // A tensor declaring [2^40] over its few bytes.
    onnx::ModelProto proto = original;
    onnx::TensorProto* bias = proto.mutable_graph()->mutable_initializer(1);
    bias->clear_dims();
    bias->add_dims(int64_t{1} << 40);
    WriteProto(dir_ / "big.onnx", proto);
    ExpectRefused(Castor(absl::StrCat("run big.onnx --output-dir ", (dir_ / "out").string())), 2,
                  {"big.onnx", bias->name(), "1099511627776 elements"});
    ExpectNothingWritten(dir_ / "out");
  }
  {  // External data escaping through a symlink: etc -> /etc, etc/passwd.
    fs::create_directory_symlink("/etc", dir_ / "etc");
    onnx::ModelProto proto = original;
    onnx::TensorProto* weight = proto.mutable_graph()->mutable_initializer(0);
    weight->clear_dims();
    weight->add_dims(4);
    weight->clear_raw_data();
    weight->set_data_location(onnx::TensorProto::EXTERNAL);
    onnx::StringStringEntryProto* location = weight->add_external_data();
    location->set_key("location");
    location->set_value("etc/passwd");
    WriteProto(dir_ / "escape.onnx", proto);
    ExpectRefused(Castor("convert escape.onnx -o converted.onnx"), 2,
                  {"escape.onnx", "etc/passwd", "outside the model's directory"});
    ExpectNothingWritten(dir_ / "converted.onnx");
    location->set_value("../../etc/passwd");
    WriteProto(dir_ / "escape.onnx", proto);
    ExpectRefused(Castor("inspect escape.onnx"), 2, {"must be a relative path"});
  }
  {  // IR version 99; a negative input dim; Gemm 'transb' for 'transB'.
    onnx::ModelProto proto = original;
    proto.set_ir_version(99);
    WriteProto(dir_ / "ir99.onnx", proto);
    ExpectRefused(Castor("inspect ir99.onnx"), 2, {"ir99.onnx", "99"});
    proto = original;
    proto.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()
        ->mutable_shape()->mutable_dim(1)->set_dim_value(-3);
    WriteProto(dir_ / "negative.onnx", proto);
    ExpectRefused(Castor("inspect negative.onnx"), 2, {"negative dimension -3"});
    proto = original;
    bool renamed = false;
    for (onnx::NodeProto& node : *proto.mutable_graph()->mutable_node()) {
      for (onnx::AttributeProto& attribute : *node.mutable_attribute()) {
        if (node.op_type() == "Gemm" && attribute.name() == "transB" && !renamed) {
          attribute.set_name("transb");
          renamed = true;
        }
      }
    }
    ASSERT_TRUE(renamed);
    WriteProto(dir_ / "transb.onnx", proto);
    ExpectRefused(Castor("run transb.onnx --output-dir out"), 2, {"transb"});
    ExpectNothingWritten(dir_ / "out");
  }
}

// An output past the memory budget: exit 1 (the plan ran and the check
// failed), naming the node, the output and its shape.
TEST_F(MalformedInputTest, AnOutputPastTheMemoryBudgetNamesTheNode) {
  Model model;
  model.opset_imports = {{"", 17}};
  Graph& g = *model.graph;
  Value* x = *g.AddInput("x", DType::kFloat32, Shape{1});
  Value* shape = *g.AddInput("shape", DType::kInt64, Shape{2});
  Node* expand = *g.AddNode("Expand", {x, shape}, {"wide"}, "expand");
  g.AddOutput(expand->output(0));
  ASSERT_TRUE(InferTypes(model).ok());
  ASSERT_TRUE(SaveModel(model, (dir_ / "expand.onnx").string()).ok());
  ASSERT_TRUE(training::WriteNpy((dir_ / "x.npy").string(), Tensor(DType::kFloat32, {1})).ok());
  Tensor dims(DType::kInt64, {2});
  dims.data<int64_t>()[0] = 1 << 20;
  dims.data<int64_t>()[1] = 4096;
  ASSERT_TRUE(training::WriteNpy((dir_ / "shape.npy").string(), dims).ok());
  const Program p = Castor("run expand.onnx --input x=x.npy --input shape=shape.npy --output-dir out",
                           "CASTOR_MEMORY_LIMIT=1M");
  ExpectRefused(p, 1, {"Expand node 'expand': output 'wide' float32 [1048576,4096]"});
  ExpectNothingWritten(dir_ / "out");
}

// ------------------------------------------------------------- flags

TEST_F(MalformedInputTest, FlagValuesAreCheckedBeforeAnyWork) {
  const std::string train = absl::StrCat("train ", kMlp, " --data ", Data(),
                                         " --backend cpu --metrics m.jsonl ");
  for (const std::string flag : {"--lr nan", "--lr -1", "--momentum nan", "--gamma nan",
                                  "--weight-decay inf", "--clip-norm -2", "--threads 100000"}) {
    SCOPED_TRACE(flag);
    ExpectRefused(Castor(train + flag), 2, {flag.substr(0, flag.find(' '))});
    ExpectNothingWritten(dir_ / "m.jsonl");
  }
  ExpectRefused(Castor(absl::StrCat("run ", kMlp, " --threads 100000")), 2, {"--threads 100000"});
  ExpectRefused(Castor(train, "CASTOR_MEMORY_LIMIT=lots"), 2, {"CASTOR_MEMORY_LIMIT"});
}

// ------------------------------------------------------------- checkpoints

// One tensor's dims edited to [2^40]: verify and export exit 2 naming the
// tensor and write nothing; --resume DIR falls back to the older intact
// checkpoint.
TEST_F(MalformedInputTest, ACheckpointTensorWithEditedDimsIsCorrupt) {
  const fs::path ckpt = CopyCheckpoints();
  const std::string newest = (ckpt / "ckpt-00000003.onnx").string();
  onnx::ModelProto proto = ReadProto(newest);
  proto.mutable_graph()->mutable_initializer(0)->set_dims(0, int64_t{1} << 40);
  WriteProto(newest, proto);
  ExpectRefused(Castor("verify " + newest), 2, {newest, "fc1.weight", "elements"});
  ExpectRefused(Castor(absl::StrCat("export ", newest, " -o exported.onnx")), 2,
                {newest, "fc1.weight"});
  ExpectNothingWritten(dir_ / "exported.onnx");
  // Moments too.
  proto = ReadProto((shared_ / "ckpt" / "ckpt-00000003.onnx").string());
  ASSERT_GT(proto.training_info_size(), 0);
  proto.mutable_training_info(0)->mutable_algorithm()->mutable_initializer(0)->set_dims(
      0, int64_t{1} << 40);
  WriteProto(dir_ / "moment.onnx", proto);
  ExpectRefused(Castor("verify moment.onnx"), 2, {"moment.onnx", "castor.moment/"});

  const Program resumed = Castor(absl::StrCat("train --resume ", ckpt.string(), " --data ", Data(),
                                              " --backend cpu --max-steps 4"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("resuming from " + (ckpt / "ckpt-00000002.onnx").string()));
}

// Every number of the state range-checked: a state edited and re-sealed
// (digests recomputed) is refused by verify (exit 2) as by --resume.
// (Negative counters and a position past the data are refused by
// WriteCheckpoint itself, so they cannot be sealed this way.)
TEST_F(MalformedInputTest, CheckpointStateNumbersAreRangeChecked) {
  const std::vector<std::pair<std::string, std::function<void(training::TrainingState&)>>> edits = {
      {"batch_size", [](training::TrainingState& s) { s.batch_size = 0; }},
      {"momentum", [](training::TrainingState& s) { s.optimizer.momentum = -1; }},
      {"beta1", [](training::TrainingState& s) { s.optimizer.beta1 = 1; }},
      {"weight_decay", [](training::TrainingState& s) { s.optimizer.weight_decay = -0.5; }},
      {"warmup_steps", [](training::TrainingState& s) { s.lr_schedule.warmup_steps = -5; }},
      {"min_lr", [](training::TrainingState& s) { s.lr_schedule.min_lr = -1; }},
      {"beta2", [](training::TrainingState& s) { s.optimizer.beta2 = 1.5; }},
      {"eps", [](training::TrainingState& s) { s.optimizer.eps = 0; }},
      {"base_lr", [](training::TrainingState& s) { s.lr_schedule.base_lr = -1; }},
      {"step_size", [](training::TrainingState& s) { s.lr_schedule.step_size = 0; }},
  };
  for (const auto& [field, edit] : edits) {
    SCOPED_TRACE(field);
    absl::StatusOr<training::Checkpoint> checkpoint =
        training::ReadCheckpoint((shared_ / "ckpt" / "ckpt-00000003.onnx").string());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    edit(checkpoint->state);
    const fs::path edited_dir = dir_ / field;
    fs::create_directories(edited_dir);
    const std::string edited = (edited_dir / "ckpt-00000003.onnx").string();
    ASSERT_TRUE(training::WriteCheckpoint(*checkpoint, edited).ok());
    ExpectRefused(Castor("verify " + edited), 2, {edited, absl::StrCat("'", field, "'")});
    const Program resume = Castor(absl::StrCat("train --resume ", edited, " --data ", Data(),
                                               " --backend cpu --max-steps 5 --metrics m.jsonl"));
    ExpectRefused(resume, 2, {edited, absl::StrCat("'", field, "'")});
    ExpectNothingWritten(dir_ / "m.jsonl");
  }
}

// The castor.checkpoint.external_data entry is confined like any external
// data location (the record digest recomputed, so only the path is wrong).
TEST_F(MalformedInputTest, TheCheckpointsExternalDataEntryIsConfined) {
  const fs::path ckpt = CopyCheckpoints();
  const std::string path = (ckpt / "ckpt-00000003.onnx").string();
  fs::create_symlink("/etc/passwd", ckpt / "passwd.data");
  for (const std::string location : {"../../../../etc/passwd", "passwd.data"}) {
    SCOPED_TRACE(location);
    onnx::ModelProto proto = ReadProto((shared_ / "ckpt" / "ckpt-00000003.onnx").string());
    onnx::StringStringEntryProto* entry = proto.add_metadata_props();
    entry->set_key(training::kCheckpointExternalDataKey);
    entry->set_value(location);
    std::vector<std::pair<std::string, std::string>> record;
    for (const onnx::StringStringEntryProto& e : proto.metadata_props()) {
      record.emplace_back(e.key(), e.value());
    }
    for (onnx::StringStringEntryProto& e : *proto.mutable_metadata_props()) {
      if (e.key() == training::kCheckpointRecordDigestKey) {
        e.set_value(training::CheckpointRecordDigest(record));
      }
    }
    WriteProto(path, proto);
    const Program verify = Castor("verify " + path);
    ExpectRefused(verify, 2, {path, training::kCheckpointExternalDataKey, location});
    EXPECT_THAT(verify.out + verify.err, ::testing::Not(HasSubstr("root:")));
  }
}

// What --resume takes from the state is checked by verify too, so
// verify-then-resume never disagrees: a malformed field (loss, data, the
// extra entries) is exit 2 in both, output or input that are not the
// graph's are exit 1 (an inconsistency) in both, each naming the field.
TEST_F(MalformedInputTest, VerifyChecksWhatResumeNeeds) {
  struct Edit {
    int code;
    std::string problem;
    std::function<void(training::TrainingState&)> apply;
  };
  const std::vector<Edit> edits = {
      {2, "field 'loss' is 'hinge'", [](training::TrainingState& s) { s.loss = "hinge"; }},
      {2, "field 'data' is 'a.npy,b.npy,c.npy'",
       [](training::TrainingState& s) { s.data = "a.npy,b.npy,c.npy"; }},
      {2, "records tf32 as 3", [](training::TrainingState& s) { s.extra.Set("tf32", Json::Int(3)); }},
      {2, "field 'extra.freeze' is \"fc1(\", not a regular expression",
       [](training::TrainingState& s) { s.extra.Set("freeze", Json::String("fc1(")); }},
      {1, "the state's output 'nope' is not a model output",
       [](training::TrainingState& s) { s.output = "nope"; }},
      {1, "the state's input 'nope' is not a model input",
       [](training::TrainingState& s) { s.input = "nope"; }},
  };
  for (const Edit& edit : edits) {
    SCOPED_TRACE(edit.problem);
    absl::StatusOr<training::Checkpoint> checkpoint =
        training::ReadCheckpoint((shared_ / "ckpt" / "ckpt-00000003.onnx").string());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    edit.apply(checkpoint->state);
    const std::string edited = (dir_ / "edited.onnx").string();
    ASSERT_TRUE(training::WriteCheckpoint(*checkpoint, edited).ok());
    ExpectRefused(Castor("verify " + edited), edit.code, {edited, edit.problem});
    ExpectRefused(Castor(absl::StrCat("train --resume ", edited, " --data ", Data(),
                                      " --backend cpu --max-steps 5 --metrics m.jsonl")),
                  edit.code, {edited, edit.problem});
    ExpectNothingWritten(dir_ / "m.jsonl");
  }
}

// --resume DIR moves aside a newer checkpoint that fails verify (exit 1:
// an edited policy name; exit 2: a torn file), says so in one line each,
// continues from the newest good one, and removes the temporary files of
// an interrupted save.
TEST_F(MalformedInputTest, ResumeMovesAsideWhatFailsVerify) {
  const fs::path ckpt = CopyCheckpoints();
  const std::string newest = (ckpt / "ckpt-00000003.onnx").string();
  onnx::ModelProto proto = ReadProto(newest);
  for (onnx::StringStringEntryProto& entry : *proto.mutable_metadata_props()) {
    if (entry.key() == training::kCheckpointPolicyNameKey) entry.set_value("mixed_bfloat16");
  }
  WriteProto(newest, proto);
  EXPECT_EQ(Castor("verify " + newest).exit_code, 1);
  WriteBytes(ckpt / "ckpt-00000004.onnx", "torn");
  EXPECT_EQ(Castor((ckpt / "ckpt-00000004.onnx").string().insert(0, "verify ")).exit_code, 2);
  WriteBytes(ckpt / "ckpt-00000002.onnx.tmp.Ab12Cd", "half a save");
  const Program resumed = Castor(absl::StrCat("train --resume ", ckpt.string(), " --data ", Data(),
                                              " --backend cpu --epochs 2 --max-steps 4"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("resuming from " + (ckpt / "ckpt-00000002.onnx").string()));
  for (const std::string name : {"ckpt-00000003.onnx", "ckpt-00000004.onnx"}) {
    const std::string path = (ckpt / name).string();
    EXPECT_THAT(resumed.err, HasSubstr(absl::StrCat("warning: --resume: moved ", path, " aside to ",
                                                    path, ".broken: ", path, ": ")));
    EXPECT_TRUE(fs::exists(path + ".broken"));
  }
  EXPECT_THAT(resumed.err, HasSubstr("removed ckpt-00000002.onnx.tmp.Ab12Cd"));
  EXPECT_FALSE(fs::exists(ckpt / "ckpt-00000002.onnx.tmp.Ab12Cd"));
  // The run saved its own step 3 and 4, which verify.
  EXPECT_EQ(Castor("verify " + newest).exit_code, 0);
  EXPECT_EQ(Castor("verify " + (ckpt / "ckpt-00000004.onnx").string()).exit_code, 0);
}

// ------------------------------------------------------------- exit codes

// One rule in every subcommand: 2 for bad input, found before any work
// where possible (no metrics file is left); errors on one line, control
// characters escaped; label errors name the file and the sample.
TEST_F(MalformedInputTest, OneExitCodeRuleCheckedBeforeAnyWork) {
  Tensor small(DType::kFloat32, {48, 1, 20, 20});
  ASSERT_TRUE(training::WriteNpy((dir_ / "small.npy").string(), small).ok());
  ASSERT_TRUE(training::WriteNpy((dir_ / "one.npy").string(), Tensor(DType::kFloat32, {1, 1, 20, 20})).ok());
  const std::string fit = "do not fit the model input 'input' [N,1,28,28]";
  ExpectRefused(Castor(absl::StrCat("train ", kMlp, " --data small.npy,",
                                    (shared_ / "y.npy").string(), " --backend cpu --metrics m.jsonl")),
                2, {"small.npy: samples [48,1,20,20] ", fit});
  ExpectNothingWritten(dir_ / "m.jsonl");
  ExpectRefused(Castor(absl::StrCat("run ", kMlp, " --input input=one.npy")), 2,
                {"input 'input': dim 2 is 20, the model expects 28"});
  ExpectRefused(Castor(absl::StrCat("train ", kMlp, " --data ", Data(),
                                    " --backend cpu --input nope --metrics m.jsonl")),
                2, {"--input nope:", "has no input 'nope'; its inputs are input"});
  ExpectNothingWritten(dir_ / "m.jsonl");
  WriteBytes(dir_ / "afile", "");
  ExpectRefused(Castor(absl::StrCat("train ", kMlp, " --data ", Data(),
                                    " --backend cpu --checkpoint-dir afile --metrics m.jsonl")),
                2, {"--checkpoint-dir afile exists and is not a directory"});
  ExpectNothingWritten(dir_ / "m.jsonl");
  // A name with a newline is printed as \n, on the one error line.
  ExpectRefused(Castor("inspect \"$(printf 'evil\\nname.onnx')\""), 2,
                {"evil\\nname.onnx: no such file"});
  // A label out of range names the file and the sample, not the batch position.
  Tensor labels(DType::kInt64, {48});
  for (int64_t i = 0; i < 48; ++i) labels.data<int64_t>()[i] = i == 37 ? 12 : i % 10;
  ASSERT_TRUE(training::WriteNpy((dir_ / "labels.npy").string(), labels).ok());
  ExpectRefused(Castor(absl::StrCat("train ", kMlp, " --data ", (shared_ / "x.npy").string(),
                                    ",labels.npy --backend cpu --metrics m.jsonl")),
                2, {"labels.npy: label 12 of sample 37 is out of range [0, 10)"});
  ExpectNothingWritten(dir_ / "m.jsonl");
}

// NaN images: every step is skipped. The run stops after 5 such steps in
// a row with exit 1 and the diagnosis instead of finishing with exit 0.
TEST_F(MalformedInputTest, ARunWhoseEveryStepIsSkippedStops) {
  Tensor images(DType::kFloat32, {48, 28, 28});
  for (int64_t i = 0; i < images.num_elements(); ++i) {
    images.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
  }
  ASSERT_TRUE(training::WriteNpy((dir_ / "nan.npy").string(), images).ok());
  for (const std::string policy : {"mixed_float16", "mixed_bfloat16", "float32"}) {
    SCOPED_TRACE(policy);
    const Program p = Castor(absl::StrCat("train ", kMlp, " --data nan.npy,",
                                          (shared_ / "y.npy").string(), " --batch 4 --policy ",
                                          policy, " --backend cpu --metrics m.jsonl"));
    EXPECT_EQ(p.exit_code, 1) << p.err;
    EXPECT_THAT(p.err, HasSubstr("castor train: error: step 5: stopped: the loss itself was "
                                 "inf/NaN in float32 for 5 steps in a row"));
    EXPECT_THAT(p.err, HasSubstr("nan.npy"));
    EXPECT_EQ(Lines(ReadFile(dir_ / "m.jsonl")).size(), 5u);  // the steps that ran
  }
}

}  // namespace
}  // namespace castor::tools
