// Training data for `castor train --data ...`: readers for IDX files (the
// MNIST family, plain or gzip-compressed), NumPy .npy arrays and .npz
// archives (stored or deflated zip members), the `--data` argument forms
// (fashion-mnist, mnist, a directory, a .npz file, a comma-separated list of
// array files), and a BatchIterator that shuffles per epoch from a seed and
// can resume exactly from (epoch, position).
//
// Every loaded Dataset holds images [N, ...] as uint8 pixels (IDX files and
// uint8 arrays: a quarter of float32's memory) or float32 (3-D [N, H, W]
// image arrays get a channel axis: [N, 1, H, W]), or integer arrays (token
// ids [N, T], ...) as they are, and int64 labels [N] (class labels) or
// [N, T, ...] (per-position labels, e.g. next-token labels [N, T]);
// batches of images are float32, pixels scaled to [0, 1] as v / 255.0f;
// batches of integer inputs keep their dtype. FitDatasetToInput matches the
// inputs to the model input they feed (an int32 id array widens to an int64
// input). Label values are not range-checked here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/tensor.h"

namespace castor::training {

struct Dataset {
  std::string name;  // for messages: "fashion-mnist train", "data/train.npz", ...
  Tensor images;     // uint8 pixels, float32 or integer (token ids) [N, ...]
  Tensor labels;     // int64 [N] or [N, d1, ...], or float32 targets (mse, bce)
  // The arrays the two came from, for messages ("data.npz:x_train", a
  // file); "" where `name` says it.
  std::string images_source;
  std::string labels_source;
  // Further model inputs by name, each [N, ...] in the dtype of the input it
  // feeds (an .npz keyed by input names: input_ids + attention_mask, ...);
  // `images` feeds the first. Empty in the other forms.
  std::vector<std::pair<std::string, Tensor>> extra_inputs;
  // The model input `images` feeds in that form ("" in the others).
  std::string images_input;

  // Samples: the labels' count, or the inputs' where there are no labels
  // (the model's own loss).
  int64_t size() const {
    if (!labels.dims().empty()) return labels.dims()[0];
    return labels.dtype() == DType::kUndefined && !images.dims().empty() ? images.dims()[0] : 0;
  }
  // The dims of one sample: images.dims() without the leading N.
  std::vector<int64_t> sample_dims() const;
};

struct DataSplits {
  Dataset train;
  Dataset test;  // empty (size() == 0) when the source has no test split
  bool has_test() const { return test.size() > 0; }
};

// The directory `--data fashion-mnist` reads (Debian's dataset-fashion-mnist),
// and the one `--data mnist` reads; both hold the four IDX files.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr char kMnistDir[] = "/usr/share/datasets/mnist";

// --- IDX (http://yann.lecun.com/exdb/mnist/ format) -------------------------
// A file is gzip-decompressed when it starts with the gzip magic, whatever its
// name. Images: magic 0x00000803 (uint8, [N, H, W]) -> uint8 [N, 1, H, W]
// (batches scale them). Labels: magic 0x00000801 (uint8, [N]) -> int64 [N].
// Errors name the file and what was expected versus found (magic, dims,
// truncated or over-long data, corrupt gzip stream).
absl::StatusOr<Tensor> ReadIdxImages(const std::string& path);
absl::StatusOr<Tensor> ReadIdxLabels(const std::string& path);

// --- .npz (a zip archive of .npy files) --------------------------------------
// The arrays of an .npz, keyed by member name without ".npy". Members may be
// stored (method 0) or deflated (method 8); ZIP64 records are understood; the
// CRC-32 of every member is checked.
absl::StatusOr<std::map<std::string, Tensor>> ReadNpz(const std::string& path);

// --- array conversion -----------------------------------------------------
// Images: uint8 stays uint8 (pixels, scaled per batch); float16/bfloat16/
// float64/float32 -> float32; rank 3 [N, H, W] -> [N, 1, H, W]; other ranks
// (>= 1) as they are. Other integer arrays (int8..int64, uint16..uint64:
// token ids) stay as they are, dtype and shape: FitDatasetToInput decides
// whether they can feed the model input. bool is refused.
// Labels: any integer dtype -> int64; [N] or [N, 1] -> [N]; [N, d1, ...]
// (per-position labels, e.g. [N, T] next-token labels) as they are; float
// arrays (targets for mse and bce) -> float32 of their own shape. `source`
// names the array in errors (wrong dtype, or a scalar).
absl::StatusOr<Tensor> ImagesFromArray(Tensor array, const std::string& source);
absl::StatusOr<Tensor> LabelsFromArray(Tensor array, const std::string& source);

// Pairs images with labels: fails, naming `name`, when the counts differ or
// the images are neither uint8 pixels, float32 nor integer.
absl::StatusOr<Dataset> MakeDataset(std::string name, Tensor images, Tensor labels);

// Matches `dataset`'s inputs to the model input `input` of dtype
// `input_dtype` they feed:
//   floating-point input: uint8 pixels or float32 (as ImagesFromArray gives
//     them; batches are float32);
//   int64 or int32 input: integer arrays whose every value the input's
//     dtype holds (int32 -> int64, uint8 -> int32, ...) are widened in
//     place; the same dtype stays as it is;
// anything else (an int64 array for a float32 input, float data or int64
// ids for an int32 input, uint64 for int64) is InvalidArgument naming the
// array, the input and both dtypes.
absl::Status FitDatasetToInput(Dataset& dataset, const std::string& input, DType input_dtype);

// --- an .npz keyed by the model's input names ------------------------------
// What the loader needs of one model input: its name, dtype and dims (-1
// for a dim that is not static), and whether it must be fed (false: it has
// an initializer).
struct ModelInputSpec {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> dims;
  bool required = true;
};

// The labels array of the named form, and the suffix of the test split's
// arrays ("input_ids_test", "labels_test").
inline constexpr char kNamedLabelsArray[] = "labels";
inline constexpr char kTestSuffix[] = "_test";

// The .npz at `path` keyed by input names: one array per model input named
// after it, `labels`, and optionally a test split of the same names with
// "_test" appended (every array or none). nullopt when the file is in
// another form: no array is named after an input, or it holds
// x_train/y_train, x/y or images/labels and arrays the named form does not
// take (a file of the named form's arrays only is read as such, and so is
// every file with an input's array when there are no labels). Each array must have the input's rank and its
// static dims after the leading N, and a dtype that fits it: float32 (or
// float16/bfloat16/float64, widened) or uint8 pixels (scaled to [0, 1] per
// batch) for a floating-point input, integers that the input's int32/int64
// holds (widened; int64 token ids stay int64), bool for a bool input. Errors
// name the array, the input and what was expected: a required input with
// no array, an array that is no input, a dtype or shape that does not fit,
// arrays of different lengths.
// With `labels_required` false (the model computes its own loss) there are
// no labels: the arrays are the inputs only.
absl::StatusOr<std::optional<DataSplits>> LoadNpzByInputNames(
    const std::string& path, const std::vector<ModelInputSpec>& inputs,
    bool labels_required = true);

// One array file for a FILES list: .npy (by its magic) or IDX (anything else,
// gzip or not). `as_labels` selects the label conversion.
absl::StatusOr<Tensor> ReadArrayFile(const std::string& path, bool as_labels);

// A directory holding train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each optionally .gz), or
// train.npz (and optionally test.npz).
absl::StatusOr<DataSplits> LoadDataDirectory(const std::string& dir);

// One .npz file: x_train/y_train (+ x_test/y_test) as Keras saves them, or
// x/y, or images/labels (train only).
absl::StatusOr<DataSplits> LoadNpzFile(const std::string& path);

// The `--data` argument: "fashion-mnist", "mnist", a directory, a .npz file,
// "IMAGES,LABELS" (one split: train) or "TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,
// TEST_LABELS", each file .npy or IDX. Anything else is an error listing the
// accepted forms.
absl::StatusOr<DataSplits> LoadData(const std::string& spec);

// --- batches ----------------------------------------------------------------
// The feeds of a batch: `input` gets the images, then the extra inputs.
struct Batch;
std::vector<std::pair<std::string, Tensor>> BatchFeeds(const Batch& batch,
                                                       const std::string& input);

struct Batch {
  Tensor images;                 // float32 [B, ...] (pixels scaled to [0, 1]), or the
                                 // dataset's integer dtype (token ids)
  Tensor labels;                 // int64 [B] or [B, d1, ...]
  std::vector<std::pair<std::string, Tensor>> extra_inputs;  // Dataset::extra_inputs' rows
  std::vector<int64_t> indices;  // the dataset rows, in batch order
  int64_t epoch = 0;             // the epoch this batch belongs to
  int64_t position = 0;          // its first sample's offset within the epoch order
};

// Copies rows `indices` of `dataset` into one batch (uint8 pixels scaled
// to float32 [0, 1]; integer inputs and every label row as they are).
Batch GatherBatch(const Dataset& dataset, const std::vector<int64_t>& indices);

struct BatchOptions {
  int64_t batch_size = 32;
  bool shuffle = true;     // false: dataset order every epoch
  uint64_t seed = 0;       // epoch e is shuffled by std::mt19937_64(seed + e)
  bool drop_last = false;  // true: skip an epoch's final partial batch
};

// Yields batches forever, epoch after epoch. The state is (epoch, position):
// position counts the samples of the current epoch already yielded, so an
// iterator created from a checkpoint's (epoch, position) yields the same next
// batch as the one that was saved. After the last batch of an epoch the state
// moves to (epoch + 1, 0) at once, so `while (it.epoch() < epochs)` loops
// over whole epochs. The shuffle (Fisher-Yates over std::mt19937_64 with an
// unbiased bounded draw) gives the same order on every platform.
class BatchIterator {
 public:
  // `dataset` must outlive the iterator. Fails when the batch size is not
  // positive, the dataset is empty, drop_last leaves no batch, or the
  // position is out of range.
  static absl::StatusOr<BatchIterator> Create(const Dataset& dataset, BatchOptions options,
                                              int64_t epoch = 0, int64_t position = 0);

  Batch Next();

  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }
  // Batches in one epoch (counting a partial last batch unless drop_last).
  int64_t batches_per_epoch() const;
  // The sample order of the current epoch.
  const std::vector<int64_t>& order() const { return order_; }

  // The sample order of `epoch` for `size` samples under `options`.
  static std::vector<int64_t> EpochOrder(int64_t size, const BatchOptions& options, int64_t epoch);

 private:
  BatchIterator(const Dataset& dataset, BatchOptions options) : dataset_(&dataset), options_(options) {}
  void StartEpoch(int64_t epoch);
  // Moves to the next epoch when the current one has no batch left.
  void RollOverIfDone();

  const Dataset* dataset_;
  BatchOptions options_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  std::vector<int64_t> order_;
};

// --- data-parallel shards ----------------------------------------------------
// The rows rank `rank` of `world_size` trains on in a global batch (`--batch`
// is the global batch), as PyTorch's DistributedSampler and a DataLoader of
// batch / world_size split an epoch: the epoch order is padded to a
// multiple of world_size with its own first samples (cyclically), rank r
// takes positions r, r + W, r + 2W, ...; so global batch k of the order is
// the union of every rank's batch k. `batch_indices` is one global batch as
// BatchIterator yields it, `epoch_order` its epoch's order (only its first
// samples are read, to pad the epoch's last batch). Every rank gets
// ceil(batch / world_size) rows.
std::vector<int64_t> RankShard(const std::vector<int64_t>& batch_indices,
                               const std::vector<int64_t>& epoch_order, int rank,
                               int world_size);

}  // namespace castor::training
