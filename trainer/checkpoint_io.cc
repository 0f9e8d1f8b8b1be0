#include "trainer/checkpoint_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <sstream>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/checkpoint_manifest.h"
#include "client/hashing_file_writer.h"
#include "common/fs.h"
#include "common/log.h"

namespace dt {
namespace {

std::string ArchiveBytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace

std::string ExceptionText(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

std::string DescribeConfig(const Gpt2Config& c) {
  return absl::StrCat("vocab_size=", c.vocab_size, ",n_positions=", c.n_positions, ",n_embd=", c.n_embd,
                      ",n_layer=", c.n_layer, ",n_head=", c.n_head);
}

namespace {

// LibTorch 1.x names an optimizer's parameters in optimizer.pt by their TensorImpl addresses as an
// ostream prints them ("0x..."); 2.x reads the names back with std::stoull (torch/optim/serialize.h),
// which makes every one 0: its load gives the first parameter another one's moments and the others
// none. Such a file is refused instead (FAILED_PRECONDITION); OK for any other.
absl::Status LoadableOptimizerArchive(torch::serialize::InputArchive& optimizer_archive, const std::string& dir) {
#if TORCH_VERSION_MAJOR >= 2
  torch::serialize::InputArchive state;
  if (!optimizer_archive.try_read("state", state)) return absl::OkStatus();
  for (const std::string& key : state.keys()) {
    if (key.rfind("0x", 0) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", dir, " holds an optimizer state written by LibTorch 1.x, which LibTorch 2.x ",
                       "loads into the wrong parameters: resume it with a dttrainer built against LibTorch 1.x"));
    }
  }
#endif
  return absl::OkStatus();
}

// A Generator is a handle: copies share the generator they name.
torch::Tensor GeneratorState(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// The CPU generator's state, and the model's device's when that is not the CPU.
void SaveRngStates(Gpt2& model, CheckpointArchives& a) {
  a.rng = GeneratorState(at::detail::getDefaultCPUGenerator());
  torch::Device device = model->parameters().front().device();
  if (!device.is_cpu()) a.device_rng = GeneratorState(at::globalContext().defaultGenerator(device));
}

void RestoreRngState(at::Generator gen, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Copies tensors into host memory that training cannot change (device tensors come to the CPU),
// into kept buffers when there is a staging area. Copies into staging buffers are collected while
// the archives are built, into a SnapshotCopy: a host tensor's as pieces for threads to copy, a
// device's queued at once on the device's side stream (DeviceToHostCopies). Others (another
// layout or type) are made by torch on the calling thread.
// A tensor standing for `numel` floats on `like`'s device (its shape and type are what staging
// reads): on the meta device for a device, so that its host buffer is pinned without taking
// device memory; on the CPU otherwise.
torch::Tensor FlatLike(int64_t numel, const torch::Tensor& like) {
  bool device = like.defined() && !like.is_cpu();
  return torch::empty({numel}, torch::TensorOptions().dtype(torch::kFloat).device(device ? torch::kMeta : torch::kCPU));
}

class Copier {
 public:
  explicit Copier(SnapshotStaging* staging) : staging_(staging), pending_(std::make_shared<SnapshotCopy>()) {}

  torch::Tensor operator()(const torch::Tensor& t) {
    bytes_ += static_cast<int64_t>(t.numel() * t.element_size());
    if (staging_ == nullptr) return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    bool copied = false;
    torch::Tensor host = staging_->Claim(t, &copied);
    if (copied) return host;
    CopyInto(host, t.detach());
    return host;
  }

  // `numel` floats in host memory holding each part (a tensor, at its element offset), copied as
  // the other tensors are: a ZeRO-1 rank's moments, which AdamW keeps in pieces. Elements no part
  // covers are zeros.
  torch::Tensor Gather(int64_t numel, const std::vector<std::pair<torch::Tensor, int64_t>>& parts) {
    bytes_ += numel * static_cast<int64_t>(sizeof(float));
    torch::Tensor host;
    if (staging_ == nullptr) {
      host = torch::empty({numel}, torch::kFloat);
    } else {
      bool copied = false;
      host = staging_->Claim(FlatLike(numel, parts.empty() ? torch::Tensor() : parts.front().first), &copied);
    }
    int64_t covered = 0;
    for (const auto& [part, at] : parts) covered += part.numel();
    if (covered < numel) host.zero_();
    for (const auto& [part, at] : parts) {
      torch::Tensor source = part.detach().reshape({-1});
      CopyInto(host.narrow(0, at, source.numel()), source);
    }
    return host;
  }

  // `source` into `to` (its shape): left pending where a plain memory copy (or a device's copy to
  // the host) will do, made now otherwise (another layout or type).
  void CopyInto(torch::Tensor to, const torch::Tensor& source) {
    if (source.is_cpu() && source.is_contiguous() && to.is_contiguous() && source.scalar_type() == to.scalar_type() &&
        source.numel() == to.numel()) {
      pending_->Add(static_cast<char*>(to.data_ptr()), static_cast<const char*>(source.data_ptr()),
                    source.numel() * source.element_size(), source);
    } else if (!source.is_cpu() && to.is_cpu() && source.scalar_type() == to.scalar_type() &&
               source.numel() == to.numel()) {
      pending_->AddFromDevice(to, source);
    } else {
      to.copy_(source.reshape(to.sizes()));
    }
  }

  // The copies collected (null when there are none).
  std::shared_ptr<SnapshotCopy> TakePending() {
    if (pending_->empty()) return nullptr;
    pending_->Seal();
    return std::exchange(pending_, std::make_shared<SnapshotCopy>());
  }
  int64_t bytes() const { return bytes_; }

 private:
  SnapshotStaging* staging_;
  int64_t bytes_ = 0;
  std::shared_ptr<SnapshotCopy> pending_;
};

// What Module::save writes — parameters, buffers, then each serialisable child as a nested
// archive — with copies of the tensors, so that loading it is loading a Module::save archive.
void SnapshotModule(const torch::nn::Module& module, torch::serialize::OutputArchive& archive, Copier& copy) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) archive.write(p.key(), copy(p.value()));
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    archive.write(b.key(), copy(b.value()), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive nested(archive.compilation_unit());
    SnapshotModule(*child.value(), nested, copy);
    archive.write(child.key(), nested);
  }
}

// What torch::optim::AdamW::save writes, with copies of the moments. The parameter groups name
// their parameters by the live tensors' identities, as the state keys do, so the archive loads
// into the live optimizer like one it saved itself.
torch::serialize::OutputArchive SnapshotAdamW(const torch::optim::AdamW& optimizer, Copier& copy) {
  // The state's own map type: keyed by std::string in LibTorch 1.x, by the TensorImpl's void* in 2.x.
  std::remove_const_t<std::remove_reference_t<decltype(optimizer.state())>> copies;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    auto copied = std::make_unique<torch::optim::AdamWParamState>();
    copied->step(s.step());
    copied->exp_avg(copy(s.exp_avg()));
    copied->exp_avg_sq(copy(s.exp_avg_sq()));
    if (s.max_exp_avg_sq().defined()) copied->max_exp_avg_sq(copy(s.max_exp_avg_sq()));
    copies[key] = std::move(copied);
  }
  torch::serialize::OutputArchive archive;
  archive.write("pytorch_version", c10::IValue("1.5.0"));
  torch::serialize::OutputArchive state_archive(archive.compilation_unit());
  torch::optim::detail::serialize<torch::optim::AdamWParamState>(state_archive, copies);
  archive.write("state", state_archive);
  torch::serialize::OutputArchive groups(archive.compilation_unit());
  torch::optim::detail::serialize<torch::optim::AdamWOptions>(groups, optimizer.param_groups());
  archive.write("param_groups", groups);
  return archive;
}

}  // namespace

std::vector<torch::Tensor> StagingShapes(Gpt2& model, bool with_moments) {
  std::vector<torch::Tensor> like;
  for (const torch::Tensor& p : model->parameters()) {
    like.push_back(p);
    if (with_moments) like.insert(like.end(), {p, p});
  }
  for (const torch::Tensor& b : model->buffers()) like.push_back(b);
  return like;
}

std::vector<torch::Tensor> ZeroStagingShapes(Gpt2& model, const ZeroAdamW& zero, bool with_model) {
  std::vector<torch::Tensor> like;
  if (with_model) like = StagingShapes(model, /*with_moments=*/false);
  std::vector<torch::Tensor> params = model->parameters();
  torch::Tensor moment = FlatLike(zero.end() - zero.begin(), params.empty() ? torch::Tensor() : params.front());
  like.insert(like.end(), {moment, moment});
  return like;
}

CheckpointArchives LiveArchives(Gpt2& model, torch::optim::Optimizer& optimizer, const TrainState& state) {
  CheckpointArchives a;
  model->save(a.model);
  optimizer.save(a.optimizer);
  SaveRngStates(model, a);
  a.state = state;
  return a;
}

namespace {

bool SameShape(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes().equals(b.sizes()) && a.scalar_type() == b.scalar_type();
}

// An uninitialised host buffer for a copy of `t`: pinned when `t` is on a device, so that the copy
// can run on the device's side stream while training goes on; pageable where pinned memory cannot
// be had (the copy then makes the host wait).
torch::Tensor HostBufferFor(const torch::Tensor& t) {
  torch::TensorOptions options = torch::TensorOptions().dtype(t.scalar_type());
  if (!t.is_cpu()) {
    try {
      return torch::empty(t.sizes(), options.pinned_memory(true));
    } catch (const c10::Error& e) {
      DT_LOG(Warning) << "no pinned host memory for a checkpoint buffer of " << t.numel() * t.element_size()
                      << " bytes (" << e.what_without_backtrace() << "): its copy will make training wait";
    }
  }
  return torch::empty(t.sizes(), options);
}

}  // namespace

void SnapshotStaging::Reserve(const std::vector<torch::Tensor>& like) {
  for (const torch::Tensor& t : like) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool have = false;
      for (Buffer& b : buffers_) {
        if (!b.used && SameShape(b.host, t)) b.used = have = true;  // claimed for this reservation
        if (have) break;
      }
      if (have) continue;
    }
    // Only the shape and type of `t` are read: it may be changing on the training thread.
    torch::Tensor host = HostBufferFor(t).zero_();
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.push_back({host, true});
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Buffer& b : buffers_) b.used = false;
}

void SnapshotStaging::BeginSnapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Buffer& b : buffers_) b.used = false;
}

torch::Tensor SnapshotStaging::Claim(const torch::Tensor& t, bool* copied) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Buffer& b : buffers_) {
    if (!b.used && SameShape(b.host, t)) {
      b.used = true;
      *copied = false;
      return b.host;
    }
  }
  if (t.is_cpu()) {
    buffers_.push_back({t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true), true});
    *copied = true;
  } else {
    buffers_.push_back({HostBufferFor(t), true});  // the caller's copy runs on the device's side stream
    *copied = false;
  }
  return buffers_.back().host;
}

void SnapshotStaging::EndSnapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  buffers_.erase(std::remove_if(buffers_.begin(), buffers_.end(), [](const Buffer& b) { return !b.used; }),
                 buffers_.end());
}

int64_t SnapshotStaging::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const Buffer& b : buffers_) total += static_cast<int64_t>(b.host.numel() * b.host.element_size());
  return total;
}

void SnapshotCopy::Add(char* to, const char* from, size_t size, const torch::Tensor& source) {
  for (size_t at = 0; at < size; at += kPiece) pieces_.push_back({to + at, from + at, std::min(kPiece, size - at)});
  sources_.push_back(source);
}

void SnapshotCopy::AddFromDevice(const torch::Tensor& to, const torch::Tensor& from) {
  if (!device_) device_ = std::make_unique<DeviceToHostCopies>(from.device());
  device_->Add(to, from);
}

void SnapshotCopy::Seal() {
  if (device_) device_->Seal();
}

bool SnapshotCopy::CompleteBeforeUpdate() {
  if (device_) device_->OrderBeforeNextDeviceWork();
  // A GPU's snapshot has no host pieces: nothing to wait for or lock, and no system call on the
  // training thread.
  if (pieces_.empty()) return true;
  bool already = complete();
  CompleteHostPieces();  // at once when nothing is left
  return already;
}

void SnapshotCopy::Work() {
  size_t done = 0;
  for (size_t i; (i = next_.fetch_add(1)) < pieces_.size(); ++done) {
    std::memcpy(pieces_[i].to, pieces_[i].from, pieces_[i].size);
  }
  if (done == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  copied_ += done;
  if (copied_ == pieces_.size()) copied_cv_.notify_all();
}

void SnapshotCopy::Complete() {
  CompleteHostPieces();
  if (device_) device_->Wait();
}

void SnapshotCopy::CompleteHostPieces() {
  size_t taken = std::min(next_.load(), pieces_.size());
  // Counted once: each count opens /sys/devices/system/cpu/online, and that open on the training
  // thread waited in the kernel (synchronize_rcu) for most of a 16.6 ms pause while an H200's
  // round was written.
  static const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  size_t helpers = std::min<size_t>(cores - 1, kMaxHelpers);
  helpers = std::min(helpers, (pieces_.size() - taken) / 2);
  std::vector<std::thread> threads;
  for (size_t h = 0; h < helpers; ++h) {
    try {
      threads.emplace_back([this] { Work(); });
    } catch (const std::system_error&) {
      break;  // no thread to be had (a process limit): those started and this one copy it all
    }
  }
  Work();
  for (auto& th : threads) th.join();
  std::unique_lock<std::mutex> lock(mu_);
  copied_cv_.wait(lock, [this] { return copied_ == pieces_.size(); });
}

bool SnapshotCopy::complete() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copied_ == pieces_.size();
}

absl::StatusOr<CheckpointArchives> SnapshotArchives(Gpt2& model, torch::optim::Optimizer& optimizer,
                                                    const TrainState& state, SnapshotStaging* staging,
                                                    bool defer_copy) {
  const auto* adamw = dynamic_cast<const torch::optim::AdamW*>(&optimizer);
  if (adamw == nullptr) return absl::UnimplementedError("asynchronous checkpoints snapshot AdamW only");
  CheckpointArchives a;
  Copier copy(staging);
  if (staging != nullptr) staging->BeginSnapshot();
  try {
    SnapshotModule(*model, a.model, copy);
    a.optimizer = SnapshotAdamW(*adamw, copy);
    a.pending_copy = copy.TakePending();
    if (a.pending_copy && !defer_copy) std::exchange(a.pending_copy, nullptr)->Complete();
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot copy the training state for a checkpoint: ", ExceptionText(e)));
  }
  if (staging != nullptr) staging->EndSnapshot();
  a.tensor_bytes = copy.bytes();
  SaveRngStates(model, a);
  a.state = state;
  return a;
}

FileWriteMode CheckpointWriteMode(const torch::Device& device) {
  return device.is_cuda() ? FileWriteMode::kWriteBehind : FileWriteMode::kDirect;
}

absl::StatusOr<v1::Manifest> WriteArchives(const std::string& dir, CheckpointArchives& archives,
                                           FileWriteMode write_mode) {
  if (archives.pending_copy) archives.pending_copy->Complete();
  // The large files are serialised straight to disk (no in-memory copy) and hashed on the way,
  // model and optimizer on two threads.
  auto save_archive = [&](const std::string& name,
                          torch::serialize::OutputArchive& archive) -> absl::StatusOr<v1::ManifestFile> {
    std::string path = JoinPath(dir, name);
    HashingFileWriter writer(path, write_mode);
    try {
      archive.save_to([&writer](const void* data, size_t n) { return writer.Write(data, n); });
    } catch (const std::exception& e) {
      absl::StatusOr<v1::ManifestFile> first = writer.Finish(name);  // a write error explains it better
      if (!first.ok()) return first.status();
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", ExceptionText(e)));
    }
    return writer.Finish(name);
  };
  torch::serialize::OutputArchive moments;
  if (!archives.moments_file.empty()) moments = MomentsArchive(archives.moments);
  torch::serialize::OutputArchive& optimizer = archives.moments_file.empty() ? archives.optimizer : moments;
  const std::string optimizer_name = archives.moments_file.empty() ? "optimizer.pt" : archives.moments_file;
  absl::StatusOr<v1::ManifestFile> model_file = absl::UnknownError("not written");
  std::thread model_writer;
  if (archives.model_files) model_writer = std::thread([&] { model_file = save_archive("model.pt", archives.model); });
  absl::StatusOr<v1::ManifestFile> optimizer_file = save_archive(optimizer_name, optimizer);
  if (model_writer.joinable()) model_writer.join();
  if (archives.model_files && !model_file.ok()) return model_file.status();
  if (!optimizer_file.ok()) return optimizer_file.status();
  v1::Manifest manifest;
  if (archives.model_files) *manifest.add_files() = *model_file;
  *manifest.add_files() = *optimizer_file;
  if (!archives.model_files) {
    if (absl::Status st = FsyncDir(dir); !st.ok()) return st;
    return manifest;
  }
  try {
    torch::serialize::OutputArchive a;
    a.write("cpu", archives.rng);
    if (archives.device_rng.defined()) a.write("device", archives.device_rng);
    absl::StatusOr<v1::ManifestFile> f = WriteHashed(dir, "rng.pt", ArchiveBytes(a));
    if (!f.ok()) return f.status();
    *manifest.add_files() = *f;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot serialise the RNG state: ", ExceptionText(e)));
  }
  const TrainState& state = archives.state;
  nlohmann::json s = {{"step", state.step},
                      {"epoch", state.epoch},
                      {"batch", state.batch},
                      {"tokens_seen", state.tokens_seen},
                      {"samples_seen", state.samples_seen},
                      {"world_size", state.world_size},
                      {"batch_size", state.batch_size},
                      {"grad_accum", state.grad_accum},
                      {"epoch_samples", state.epoch_samples},
                      {"seed", state.seed},
                      {"model_config", state.model_config}};
  absl::StatusOr<v1::ManifestFile> state_file = WriteHashed(dir, "state.json", s.dump(2) + "\n");
  if (!state_file.ok()) return state_file.status();
  *manifest.add_files() = *state_file;
  if (absl::Status st = FsyncDir(dir); !st.ok()) return st;
  return manifest;
}

absl::StatusOr<CheckpointArchives> ZeroShardArchives(Gpt2& model, const ZeroAdamW& zero, const TrainState& state,
                                                     bool with_model, SnapshotStaging* staging) {
  CheckpointArchives a;
  a.model_files = with_model;
  a.moments_file = ZeroMomentsFileName(zero.rank(), zero.world());
  a.moments.begin = zero.begin();
  a.moments.end = zero.end();
  a.moments.numel = zero.numel();
  a.moments.step = zero.step();
  std::vector<std::pair<torch::Tensor, int64_t>> exp_avg, exp_avg_sq;
  for (const ZeroAdamW::MomentPart& part : zero.MomentParts()) {
    exp_avg.emplace_back(part.exp_avg, part.at);
    exp_avg_sq.emplace_back(part.exp_avg_sq, part.at);
  }
  Copier copy(staging);
  if (staging != nullptr) staging->BeginSnapshot();
  try {
    a.moments.exp_avg = copy.Gather(zero.end() - zero.begin(), exp_avg);
    a.moments.exp_avg_sq = copy.Gather(zero.end() - zero.begin(), exp_avg_sq);
    if (with_model) SnapshotModule(*model, a.model, copy);
    a.pending_copy = copy.TakePending();
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot copy the training state for a checkpoint: ", ExceptionText(e)));
  }
  if (staging != nullptr) staging->EndSnapshot();
  a.tensor_bytes = copy.bytes();
  if (with_model) SaveRngStates(model, a);
  a.state = state;
  return a;
}

absl::StatusOr<v1::Manifest> WriteCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                             const TrainState& state) {
  CheckpointArchives live = LiveArchives(model, optimizer, state);
  return WriteArchives(dir, live);
}

namespace {

// LoadCheckpoint's body; without an optimizer, optimizer.pt (or the moments files) is not read.
absl::StatusOr<TrainState> LoadCheckpointInto(const std::string& dir, Gpt2& model, torch::optim::Optimizer* optimizer,
                                              torch::Device device);

// Elements [begin, end) from the checkpoint's ZeRO-1 moments files: only the files whose range
// overlaps are read and verified (a file's name says its rank and world size), and one more for
// the step when none does.
absl::StatusOr<FlatMoments> ReadZeroMomentsFiles(const CheckpointFiles& files, const std::string& dir, int64_t numel,
                                                 int64_t begin, int64_t end) {
  std::vector<std::string> names;
  for (const std::string& name : files.names()) {
    if (IsZeroMomentsFileName(name)) names.push_back(name);
  }
  if (names.empty()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", dir, " holds neither optimizer.pt nor ZeRO-1 moments files"));
  }
  std::sort(names.begin(), names.end());
  std::vector<FlatMoments> parts;
  for (const std::string& name : names) {
    int rank = -1, world = 0;
    if (std::sscanf(name.c_str(), "optimizer-zero1-rank%d-of-%d.pt", &rank, &world) != 2 || world <= 0 || rank < 0 ||
        rank >= world) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, " holds ", name, ", which names no rank of a world"));
    }
    auto [b, e] = ZeroRange(numel, rank, world);
    bool overlaps = std::max(b, begin) < std::min(e, end);
    if (!overlaps && !(parts.empty() && &name == &names.back())) continue;
    if (absl::Status verified = files.Verify(name); !verified.ok()) return verified;
    absl::StatusOr<FlatMoments> part = ReadMomentsFile(JoinPath(dir, name));
    if (!part.ok()) return part.status();
    if (part->numel != numel) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", dir, "'s optimizer moments describe ",
                                                        part->numel, " parameters; this model has ", numel));
    }
    parts.push_back(std::move(*part));
  }
  // A rank whose range is empty gets the step alone (Regather of nothing to cover).
  return Regather(parts, begin, end);
}

}  // namespace

absl::StatusOr<FlatMoments> LoadZeroMoments(const std::string& dir, const std::vector<torch::Tensor>& params,
                                            int64_t begin, int64_t end, const AdamWSettings& settings,
                                            torch::Device device) {
  absl::StatusOr<CheckpointFiles> files = CheckpointFiles::Open(dir);
  if (!files.ok()) return files.status();
  std::string whole = JoinPath(dir, "optimizer.pt");
  if (!std::filesystem::exists(whole)) return ReadZeroMomentsFiles(*files, dir, TotalElements(params), begin, end);
  if (absl::Status verified = files->Verify("optimizer.pt"); !verified.ok()) return verified;
  // Written by a run without --zero: loaded whole (for this while, the full moments' memory), then cut.
  std::unique_ptr<torch::optim::AdamW> adamw = MakeAdamW(params, settings);
  try {
    torch::serialize::InputArchive a;
    a.load_from(whole, device);
    if (absl::Status loadable = LoadableOptimizerArchive(a, dir); !loadable.ok()) return loadable;
    adamw->load(a);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("cannot load ", whole, ": ", ExceptionText(e)));
  }
  return Regather({MomentsOfAdamW(*adamw, params)}, begin, end);
}

absl::StatusOr<TrainState> LoadCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                          torch::Device device) {
  return LoadCheckpointInto(dir, model, &optimizer, device);
}

absl::StatusOr<TrainState> LoadModelCheckpoint(const std::string& dir, Gpt2& model, torch::Device device) {
  return LoadCheckpointInto(dir, model, nullptr, device);
}

namespace {

absl::StatusOr<TrainState> LoadCheckpointInto(const std::string& dir, Gpt2& model, torch::optim::Optimizer* optimizer,
                                              torch::Device device) {
  // Every file found at its size; the ones this rank reads are verified as it reads them.
  absl::StatusOr<CheckpointFiles> files = CheckpointFiles::Open(dir);
  if (!files.ok()) return files.status();
  for (const char* name : {"state.json", "model.pt", "rng.pt"}) {
    if (absl::Status verified = files->Verify(name); !verified.ok()) return verified;
  }
  absl::StatusOr<std::string> text = ReadFile(JoinPath(dir, "state.json"));
  if (!text.ok()) return text.status();
  nlohmann::json s = nlohmann::json::parse(*text, nullptr, false);
  if (s.is_discarded()) return absl::DataLossError(absl::StrCat(dir, "/state.json is malformed"));
  TrainState state;
  state.step = s.value("step", int64_t{0});
  state.epoch = s.value("epoch", int64_t{0});
  state.batch = s.value("batch", int64_t{0});
  state.tokens_seen = s.value("tokens_seen", int64_t{0});
  state.samples_seen = s.value("samples_seen", int64_t{0});
  state.world_size = s.value("world_size", 0);
  state.batch_size = s.value("batch_size", 0);
  state.grad_accum = s.value("grad_accum", 1);
  state.epoch_samples = s.value("epoch_samples", int64_t{0});
  state.seed = s.value("seed", uint64_t{0});
  state.model_config = s.value("model_config", std::string());
  std::string mine = DescribeConfig(model->config());
  if (state.model_config != mine) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", dir, " holds a model with ", state.model_config,
                                                      " but this run builds ", mine,
                                                      "; use the same --model/--config-overrides"));
  }
  try {
    {
      torch::serialize::InputArchive a;
      a.load_from(JoinPath(dir, "model.pt"), device);
      model->load(a);
    }
    if (optimizer != nullptr && !std::filesystem::exists(JoinPath(dir, "optimizer.pt"))) {
      // Written with --zero 1: every rank's moments regathered into this unpartitioned AdamW.
      auto* adamw = dynamic_cast<torch::optim::AdamW*>(optimizer);
      if (adamw == nullptr) return absl::UnimplementedError("ZeRO-1 checkpoints load into AdamW only");
      std::vector<torch::Tensor> params = model->parameters();
      const int64_t numel = TotalElements(params);
      absl::StatusOr<FlatMoments> all = ReadZeroMomentsFiles(*files, dir, numel, 0, numel);
      if (!all.ok()) return all.status();
      if (absl::Status s = SetAdamWMoments(*adamw, params, *all); !s.ok()) return s;
    } else if (optimizer != nullptr) {
      if (absl::Status verified = files->Verify("optimizer.pt"); !verified.ok()) return verified;
      torch::serialize::InputArchive a;
      a.load_from(JoinPath(dir, "optimizer.pt"), device);  // moments live beside their parameters
      if (absl::Status loadable = LoadableOptimizerArchive(a, dir); !loadable.ok()) return loadable;
      optimizer->load(a);
    }
    {
      torch::serialize::InputArchive a;
      a.load_from(JoinPath(dir, "rng.pt"));
      torch::Tensor rng;
      a.read("cpu", rng);
      RestoreRngState(at::detail::getDefaultCPUGenerator(), rng);
      // A checkpoint written on another kind of device has no state for this one's generator,
      // which then keeps its seeded state.
      torch::Tensor device_rng;
      if (!device.is_cpu() && a.try_read("device", device_rng)) {
        RestoreRngState(at::globalContext().defaultGenerator(device), device_rng);
      }
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("cannot load checkpoint ", dir, ": ", ExceptionText(e)));
  }
  return state;
}

}  // namespace

namespace {

// Module::save nests one archive per submodule: walk them in step.
absl::Status CompareArchives(torch::serialize::InputArchive& a, torch::serialize::InputArchive& b,
                             const std::string& prefix, std::vector<std::pair<std::string, double>>* out) {
  for (const std::string& key : a.keys()) {
    c10::IValue va;
    if (!a.try_read(key, va)) continue;
    if (va.isTensor()) {
      c10::IValue vb;
      if (!b.try_read(key, vb) || !vb.isTensor()) {
        return absl::FailedPreconditionError(absl::StrCat("the second checkpoint lacks ", prefix, key));
      }
      torch::Tensor ta = va.toTensor(), tb = vb.toTensor();
      if (!ta.sizes().equals(tb.sizes())) {
        return absl::FailedPreconditionError(absl::StrCat(prefix, key, " has different shapes"));
      }
      out->emplace_back(prefix + key, ta.numel() == 0 ? 0.0 : (ta - tb).abs().max().item<double>());
      continue;
    }
    torch::serialize::InputArchive sa, sb;
    if (a.try_read(key, sa)) {
      if (!b.try_read(key, sb)) {
        return absl::FailedPreconditionError(absl::StrCat("the second checkpoint lacks ", prefix, key));
      }
      if (absl::Status s = CompareArchives(sa, sb, prefix + key + ".", out); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, double>>> CompareModels(const std::string& dir_a,
                                                                          const std::string& dir_b) {
  for (const std::string& dir : {dir_a, dir_b}) {
    struct stat st;
    if (::stat(JoinPath(dir, "model.pt").c_str(), &st) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, " is not a checkpoint directory (no model.pt): give two <exp dir>/checkpoints/step-N directories"));
    }
  }
  try {
    torch::serialize::InputArchive a, b;
    a.load_from(JoinPath(dir_a, "model.pt"));
    b.load_from(JoinPath(dir_b, "model.pt"));
    std::vector<std::pair<std::string, double>> out;
    if (absl::Status s = CompareArchives(a, b, "", &out); !s.ok()) return s;
    return out;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot compare checkpoints: ", ExceptionText(e)));
  }
}

}  // namespace dt
