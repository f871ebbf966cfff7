// RunNode (see run_node.h).
#include "backend/run_node.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace castor {
namespace {

// Owns every buffer it hands out; frees them all when destroyed.
class OwningAllocator : public OutputAllocator {
 public:
  explicit OwningAllocator(Backend& backend) : backend_(backend) {}
  ~OwningAllocator() override {
    for (void* p : owned_) backend_.Free(p);
  }
  absl::StatusOr<void*> AllocateOutput(int, DType dtype,
                                       const std::vector<int64_t>& dims) override {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return Allocate(static_cast<size_t>(n) * DTypeSize(dtype));
  }
  absl::StatusOr<void*> AllocateScratch(size_t bytes) override { return Allocate(bytes); }
  absl::StatusOr<void*> Allocate(size_t bytes) {
    absl::StatusOr<void*> p = backend_.Allocate(bytes);
    if (p.ok()) owned_.push_back(*p);
    return p;
  }

 private:
  Backend& backend_;
  std::vector<void*> owned_;
};

}  // namespace

absl::StatusOr<std::vector<Tensor>> RunNode(Backend& backend, const Node& node, int64_t opset,
                                            const std::vector<const Tensor*>& inputs) {
  absl::StatusOr<const KernelDef*> kernel = backend.kernels().Find(node);
  if (!kernel.ok()) return kernel.status();
  OwningAllocator allocator(backend);
  std::vector<TensorView> views(inputs.size());
  std::vector<const TensorView*> view_ptrs(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr) continue;
    const Tensor& t = *inputs[i];
    if (t.dtype() == DType::kString) {
      return absl::UnimplementedError(
          absl::StrCat(node.op_type(), " node '", node.name(), "': string inputs"));
    }
    absl::StatusOr<void*> data = allocator.Allocate(t.byte_size());
    if (!data.ok()) return data.status();
    if (absl::Status s = backend.CopyFromHost(*data, t.raw(), t.byte_size()); !s.ok()) return s;
    views[i] = TensorView{*data, t.dtype(), t.dims()};
    view_ptrs[i] = &views[i];
  }
  KernelContext ctx(node, opset, backend, view_ptrs, allocator);
  if (absl::Status s = (*kernel)->run(ctx); !s.ok()) return s;
  if (absl::Status s = backend.Synchronize(); !s.ok()) return s;
  std::vector<Tensor> outputs(node.num_outputs());
  for (int i = 0; i < node.num_outputs(); ++i) {
    const TensorView& view = ctx.outputs()[i];
    if (view.data == nullptr && view.dtype == DType::kUndefined) continue;
    Tensor t(view.dtype, view.dims);
    if (t.byte_size() > 0) {
      if (absl::Status s = backend.CopyToHost(t.raw(), view.data, t.byte_size()); !s.ok()) {
        return s;
      }
    }
    outputs[i] = std::move(t);
  }
  return outputs;
}

}  // namespace castor
