#include "trainer/checkpoint_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/crypto.h"
#include "common/fs.h"

namespace dt {
namespace {

// A checkpoint file written through one descriptor, hashed as it is written (no second pass).
// It never fails a write towards its caller — torch's archive writer throws from a destructor
// when a write comes up short, which ends the process (SIGABRT) — but keeps the first error,
// which Finish() returns: "no space left on device" with the path, RESOURCE_EXHAUSTED.
class HashingFileWriter {
 public:
  explicit HashingFileWriter(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) error_ = ErrnoStatus("create", path_, errno);
  }
  ~HashingFileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;

  size_t Write(const void* data, size_t n) {
    if (!error_.ok()) return n;
    hash_.Update(data, n);
    if (int err = WriteFully(fd_, data, n); err != 0) {
      Fail(err);
      return n;
    }
    bytes_ += static_cast<int64_t>(n);
    return n;
  }

  // fsyncs and describes the file for the manifest, or returns the first error.
  absl::StatusOr<v1::ManifestFile> Finish(const std::string& name) {
    if (error_.ok() && ::fsync(fd_) != 0) Fail(errno);
    if (!error_.ok()) return error_;
    v1::ManifestFile f;
    f.set_name(name);
    f.set_size(bytes_);
    f.set_sha256(hash_.HexDigest());
    return f;
  }

 private:
  void Fail(int err) {
    if (err == ENOSPC || err == EDQUOT) {
      error_ = absl::ResourceExhaustedError(
          absl::StrCat("no space left on device writing ", path_, " (", bytes_,
                       " bytes written): free space there, or keep fewer checkpoints (--keep-checkpoints)"));
    } else {
      error_ = ErrnoStatus("write", path_, err);
    }
  }

  std::string path_;
  int fd_ = -1;
  absl::Status error_;
  Sha256 hash_;
  int64_t bytes_ = 0;
};

// Writes `data` to dir/name, hashing as it goes, fsyncs, and describes it for the manifest.
absl::StatusOr<v1::ManifestFile> WriteHashed(const std::string& dir, const std::string& name, const std::string& data) {
  HashingFileWriter writer(JoinPath(dir, name));
  writer.Write(data.data(), data.size());
  return writer.Finish(name);
}

std::string ArchiveBytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace

std::string DescribeConfig(const Gpt2Config& c) {
  return absl::StrCat("vocab_size=", c.vocab_size, ",n_positions=", c.n_positions, ",n_embd=", c.n_embd,
                      ",n_layer=", c.n_layer, ",n_head=", c.n_head);
}

absl::StatusOr<v1::Manifest> WriteCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                             const TrainState& state) {
  // The large files are serialised straight to disk (no in-memory copy) and hashed on the way,
  // model and optimizer on two threads.
  auto save_archive =
      [&](const std::string& name,
          const std::function<void(torch::serialize::OutputArchive&)>& fill) -> absl::StatusOr<v1::ManifestFile> {
    std::string path = JoinPath(dir, name);
    HashingFileWriter writer(path);
    try {
      torch::serialize::OutputArchive a;
      fill(a);
      a.save_to([&writer](const void* data, size_t n) { return writer.Write(data, n); });
    } catch (const std::exception& e) {
      absl::StatusOr<v1::ManifestFile> first = writer.Finish(name);  // a write error explains it better
      if (!first.ok()) return first.status();
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", e.what()));
    }
    return writer.Finish(name);
  };
  absl::StatusOr<v1::ManifestFile> model_file = absl::UnknownError("not written");
  std::thread model_writer([&] { model_file = save_archive("model.pt", [&](auto& a) { model->save(a); }); });
  absl::StatusOr<v1::ManifestFile> optimizer_file = save_archive("optimizer.pt", [&](auto& a) { optimizer.save(a); });
  model_writer.join();
  if (!model_file.ok()) return model_file.status();
  if (!optimizer_file.ok()) return optimizer_file.status();
  v1::Manifest manifest;
  *manifest.add_files() = *model_file;
  *manifest.add_files() = *optimizer_file;
  try {
    torch::serialize::OutputArchive a;
    auto gen = at::detail::getDefaultCPUGenerator();
    torch::Tensor rng;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    a.write("cpu", rng);
    absl::StatusOr<v1::ManifestFile> f = WriteHashed(dir, "rng.pt", ArchiveBytes(a));
    if (!f.ok()) return f.status();
    *manifest.add_files() = *f;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot serialise the RNG state: ", e.what()));
  }
  nlohmann::json s = {{"step", state.step},
                      {"epoch", state.epoch},
                      {"batch", state.batch},
                      {"tokens_seen", state.tokens_seen},
                      {"samples_seen", state.samples_seen},
                      {"world_size", state.world_size},
                      {"batch_size", state.batch_size},
                      {"grad_accum", state.grad_accum},
                      {"seed", state.seed},
                      {"model_config", state.model_config}};
  absl::StatusOr<v1::ManifestFile> state_file = WriteHashed(dir, "state.json", s.dump(2) + "\n");
  if (!state_file.ok()) return state_file.status();
  *manifest.add_files() = *state_file;
  if (absl::Status st = FsyncDir(dir); !st.ok()) return st;
  return manifest;
}

absl::Status VerifyCheckpointFiles(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(JoinPath(dir, "manifest.json"));
  if (!text.ok()) return absl::DataLossError(absl::StrCat("checkpoint ", dir, " has no manifest.json"));
  nlohmann::json m = nlohmann::json::parse(*text, nullptr, false);
  if (m.is_discarded() || !m.contains("files")) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": manifest.json is malformed"));
  }
  for (const auto& f : m["files"]) {
    std::string path = JoinPath(dir, f.value("name", ""));
    absl::StatusOr<std::string> digest = Sha256File(path);
    if (!digest.ok()) return absl::DataLossError(digest.status().message());
    if (*digest != f.value("sha256", "")) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " does not match its manifest (SHA-256 ",
                                              *digest, "); the checkpoint is corrupt"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainState> LoadCheckpoint(const std::string& dir, Gpt2& model, torch::optim::Optimizer& optimizer,
                                          torch::Device device) {
  if (absl::Status s = VerifyCheckpointFiles(dir); !s.ok()) return s;
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
    {
      torch::serialize::InputArchive a;
      a.load_from(JoinPath(dir, "optimizer.pt"), device);  // moments live beside their parameters
      optimizer.load(a);
    }
    {
      torch::serialize::InputArchive a;
      a.load_from(JoinPath(dir, "rng.pt"));
      torch::Tensor rng;
      a.read("cpu", rng);
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng);
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("cannot load checkpoint ", dir, ": ", e.what()));
  }
  return state;
}

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
  try {
    torch::serialize::InputArchive a, b;
    a.load_from(JoinPath(dir_a, "model.pt"));
    b.load_from(JoinPath(dir_b, "model.pt"));
    std::vector<std::pair<std::string, double>> out;
    if (absl::Status s = CompareArchives(a, b, "", &out); !s.ok()) return s;
    return out;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot compare checkpoints: ", e.what()));
  }
}

}  // namespace dt
