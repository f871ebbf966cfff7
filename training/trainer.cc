// Trainer (see trainer.h).
#include "training/trainer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/half.h"
#include "graph/status.h"

namespace castor::training {

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(Model model, TrainingGraph graph,
                                                         const TrainerOptions& options,
                                                         Backend& backend) {
  CASTOR_RETURN_IF_ERROR(Optimizer::Create(options.optimizer).status());
  CASTOR_ASSIGN_OR_RETURN(LossScaler scaler, LossScaler::Create(options.scaler));
  const StepConfig config{options.optimizer, options.lr, options.scaler};
  std::unique_ptr<Trainer> trainer(
      new Trainer(std::move(model), std::move(graph), backend, config, std::move(scaler)));
  trainer->name_first_non_finite_ = options.name_first_non_finite;
  trainer->rng_.seed = options.rng_seed;
  trainer->time_kernels_ = options.time_kernels;
  trainer->replay_unavailable_ =
      options.time_kernels  ? "kernels are timed one by one"
      : options.replay_steps ? backend.CaptureUnsupportedReason()
                             : "turned off";
  trainer->communicator_ = options.communicator;
  if (trainer->communicator_ != nullptr && trainer->replay_unavailable_.empty()) {
    trainer->replay_unavailable_ = "a data-parallel step averages its gradients on the host";
  }
  CASTOR_RETURN_IF_ERROR(trainer->Initialize());
  if (trainer->communicator_ != nullptr) {
    if (options.device_collectives) {
      CASTOR_ASSIGN_OR_RETURN(trainer->device_group_,
                              distributed::JoinDeviceGroup(backend, *trainer->communicator_,
                                                           options.collective_timeout));
    }
    if (trainer->device_group_ != nullptr && options.replay_steps &&
        backend.CaptureUnsupportedReason().empty()) {
      trainer->replay_unavailable_ = absl::StrCat(
          "a data-parallel step's average (", trainer->device_group_->engine(),
          ") is not recorded: each step waits for it with the --dist-timeout");
    }
    // Buckets that fill while the backward pass runs need buffers that are
    // ready when their node returns: the CPU's. (With device collectives
    // the buckets only carry synchronised BatchNormalization's sums.)
    const bool overlap = trainer->device_group_ == nullptr &&
                         options.allreduce_bucket_bytes > 0 && backend.synchronous();
    trainer->buckets_ = std::make_unique<distributed::BucketedAllreduce>(
        *trainer->communicator_, overlap ? options.allreduce_bucket_bytes : 0);
    Trainer* self = trainer.get();
    if (overlap) {
      trainer->executor_->SetOutputObserver([self](int index, const TensorView& value) {
        // Only the step's own run: not a diagnostic rerun.
        return self->staging_gradients_ ? self->StageForAverage(index, value)
                                        : absl::OkStatus();
      });
    }
    if (options.sync_batch_norm) {
      if (!backend.supports_cross_rank_sum()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "synchronised BatchNormalization runs on the CPU backend only; this run is on ",
            backend.name()));
      }
      backend.set_cross_rank_sum([self](double* values, size_t count, const std::string& what) {
        return self->buckets_->SumNow(values, count, what);
      });
    }
  }
  return trainer;
}

Trainer::~Trainer() {
  if (communicator_ != nullptr) backend_.set_cross_rank_sum(nullptr);
}

absl::StatusOr<Trainer::BackendMemory> Trainer::Allocate(size_t bytes) {
  CASTOR_ASSIGN_OR_RETURN(void* data, backend_.Allocate(bytes));
  Backend* backend = &backend_;
  return BackendMemory(data, [backend](void* p) {
    if (p != nullptr) backend->Free(p);
  });
}

absl::Status Trainer::Initialize() {
  kernels_ = backend_.step_kernels();
  if (kernels_ == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("backend ", backend_.name(), " has no training-step kernels"));
  }
  if (graph_.evaluation == nullptr) {
    return absl::InvalidArgumentError("the training graph has no evaluation graph");
  }
  const Graph& g = *model_.graph;
  for (const auto& [parameter, gradient] : graph_.gradients) state_names_.push_back(parameter);
  for (const auto& [statistic, updated] : graph_.running_stats) state_names_.push_back(statistic);
  for (const std::string& name : state_names_) {
    const Value* value = g.FindValue(name);
    if (value == nullptr || value->initializer() == nullptr) {
      return absl::InternalError(absl::StrCat("training state '", name, "' is no initializer"));
    }
  }
  ExecutorOptions executor_options;
  executor_options.time_kernels = time_kernels_;
  CASTOR_ASSIGN_OR_RETURN(executor_, Executor::Create(model_, backend_, executor_options));
  CASTOR_ASSIGN_OR_RETURN(eval_executor_, Executor::Create(*graph_.evaluation, backend_));
  CASTOR_ASSIGN_OR_RETURN(TensorView scale, executor_->ResidentTensor(kLossScaleInput));
  if (scale.dtype != DType::kFloat32 || scale.num_elements() != 1) {
    return absl::InternalError("the training graph's loss scale is not a float32 scalar");
  }
  loss_scale_ = scale.as<float>();

  const int slots = OptimizerSlotCount(config_.optimizer);
  for (const auto& [parameter, gradient] : graph_.gradients) {
    ParameterUpdate update;
    update.name = parameter;
    CASTOR_ASSIGN_OR_RETURN(update.weight, executor_->ResidentTensor(parameter));
    for (int k = 0; k < slots; ++k) {
      CASTOR_ASSIGN_OR_RETURN(BackendMemory memory, Allocate(update.weight.byte_size()));
      update.slots[k] = static_cast<float*>(memory.get());
      slot_memory_.push_back(std::move(memory));
    }
    parameters_.push_back(std::move(update));
  }
  CASTOR_ASSIGN_OR_RETURN(step_state_, Allocate(sizeof(StepState)));
  CASTOR_ASSIGN_OR_RETURN(Optimizer fresh, Optimizer::Create(config_.optimizer));
  return UploadOptimizerAndScaler(fresh);
}

absl::Status Trainer::UploadOptimizerAndScaler(const Optimizer& optimizer) {
  const std::vector<std::string> slot_names = OptimizerSlotNames(config_.optimizer);
  for (const ParameterUpdate& p : parameters_) {
    auto saved = optimizer.state().find(p.name);
    for (size_t k = 0; k < slot_names.size(); ++k) {
      const Tensor* moment = nullptr;
      if (saved != optimizer.state().end()) {
        auto slot = saved->second.find(slot_names[k]);
        if (slot != saved->second.end()) moment = &slot->second;
      }
      if (moment != nullptr && moment->dims() != p.weight.dims) {
        return absl::InvalidArgumentError(
            absl::StrCat("resume: optimizer slot '", slot_names[k], "' of '", p.name,
                         "' is ", moment->shape().ToString(), ", the parameter ",
                         Shape::FromDims(p.weight.dims).ToString()));
      }
      const Tensor zeros = moment == nullptr ? Tensor(DType::kFloat32, p.weight.dims) : Tensor();
      const Tensor& source = moment != nullptr ? *moment : zeros;
      CASTOR_RETURN_IF_ERROR(backend_.CopyFromHost(p.slots[k], source.raw(), source.byte_size()));
    }
  }
  StepState state;
  state.scaler = scaler_.state();
  state.optimizer_step = optimizer.step();
  optimizer_step_ = optimizer.step();
  CASTOR_RETURN_IF_ERROR(backend_.CopyFromHost(step_state_.get(), &state, sizeof(state)));
  const float scale = static_cast<float>(scaler_.scale());
  return backend_.CopyFromHost(loss_scale_, &scale, sizeof(scale));
}

absl::Status Trainer::Restore(const std::map<std::string, Tensor>& state,
                              const Optimizer& optimizer, const LossScaler& scaler,
                              int64_t steps) {
  recorded_.reset();  // it holds this run's optimizer and scaler settings
  run_signatures_.clear();
  for (const std::string& name : state_names_) {
    auto saved = state.find(name);
    if (saved == state.end()) {
      return absl::InvalidArgumentError(absl::StrCat("resume: no saved value for '", name, "'"));
    }
    CASTOR_ASSIGN_OR_RETURN(TensorView current, executor_->ResidentTensor(name));
    if (saved->second.dtype() != current.dtype || saved->second.dims() != current.dims) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resume: '", name, "' is saved as ", DTypeName(saved->second.dtype()), " ",
          Shape::FromDims(saved->second.dims()).ToString(), ", the model has ",
          DTypeName(current.dtype), " ", Shape::FromDims(current.dims).ToString()));
    }
  }
  if (OptimizerSlotCount(optimizer.options()) != OptimizerSlotCount(config_.optimizer)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume: the saved optimizer (", OptimizerKindName(optimizer.options().kind),
        ") keeps other state than this run's (", OptimizerKindName(config_.optimizer.kind), ")"));
  }
  for (const std::string& name : state_names_) {
    CASTOR_RETURN_IF_ERROR(executor_->UpdateResident(name, state.at(name)));
  }
  config_.optimizer = optimizer.options();
  config_.scaler = scaler.options();
  scaler_ = scaler;
  CASTOR_RETURN_IF_ERROR(UploadOptimizerAndScaler(optimizer));
  steps_ = steps;
  eval_stale_ = true;
  return absl::OkStatus();
}

absl::StatusOr<Trainer::Snapshot> Trainer::TakeSnapshot() const {
  std::map<std::string, Tensor> state;
  auto download = [this](const void* source, DType dtype, const std::vector<int64_t>& dims)
      -> absl::StatusOr<Tensor> {
    Tensor tensor(dtype, dims);
    CASTOR_RETURN_IF_ERROR(backend_.CopyToHost(tensor.raw(), source, tensor.byte_size()));
    return tensor;
  };
  for (const std::string& name : state_names_) {
    CASTOR_ASSIGN_OR_RETURN(TensorView view, executor_->ResidentTensor(name));
    CASTOR_ASSIGN_OR_RETURN(state[name], download(view.data, view.dtype, view.dims));
  }
  std::map<std::string, std::map<std::string, Tensor>> moments;
  if (optimizer_step_ > 0) {
    const std::vector<std::string> slot_names = OptimizerSlotNames(config_.optimizer);
    for (const ParameterUpdate& p : parameters_) {
      for (size_t k = 0; k < slot_names.size(); ++k) {
        CASTOR_ASSIGN_OR_RETURN(moments[p.name][slot_names[k]],
                                download(p.slots[k], DType::kFloat32, p.weight.dims));
      }
    }
  }
  CASTOR_ASSIGN_OR_RETURN(Optimizer optimizer,
                          Optimizer::Restore(config_.optimizer, optimizer_step_, std::move(moments)));
  return Snapshot{std::move(state), std::move(optimizer)};
}

absl::StatusOr<StepResult> Trainer::Evaluate(std::vector<std::pair<std::string, Tensor>> inputs,
                                             Tensor labels) {
  StepResult result;
  result.step = steps_;
  if (eval_stale_) {
    for (const std::string& name : state_names_) {
      CASTOR_ASSIGN_OR_RETURN(TensorView trained, executor_->ResidentTensor(name));
      CASTOR_RETURN_IF_ERROR(eval_executor_->AssignResident(name, trained));
    }
    eval_stale_ = false;
  }
  // The model's own loss (--loss output) reads no labels.
  if (graph_.loss != LossKind::kModelOutput) inputs.emplace_back(kLabelsInput, std::move(labels));
  CASTOR_ASSIGN_OR_RETURN(std::vector<Tensor> outputs, eval_executor_->Run(inputs));
  result.loss = outputs[0].data<float>()[0];
  result.output = std::move(outputs[1]);
  return result;
}

namespace {

// "input:float32[16,1,28,28] castor.labels:int64[16]": names, dtypes, dims.
std::string FeedSignature(const std::vector<std::pair<std::string, Tensor>>& feeds) {
  std::string signature;
  for (const auto& [name, tensor] : feeds) {
    absl::StrAppend(&signature, name, ":", DTypeName(tensor.dtype()), "[",
                    absl::StrJoin(tensor.dims(), ","), "] ");
  }
  return signature;
}

}  // namespace

absl::StatusOr<std::vector<TensorView>> Trainer::ExecutorOutputs() const {
  std::vector<TensorView> outputs;
  for (size_t k = 0; k < model_.graph->outputs().size(); ++k) {
    CASTOR_ASSIGN_OR_RETURN(TensorView view, executor_->OutputView(static_cast<int>(k)));
    outputs.push_back(std::move(view));
  }
  return outputs;
}

bool Trainer::Averaged(int index) const {
  return index == 0 ||
         (index >= 2 && index < 2 + static_cast<int>(graph_.gradients.size()));
}

absl::Status Trainer::StageForAverage(int index, const TensorView& value) {
  if (!Averaged(index)) return absl::OkStatus();
  const size_t n = static_cast<size_t>(value.num_elements());
  return buckets_->Add(index, n, [&](float* staged) -> absl::Status {
    if (value.dtype == DType::kFloat32) {
      return backend_.CopyToHost(staged, value.data, value.byte_size());
    }
    if (value.dtype != DType::kFloat16 && value.dtype != DType::kBFloat16) {
      return absl::InternalError(absl::StrCat(
          "a data-parallel step averages float gradients; one is ", DTypeName(value.dtype)));
    }
    staged_bits_.resize(n);
    CASTOR_RETURN_IF_ERROR(backend_.CopyToHost(staged_bits_.data(), value.data, value.byte_size()));
    for (size_t i = 0; i < n; ++i) {
      staged[i] = value.dtype == DType::kFloat16 ? HalfBitsToFloat(staged_bits_[i])
                                                 : BFloat16BitsToFloat(staged_bits_[i]);
    }
    return absl::OkStatus();
  });
}

std::string Trainer::allreduce_engine() const {
  if (device_group_ != nullptr) return device_group_->engine();
  return communicator_ != nullptr ? communicator_->engine() : "";
}

absl::Status Trainer::AverageAcrossRanks(const std::vector<TensorView>& outputs) {
  if (communicator_ == nullptr) return absl::OkStatus();
  if (device_group_ != nullptr) {
    std::vector<TensorView> averaged;
    device_average_bytes_ = 0;
    for (int k = 0; k < static_cast<int>(outputs.size()); ++k) {
      if (!Averaged(k)) continue;
      averaged.push_back(outputs[static_cast<size_t>(k)]);
      device_average_bytes_ += static_cast<int64_t>(averaged.back().byte_size());
    }
    return device_group_->AverageInPlace(
        averaged, absl::StrCat("step ", steps_ + 1, ": the loss and ", averaged.size() - 1,
                               " gradient(s)"));
  }
  // What the backward pass did not hand over (all of it without overlap),
  // in output order: the loss, then the gradients.
  for (int k = 0; k < static_cast<int>(outputs.size()); ++k) {
    if (!buckets_->Added(k)) {
      CASTOR_RETURN_IF_ERROR(StageForAverage(k, outputs[static_cast<size_t>(k)]));
    }
  }
  CASTOR_RETURN_IF_ERROR(buckets_->Finish());
  for (int k = 0; k < static_cast<int>(outputs.size()); ++k) {
    if (!Averaged(k)) continue;
    const TensorView& view = outputs[static_cast<size_t>(k)];
    size_t n = 0;
    const float* averaged = buckets_->Averaged(k, &n);
    if (averaged == nullptr || n != static_cast<size_t>(view.num_elements())) {
      return absl::InternalError(absl::StrCat("graph output ", k, " missing from the buckets"));
    }
    if (view.dtype == DType::kFloat32) {
      CASTOR_RETURN_IF_ERROR(backend_.CopyFromHost(view.data, averaged, view.byte_size()));
      continue;
    }
    staged_bits_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      staged_bits_[i] = view.dtype == DType::kFloat16 ? FloatToHalfBits(averaged[i])
                                                      : FloatToBFloat16Bits(averaged[i]);
    }
    CASTOR_RETURN_IF_ERROR(backend_.CopyFromHost(view.data, staged_bits_.data(), view.byte_size()));
  }
  return absl::OkStatus();
}

absl::Status Trainer::QueueStepEnd(const std::vector<TensorView>& outputs) {
  // Outputs: loss, model output, gradients..., running statistics...
  const size_t num_gradients = graph_.gradients.size();
  if (outputs.size() != 2 + num_gradients + graph_.running_stats.size()) {
    return absl::InternalError("the training graph's outputs do not match its description");
  }
  std::vector<TensorView> gradients(outputs.begin() + 2, outputs.begin() + 2 + num_gradients);
  for (size_t k = 0; k < num_gradients; ++k) parameters_[k].gradient = gradients[k];
  auto* state = static_cast<StepState*>(step_state_.get());
  CASTOR_RETURN_IF_ERROR(
      kernels_->UnscaleAndDecide(config_, gradients, outputs[0], state, loss_scale_));
  CASTOR_RETURN_IF_ERROR(kernels_->ApplyOptimizer(config_, parameters_, state));
  for (size_t k = 0; k < graph_.running_stats.size(); ++k) {
    CASTOR_ASSIGN_OR_RETURN(TensorView statistic,
                            executor_->ResidentTensor(graph_.running_stats[k].first));
    CASTOR_RETURN_IF_ERROR(
        kernels_->CopyUnlessSkipped(statistic, outputs[2 + num_gradients + k], state));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Record(const Feeds& inputs) {
  for (const auto& [name, tensor] : inputs) {
    if (!IsFloatingPoint(tensor.dtype()) && name != kLabelsInput) {
      return absl::FailedPreconditionError(absl::StrCat(
          "feed '", name, "' is ", DTypeName(tensor.dtype()),
          ": kernels may plan with an integer feed's values on the host, which a replay "
          "would not see"));
    }
  }
  auto step = std::make_unique<RecordedStep>();
  step->signature = FeedSignature(inputs);
  // The buffers are filled before each replay (LoadRecordedFeeds): while
  // recording nothing runs, so what they hold does not matter yet.
  for (const auto& [name, tensor] : inputs) {
    TensorView view{nullptr, tensor.dtype(), tensor.dims()};
    if (tensor.byte_size() > 0) {
      CASTOR_ASSIGN_OR_RETURN(BackendMemory memory, Allocate(tensor.byte_size()));
      view.data = memory.get();
      step->feed_memory.push_back(std::move(memory));
    }
    // The labels' host copy lets the loss check them on the host while
    // recording; before each replay the trainer checks them itself.
    if (name == kLabelsInput) view.host_data = tensor.raw();
    step->feeds.emplace_back(name, std::move(view));
  }
  CASTOR_RETURN_IF_ERROR(backend_.BeginCapture());
  absl::Status queued = executor_->RunOnBackendWithBackendFeeds(step->feeds);
  if (queued.ok()) {
    absl::StatusOr<std::vector<TensorView>> outputs = ExecutorOutputs();
    queued = outputs.status();
    if (outputs.ok()) {
      step->outputs = *std::move(outputs);
      queued = QueueStepEnd(step->outputs);
    }
  }
  if (!queued.ok()) {
    backend_.AbortCapture();
    executor_->ReleaseOutputs();
    return queued;
  }
  absl::StatusOr<std::unique_ptr<CapturedWork>> work = backend_.EndCapture();
  if (!work.ok()) {
    executor_->ReleaseOutputs();
    return work.status();
  }
  step->work = *std::move(work);
  for (auto& [name, view] : step->feeds) view.host_data = nullptr;  // this step's only
  recorded_ = std::move(step);
  return absl::OkStatus();
}

absl::Status Trainer::LoadRecordedFeeds(const Feeds& inputs) {
  for (size_t k = 0; k < inputs.size(); ++k) {
    const auto& [name, tensor] = inputs[k];
    const TensorView& buffer = recorded_->feeds[k].second;
    if (name == kLabelsInput && graph_.loss == LossKind::kSoftmaxCrossEntropy &&
        !IsFloatingPoint(tensor.dtype()) && recorded_->outputs[1].dims.size() >= 2) {
      // The loss kernel's own check ran once, while recording. The class
      // axis is the output's last ([N, C], or [N, T, V] sequence logits).
      const int64_t classes = recorded_->outputs[1].dims.back();
      for (int64_t p = 0; p < tensor.num_elements(); ++p) {
        const int64_t label = tensor.dtype() == DType::kInt32 ? tensor.data<int32_t>()[p]
                                                              : tensor.data<int64_t>()[p];
        if (graph_.ignore_index.has_value() && label == *graph_.ignore_index) continue;
        if (label < 0 || label >= classes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "labels: label ", label, " at position ", p, " is out of range [0, ", classes,
              "): the model output '", graph_.model_output, "' has ", classes, " classes"));
        }
      }
    }
    CASTOR_RETURN_IF_ERROR(backend_.CopyFromHost(buffer.data, tensor.raw(), tensor.byte_size()));
  }
  return absl::OkStatus();
}

absl::Status Trainer::WriteRngState() {
  if (graph_.rng_dropouts == 0) return absl::OkStatus();
  Tensor state(DType::kInt64, {2});
  state.data<int64_t>()[0] = static_cast<int64_t>(rng_.seed);
  state.data<int64_t>()[1] = rng_.counter;
  return executor_->UpdateResident(kRngStateInput, state);
}

absl::StatusOr<StepResult> Trainer::Step(Feeds inputs, Tensor labels) {
  // Before a recording too: a replay reads the resident state as it is.
  CASTOR_RETURN_IF_ERROR(WriteRngState());
  if (graph_.loss != LossKind::kModelOutput) inputs.emplace_back(kLabelsInput, std::move(labels));
  const std::string signature = FeedSignature(inputs);
  if (recorded_ == nullptr && replay_unavailable_.empty() && run_signatures_.contains(signature)) {
    // A kernel's InvalidArgument is about this batch (a bad label, say):
    // the node-by-node step below reports it, and a later repeat records.
    absl::Status recorded = Record(inputs);
    if (!recorded.ok() && recorded.code() != absl::StatusCode::kInvalidArgument) {
      replay_unavailable_ = absl::StrCat("recording the step failed (", recorded.message(), ")");
    }
  }
  if (recorded_ != nullptr && recorded_->signature == signature) {
    CASTOR_RETURN_IF_ERROR(LoadRecordedFeeds(inputs));
    CASTOR_RETURN_IF_ERROR(recorded_->work->Replay());
    ++replayed_steps_;
    return FinishStep(recorded_->outputs, inputs, /*replayed=*/true);
  }
  if (buckets_ != nullptr) buckets_->BeginStep(absl::StrCat("step ", steps_ + 1));
  staging_gradients_ = buckets_ != nullptr;
  const absl::Status ran = executor_->RunOnBackend(inputs);
  staging_gradients_ = false;
  CASTOR_RETURN_IF_ERROR(ran);
  CASTOR_ASSIGN_OR_RETURN(std::vector<TensorView> outputs, ExecutorOutputs());
  CASTOR_RETURN_IF_ERROR(AverageAcrossRanks(outputs));
  CASTOR_RETURN_IF_ERROR(QueueStepEnd(outputs));
  run_signatures_.insert(signature);  // a step that ran: the next with these shapes records
  return FinishStep(outputs, inputs, /*replayed=*/false);
}

absl::StatusOr<StepResult> Trainer::FinishStep(const std::vector<TensorView>& outputs,
                                               Feeds& inputs, bool replayed) {
  peak_activation_bytes_ =
      std::max(peak_activation_bytes_, executor_->last_stats().peak_activation_bytes);
  const TensorView& loss = outputs[0];
  const TensorView& output = outputs[1];
  // A data-parallel step's device average first, within the timeout: a
  // rank that died must not leave the wait below hanging.
  double device_average_seconds = 0;
  if (device_group_ != nullptr && !replayed) {
    CASTOR_ASSIGN_OR_RETURN(device_average_seconds,
                            device_group_->Wait(absl::StrCat("step ", steps_ + 1)));
  }
  // What the step logs: the only wait for the backend.
  StepState decided;
  CASTOR_RETURN_IF_ERROR(backend_.CopyToHost(&decided, step_state_.get(), sizeof(decided)));
  StepResult result;
  result.replayed = replayed;
  float loss_value = 0;
  CASTOR_RETURN_IF_ERROR(backend_.CopyToHost(&loss_value, loss.data, sizeof(loss_value)));
  result.loss = loss_value;
  result.output = Tensor(output.dtype, output.dims);
  CASTOR_RETURN_IF_ERROR(
      backend_.CopyToHost(result.output.raw(), output.data, result.output.byte_size()));
  executor_->ReleaseOutputs();  // the gradients' memory, until the next step
  scaler_.set_state(decided.scaler);
  optimizer_step_ = decided.optimizer_step;
  ++steps_;
  ++rng_.counter;  // a rerun naming the first non-finite node reads the same state
  result.step = steps_;
  result.skipped = decided.skipped != 0;
  result.loss_scale = decided.scale_used;
  result.lr = decided.update.lr;
  result.grad_norm = decided.grad_norm;
  if (device_group_ != nullptr) {  // one group, after the backward pass
    result.allreduce_bytes = device_average_bytes_;
    result.allreduce_seconds = device_average_seconds;
    result.allreduce_wait_seconds = device_average_seconds;
    result.allreduce_buckets = 1;
  } else if (buckets_ != nullptr) {  // this step's (data-parallel steps are never replayed)
    result.allreduce_bytes = buckets_->bytes();
    result.allreduce_seconds = buckets_->allreduce_seconds();
    result.allreduce_wait_seconds = buckets_->wait_seconds();
    result.allreduce_buckets = buckets_->buckets();
  }
  if (!result.skipped) {
    eval_stale_ = true;
    return result;
  }
  result.diagnosis = scaler_.Diagnosis();
  if (name_first_non_finite_) {
    inputs.emplace_back(kLossScaleInput, Tensor::Scalar(static_cast<float>(decided.scale_used)));
    // Each rank stops its search at its own first non-finite node, so the
    // ranks' BatchNormalization nodes would not meet: this diagnostic run
    // uses each rank's own batch statistics.
    Backend::CrossRankSum synced = backend_.cross_rank_sum();
    backend_.set_cross_rank_sum(nullptr);
    absl::StatusOr<std::optional<NonFiniteOutput>> found = executor_->FindFirstNonFinite(inputs);
    backend_.set_cross_rank_sum(std::move(synced));
    CASTOR_ASSIGN_OR_RETURN(std::optional<NonFiniteOutput> first, std::move(found));
    if (first.has_value()) {
      result.first_non_finite =
          absl::StrCat("node '", first->node, "' (", first->op_type, ") output '", first->value,
                       "': ", first->non_finite, " of ", first->elements, " elements non-finite");
    }
  }
  return result;
}

}  // namespace castor::training
