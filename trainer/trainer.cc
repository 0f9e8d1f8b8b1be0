#include "trainer/trainer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <ATen/record_function.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/agent.h"
#include "client/coordinator_store.h"
#include "client/join_run.h"
#include "client/metrics_reporter.h"
#include "common/blas_core.h"
#include "common/collective_ring.h"
#include "common/env.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/process_tree.h"
#include "common/stack_capture.h"
#include "common/stop_signals.h"
#include "common/version.h"
#include "trainer/autocast.h"
#include "trainer/checkpoint_io.h"
#include "trainer/checkpoint_rounds.h"
#include "trainer/ddp.h"
#include "trainer/device_copy.h"
#include "trainer/device_preflight.h"
#include "trainer/gpt2_model.h"
#include "trainer/gpt2_tokenizer.h"
#include "trainer/lr_schedule.h"
#include "trainer/process_group.h"
#include "trainer/sampler.h"
#include "trainer/step_profiler.h"
#include "trainer/token_cache.h"
#include "trainer/zero_optimizer.h"

namespace dt {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitStopped = 3;

// A failure inside a collective or the store: often the echo of another rank's death, so the
// trainer first gives the coordinator a chance to name the real cause.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Configuration problems found after registration: reported as fatal (a restart would meet
// them again), exit code 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The checkpoint to resume from does not match what its writer recorded: reported as fatal (every
// restart would load the same bytes).
class CorruptCheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The checkpoint file system is full: reported as fatal, so the run stops instead of spending
// its restarts on the same full disk. `latest` still names the last complete checkpoint.
class StorageFullError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename F>
auto Collective(const char* what, F fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    throw CollectiveError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw CollectiveError(absl::StrCat(what, ": ", e.what()));
  }
}

// Issues a collective (`issue` returns its Work) and waits for it, recorded in the process's
// CollectiveRing so a hang's verdict can say who waits in which collective.
template <typename F>
void RecordedWait(const char* op, int64_t bytes, F issue) {
  uint64_t sequence = CollectiveRing::Process().Begin(op, bytes);
  issue()->wait();
  CollectiveRing::Process().End(sequence);
}

// For the tests of hang capture: DT_TEST_HANG_AT_STEP=S and DT_TEST_HANG_RANK=R make rank R block
// at the start of step S, inside this frame, until it is killed (the other ranks then wait for it
// in the step's gradient all-reduce). Kept out of line so the frame shows in its stack.
struct HangForTests {
  int64_t step = -1;
  int rank = -1;
};
HangForTests HangForTestsFromEnvironment() {
  HangForTests h;
  const char* step = std::getenv("DT_TEST_HANG_AT_STEP");
  const char* rank = std::getenv("DT_TEST_HANG_RANK");
  if (step != nullptr && rank != nullptr && absl::SimpleAtoi(step, &h.step) && absl::SimpleAtoi(rank, &h.rank)) {
    return h;
  }
  return {};
}
[[gnu::noinline]] void HangInsideStepForTests(int64_t step) {
  DT_LOG(Warning) << "DT_TEST_HANG_AT_STEP: blocking at the start of step " << step << " (a test's hang)";
  while (true) absl::SleepFor(absl::Hours(1));
}

// Throws (for RunTrainer to report) when `s` is an error.
void CheckOk(const absl::Status& s) {
  if (!s.ok()) throw std::runtime_error(s.ToString());
}

int64_t RssBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return resident * ::sysconf(_SC_PAGESIZE);
}

// The most this process has held resident so far (what decides whether a rank fits its node).
int64_t PeakRssBytes() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // kilobytes on Linux
}

// Tokens of samples [first, first + count) shaped [count, seq_len + 1].
torch::Tensor Gather(const TokenCache& tokens, const std::vector<int64_t>& samples, int seq_len) {
  torch::Tensor out = torch::empty({static_cast<int64_t>(samples.size()), seq_len + 1}, torch::kLong);
  int64_t* dst = out.data_ptr<int64_t>();
  for (size_t i = 0; i < samples.size(); ++i) {
    const uint16_t* src = tokens.data() + samples[i] * seq_len;
    for (int t = 0; t <= seq_len; ++t) *dst++ = src[t];
  }
  return out;
}

// Sends stdout and stderr to <dir>/rank-<R>.log now that the rank is known (schedulers name
// output by task, not by rank). Appends: a restarted generation continues the same file.
void RedirectOutput(const std::string& dir, const v1::RegisterResponse& a) {
  std::string path = JoinPath(dir, absl::StrCat("rank-", a.rank(), ".log"));
  if (absl::Status s = MakeDirs(dir); !s.ok()) {
    DT_LOG(Warning) << "not logging to " << path << ": " << s.message();
    return;
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    DT_LOG(Warning) << "not logging to " << path << ": " << std::strerror(errno);
    return;
  }
  DT_LOG(Info) << "output of rank " << a.rank() << " goes to " << path;
  std::cout.flush();
  ::dup2(fd, STDOUT_FILENO);
  ::dup2(fd, STDERR_FILENO);
  ::close(fd);
  DT_LOG(Info) << "=== run " << a.run_id() << " generation " << a.generation() << ": rank " << a.rank() << " of "
               << a.world_size() << ", pid " << ::getpid() << " on " << HostName() << " ===";
}

// One generation of training on this rank: the sections of the work are the methods, in the order
// Run calls them.
class Trainer {
 public:
  Trainer(const TrainerConfig& cfg, Agent& agent, std::unique_ptr<MetricsReporter>& reporter,
          std::atomic<int64_t>& current_step)
      : cfg_(cfg), agent_(agent), reporter_(reporter), current_step_(current_step) {}
  // A round still in flight (the loop ended by an exception) may wait for a point that will not
  // come: it is told, and its thread ends before the members it uses.
  ~Trainer() {
    {
      std::lock_guard<std::mutex> lock(points_mu_);
      points_abandoned_ = true;
    }
    points_made_.notify_all();
    rounds_.reset();
  }

  // The process's exit code; throws CollectiveError, ConfigError, StorageFullError or any other
  // exception for RunTrainer to report.
  int Run() {
    const v1::RegisterResponse& a = agent_.assignment();
    rank_ = a.rank();
    world_ = a.world_size();
    grad_accum_ = cfg_.grad_accum;
    precision_ = ParsePrecision(cfg_.precision).value_or(Precision::kFp32);  // main.cc refused others
    if (cfg_.global_batch_size > 0) {
      absl::StatusOr<int> micro_steps = MicroStepsForGlobalBatch(cfg_.global_batch_size, cfg_.batch_size, world_);
      if (!micro_steps.ok()) throw ConfigError(std::string(micro_steps.status().message()));
      grad_accum_ = *micro_steps;
    }
    exp_dir_ = a.exp_dir();
    threads_ = cfg_.threads > 0 ? cfg_.threads : std::max(1, EnvInt("OMP_NUM_THREADS", 1));
    torch::set_num_threads(threads_);
    CreateProcessGroup();
    if (!DevicePreflightPassed()) return kExitStopped;
    PrepareData();
    BuildModel();
    Resume();
    if (cfg_.zero == 1) StartZero();
    StartDataParallel();
    agent_.ReportProgress(state_.step, total_steps_);
    current_step_ = state_.step;
    last_checkpoint_ = checkpoint_started_ = state_.step;
    points_through_ = state_.step;  // a resumed run's history holds its points to here
    late_points_ = device_.is_cuda() || cfg_.late_step_points;
    rounds_ = std::make_unique<CheckpointRounds>(agent_, cfg_.async_checkpoint, cfg_.exit_while_checkpointing,
                                                 cfg_.checkpoint_io.value_or(CheckpointWriteMode(device_)));
    // Every point up to a round's step is stored before this rank commits the round, so a
    // checkpoint at S means the history holds every step to S: a rank killed later resumes from S
    // and logs only what comes after it again (a failed delivery is said, and the round goes on).
    // An asynchronous round delivers on its own thread: the training loop does not wait for it.
    // The step's own point may still be held (HeldPoint): on the loop's thread (a synchronous round,
    // or one written at once for want of host memory) it is made here; on the round's thread it is
    // waited for (the loop makes it as soon as the round has begun).
    loop_thread_ = std::this_thread::get_id();
    rounds_->SetBeforeCommit([this](int64_t step) {
      if (!reporter_) return;
      if (std::this_thread::get_id() == loop_thread_) {
        ReportHeldPoint();
      } else if (!AwaitPointsThrough(step)) {
        DT_LOG(Warning) << "the metrics point of step " << step << " was not made: the training loop ended first";
      }
      if (absl::Status s = reporter_->Flush(absl::Seconds(10)); !s.ok()) {
        DT_LOG(Warning) << "metrics up to step " << step << " not confirmed before its checkpoint: " << s.message();
      }
    });
    if (zero_) {
      rounds_->PrepareStaging(ZeroStagingShapes(model_, *zero_, /*with_model=*/rank_ == 0));
    } else if (rank_ == 0) {
      rounds_->PrepareStaging(StagingShapes(model_));
    }
    model_->train();
    cpu_at_log_ = ProcessCpuSeconds();
    step_at_log_ = state_.step;
    StepProfiler profiler(rank_ == 0 ? cfg_.profile_trace : "", cfg_.profile_first_step, cfg_.profile_steps,
                          device_.is_cuda());
    while (state_.step < total_steps_) {
      if (absl::Status tracing = profiler.BeforeStep(state_.step + 1); !tracing.ok()) {
        DT_LOG(Warning) << tracing.message();
      }
      TrainStep();
      if (absl::StatusOr<bool> traced = profiler.AfterStep(state_.step); !traced.ok()) {
        DT_LOG(Warning) << traced.status().message();
      } else if (*traced) {
        DT_LOG(Info) << "wrote the trace of steps " << cfg_.profile_first_step << " to " << state_.step << " to "
                     << cfg_.profile_trace;
      }
      if (state_.step < total_steps_ && PreemptionAgreed()) return LeaveForPreemption();
      if (cfg_.exit_after_step > 0 && state_.step == cfg_.exit_after_step) {
        ReportHeldPoint();
        CollectCheckpoint(rounds_->Wait());
        DT_LOG(Warning) << "--exit-after-step " << state_.step << ": vanishing without cleanup (fault injection)";
        std::_Exit(137);
      }
      if (StopsAfterThisStep()) {
        ReportHeldPoint();
        CollectCheckpoint(rounds_->Wait());
        DT_LOG(Warning) << "--stop-after-step " << state_.step << ": stopping this process (fault injection)";
        ::raise(SIGSTOP);
      }
    }
    return Finish();
  }

  // Ends the process group's communicators (process_group.h) before the process exits.
  void CloseProcessGroup(bool clean) {
    if (group_) dt::CloseProcessGroup(*group_, clean);
  }

 private:
  // --stop-after-step names this step for this process's node (or for every node).
  bool StopsAfterThisStep() const {
    for (size_t i = 0; i < cfg_.stop_after_steps.size(); ++i) {
      bool this_node = cfg_.stop_nodes.empty() || cfg_.stop_nodes[i] == cfg_.node;
      if (cfg_.stop_after_steps[i] > 0 && cfg_.stop_after_steps[i] == state_.step && this_node) return true;
    }
    return false;
  }

  void Log(const std::string& line) {
    if (rank_ == 0) std::cout << line << std::endl;
  }

  // The process group, through the coordinator's store (no MASTER_ADDR/PORT).
  void CreateProcessGroup() {
    const v1::RegisterResponse& a = agent_.assignment();
    absl::StatusOr<std::string> backend = ResolveBackend(cfg_.backend);
    if (!backend.ok()) throw ConfigError(std::string(backend.status().message()));
    // NCCL works on GPU tensors: one device per rank, the local rank's.
    if (*backend == "nccl") device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(a.local_rank()));
    absl::StatusOr<std::unique_ptr<StoreSession>> session = agent_.OpenStore();
    if (!session.ok())
      throw CollectiveError(absl::StrCat("cannot open the coordinator store: ", session.status().ToString()));
    auto store = c10::make_intrusive<CoordinatorStore>(std::move(*session),
                                                       std::chrono::milliseconds(a.timeouts().store_timeout_ms()));
    if (std::unique_ptr<StoreCombiner> combiner = agent_.OpenStoreCombiner()) store->CombineWith(std::move(combiner));
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("pg.", backend.value()), store);
    absl::Time start = absl::Now();
    absl::StatusOr<c10::intrusive_ptr<CommGroup>> pg;
    {
      // The group's keys are each written once under its prefix: a wait may fetch the value.
      CoordinatorStore::AddressExchange exchange(*store);
      pg = dt::CreateProcessGroup(*backend, prefixed, rank_, world_, a.local_rank(),
                                  std::chrono::milliseconds(a.timeouts().collective_timeout_ms()));
    }
    if (!pg.ok()) throw CollectiveError(std::string(pg.status().message()));
    group_ = *pg;
    DT_LOG(Info) << "rank " << rank_ << "/" << world_ << " (node " << a.node_rank() << ", local " << a.local_rank()
                 << ", generation " << a.generation() << "): " << *backend << " process group ready in "
                 << absl::FormatDuration(absl::Now() - start);
  }

  // Before the first step: times this rank's device and the group (RunDevicePreflight) and tells
  // the coordinator, which compares the ranks. False when the generation ended over a pre-flight
  // (this rank's device or another's): this process leaves, the run restarts without the node.
  bool DevicePreflightPassed() {
    v1::DevicePreflight result =
        Collective("device pre-flight all-reduce", [&] { return RunDevicePreflight(*group_, device_); });
    if (result.error().empty()) {
      std::string blas = device_.is_cpu() ? OpenBlasPickedCore() : "";
      DT_LOG(Info) << absl::StrFormat(
          "device pre-flight on %s: matrix multiply (order %d) %.1f ms, all-reduce %.1f ms%s", result.device(),
          result.matmul_size(), result.matmul_seconds() * 1e3, result.allreduce_seconds() * 1e3,
          blas.empty() ? "" : absl::StrCat(" (OpenBLAS ", blas, " kernels)"));
    } else {
      DT_LOG(Error) << "device pre-flight on " << result.device() << " failed: " << result.error();
    }
    absl::StatusOr<v1::ReportPreflightResponse> reply = agent_.ReportPreflight(result);
    if (!reply.ok()) {
      // The generation may have ended for another reason; the heartbeat says so.
      DT_LOG(Warning) << "could not report the device pre-flight: " << reply.status();
    } else if (!reply->unhealthy().empty()) {
      DT_LOG(Error) << "stopping: " << reply->unhealthy();
      agent_.StopHeartbeats();
      return false;
    }
    if (!result.error().empty()) throw std::runtime_error("device pre-flight: " + result.error());
    return true;
  }

  // Data, rank 0 first: rank 0 tokenizes into a cache file every rank then memory-maps. The cache
  // sits beside the experiment directories, so other experiments on the same dataset and
  // tokenizer skip the work (its name covers both).
  void PrepareData() {
    absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> tokenizer = Gpt2Tokenizer::Load(cfg_.tokenizer_dir);
    if (!tokenizer.ok()) throw ConfigError(std::string(tokenizer.status().message()));
    tokenizer_ = std::move(*tokenizer);
    absl::StatusOr<std::string> cache_name = TokenCacheName(cfg_.dataset, tokenizer_->fingerprint());
    if (!cache_name.ok()) throw ConfigError(std::string(cache_name.status().message()));
    std::string data_dir = cfg_.data_cache_dir.empty() ? JoinPath(Dirname(exp_dir_), ".dt-cache") : cfg_.data_cache_dir;
    std::string cache_path = JoinPath(data_dir, *cache_name);
    if (rank_ == 0 && !std::filesystem::exists(cache_path)) {
      if (absl::Status made = MakeDirs(data_dir); !made.ok()) throw ConfigError(std::string(made.message()));
      absl::Time t0 = absl::Now();
      absl::Status built = BuildTokenCache(cfg_.dataset, *tokenizer_, cache_path);
      if (!built.ok()) throw ConfigError(std::string(built.message()));
      DT_LOG(Info) << "tokenized " << cfg_.dataset << " into " << cache_path << " in "
                   << absl::FormatDuration(absl::Now() - t0);
    }
    absl::Status ready =
        agent_.Barrier("dt.data-ready", absl::Milliseconds(agent_.assignment().timeouts().init_timeout_ms()));
    if (!ready.ok()) throw CollectiveError(absl::StrCat("waiting for rank 0 to prepare the data: ", ready.ToString()));
    absl::StatusOr<std::unique_ptr<TokenCache>> tokens = TokenCache::Open(cache_path);
    if (!tokens.ok()) throw std::runtime_error(tokens.status().ToString());
    tokens_ = std::move(*tokens);
    int64_t num_samples = (tokens_->size() - 1) / cfg_.seq_len;
    eval_samples_ = cfg_.eval_split > 0 ? std::max<int64_t>(1, std::llround(num_samples * cfg_.eval_split)) : 0;
    train_samples_ = num_samples - eval_samples_;
    sampler_ = std::make_unique<DistributedSampler>(train_samples_, world_, rank_, cfg_.batch_size, cfg_.seed,
                                                    cfg_.global_batch_size);
    if (sampler_->batches_per_epoch() < grad_accum_) {
      throw ConfigError(absl::StrCat("the dataset has ", train_samples_, " training samples of ", cfg_.seq_len,
                                     " tokens: too few for ", world_, " ranks x batch ", cfg_.batch_size,
                                     " x accumulation ", grad_accum_));
    }
    int64_t steps_per_epoch = sampler_->batches_per_epoch() / grad_accum_;
    total_steps_ = cfg_.max_steps > 0 ? cfg_.max_steps : cfg_.num_epochs * steps_per_epoch;
  }

  // The model and AdamW (weight decay on matrices only, not on biases and LayerNorm).
  void BuildModel() {
    absl::StatusOr<Gpt2Config> mc = MakeGpt2Config(cfg_.model, cfg_.config_overrides);
    if (!mc.ok()) throw ConfigError(std::string(mc.status().message()));
    mc->vocab_size = tokenizer_->vocab_size();
    mc->dropout = cfg_.dropout;
    if (cfg_.seq_len > mc->n_positions) {
      throw ConfigError(absl::StrCat("--seq-len ", cfg_.seq_len, " exceeds the model's n_positions ", mc->n_positions));
    }
    model_config_ = DescribeConfig(*mc);
    torch::manual_seed(cfg_.seed);
    model_ = Gpt2(*mc);
    model_->to(device_);
    // With --zero 1 the partitioned AdamW is made once the checkpoint's model is loaded (StartZero).
    if (cfg_.zero == 0) optimizer_ = MakeAdamW(model_->parameters(), AdamWConfig());
  }

  AdamWSettings AdamWConfig() const { return AdamWSettings{cfg_.lr, cfg_.beta1, cfg_.beta2, cfg_.weight_decay}; }

  // ZeRO-1: this rank keeps and steps its range of the AdamW moments. Resumed, it regathers that
  // range from the checkpoint, whatever world size (or --zero) wrote it.
  void StartZero() {
    zero_ = std::make_unique<ZeroAdamW>(model_->parameters(), rank_, world_, AdamWConfig());
    const std::string& dir = agent_.assignment().resume().path();
    if (agent_.assignment().has_resume() && !dir.empty()) {
      absl::StatusOr<FlatMoments> mine =
          LoadZeroMoments(dir, model_->parameters(), zero_->begin(), zero_->end(), AdamWConfig(), device_);
      if (absl::IsDataLoss(mine.status())) {
        throw CorruptCheckpointError(absl::StrCat(mine.status().message(), ". Delete ", dir,
                                                  " (and checkpoints/latest when it names it) to resume from an "
                                                  "earlier checkpoint"));
      }
      if (!mine.ok())
        throw ConfigError(absl::StrCat("cannot resume ", dir, " with --zero 1: ", mine.status().message()));
      CheckOk(zero_->LoadMoments(*mine));
    }
    // Every rank says its own range (Log speaks for rank 0 only).
    DT_LOG(Info) << absl::StrFormat("ZeRO-1: rank %d keeps the AdamW moments of elements [%d, %d) of %d (%.1f%%)",
                                    rank_, zero_->begin(), zero_->end(), zero_->numel(),
                                    zero_->numel() > 0 ? 100.0 * static_cast<double>(zero_->end() - zero_->begin()) /
                                                             static_cast<double>(zero_->numel())
                                                       : 0.0);
  }

  // Loads the checkpoint the coordinator named (the latest committed), if any.
  void Resume() {
    const v1::RegisterResponse& a = agent_.assignment();
    if (a.has_resume() && !a.resume().path().empty()) {
      absl::Time t0 = absl::Now();
      absl::StatusOr<TrainState> loaded = optimizer_ ? LoadCheckpoint(a.resume().path(), model_, *optimizer_, device_)
                                                     : LoadModelCheckpoint(a.resume().path(), model_, device_);
      if (absl::IsFailedPrecondition(loaded.status())) throw ConfigError(std::string(loaded.status().message()));
      if (absl::IsDataLoss(loaded.status())) {
        // Every restart would load the same bytes: the run stops instead of spending its budget.
        throw CorruptCheckpointError(absl::StrCat(
            loaded.status().message(), ". Delete ", a.resume().path(),
            " (and checkpoints/latest when it names it) to resume from an earlier checkpoint; dtctl checkpoints RUN "
            "--verify checks the others"));
      }
      if (!loaded.ok()) throw std::runtime_error(std::string(loaded.status().message()));
      state_ = *loaded;
      // The sampler position counts micro-batches of world × batch samples: carry it over in
      // samples when the shape changed.
      CarryPositionAcrossShapes();
      if (std::string change = EpochCutChange(state_.epoch_samples, sampler_->samples_per_epoch(), state_.epoch);
          !change.empty()) {
        DT_LOG(Warning) << change;
      }
      Log(absl::StrCat("resumed from ", a.resume().path(), " at step ", state_.step, " (loaded in ",
                       absl::FormatDuration(absl::Now() - t0), ")"));
    }
    state_.world_size = world_;
    state_.batch_size = cfg_.batch_size;
    state_.grad_accum = grad_accum_;
    state_.epoch_samples = sampler_->samples_per_epoch();
    state_.seed = cfg_.seed;
    state_.model_config = model_config_;
  }

  // The sampler position counts micro-batches of world x batch samples: carried over in samples
  // when the checkpoint's shape differs from this run's. The global batch (world x batch x
  // accumulation) kept and the position on a whole step: every step sees the samples it would have
  // seen uninterrupted. Otherwise the data order differs, which is said.
  void CarryPositionAcrossShapes() {
    const int64_t then = static_cast<int64_t>(state_.world_size) * state_.batch_size;
    const int64_t now = static_cast<int64_t>(world_) * cfg_.batch_size;
    const int64_t then_global = then * state_.grad_accum, now_global = now * grad_accum_;
    if (then <= 0 || (then == now && then_global == now_global)) return;
    const int64_t samples = state_.batch * then;
    state_.batch = samples / now;
    std::string shape = absl::StrCat("the checkpoint was taken with ", state_.world_size, " ranks x batch ",
                                     state_.batch_size, " x accumulation ", state_.grad_accum,
                                     "; continuing at sample ", samples, " of epoch ", state_.epoch);
    if (then_global == now_global && samples % now_global == 0) {
      Log(absl::StrCat(shape, " with the global batch of ", now_global, " kept (", world_, " ranks x batch ",
                       cfg_.batch_size, " x accumulation ", grad_accum_, ")"));
      return;
    }
    DT_LOG(Warning) << shape << (samples % now != 0 ? " (rounded down to a whole batch)" : "")
                    << "; the global batch is " << now_global << " (was " << then_global
                    << "): the data order differs from an uninterrupted run (--global-batch-size " << then_global
                    << " keeps it)";
  }

  // DDP: every rank starts from rank 0's parameters; gradients are all-reduced in buckets.
  void StartDataParallel() {
    params_ = model_->parameters();
    ddp_ = std::make_unique<DistributedDataParallel>(params_, group_);
    Collective("broadcast of parameters from rank 0", [&] { ddp_->BroadcastParameters(); });
    schedule_ = LrSchedule{cfg_.lr, cfg_.min_lr >= 0 ? cfg_.min_lr : cfg_.lr / 10, cfg_.warmup_steps, total_steps_};
    Log(absl::StrCat("GPT-2 ", cfg_.model, " with ", model_->NumParameters(), " parameters; ", train_samples_,
                     " training samples of ", cfg_.seq_len, " tokens (", eval_samples_, " held out); ", total_steps_,
                     " steps; ", world_, " rank(s) x batch ", cfg_.batch_size, " x accumulation ", grad_accum_, "; ",
                     threads_, " thread(s) per rank; ", ddp_->bucket_count(), " gradient bucket(s); ",
                     PrecisionName(precision_), " on ", device_.str()));
  }

  // The mean next-token loss of `batch` ([B, seq_len + 1] tokens), in --precision.
  torch::Tensor Loss(const torch::Tensor& batch) {
    AutocastScope autocast(device_, precision_);
    return model_->Loss(batch.narrow(1, 0, cfg_.seq_len), batch.narrow(1, 1, cfg_.seq_len));
  }

  // Tokens of samples [first, first + count) shaped [count, seq_len + 1], on the device. A GPU's
  // batch goes up from pinned memory behind the step's work: a copy from pageable memory makes the
  // host wait for it, and the device idled meanwhile.
  torch::Tensor Batch(const std::vector<int64_t>& samples) {
    RECORD_USER_SCOPE("dt::batch");
    torch::Tensor batch = Gather(*tokens_, samples, cfg_.seq_len);
    if (!device_.is_cuda()) return batch.to(device_);
    return batch.pin_memory().to(device_, /*non_blocking=*/true);
  }

  // This rank's AdamW moments: all of them, or with --zero 1 its range's.
  int64_t OptimizerStateBytes() const { return zero_ ? zero_->StateBytes() : AdamWStateBytes(*optimizer_); }

  // One optimizer step (with its micro-steps), then what follows it: metrics, evaluation,
  // checkpoints.
  void TrainStep() {
    const int64_t step = state_.step + 1;
    if (step == hang_for_tests_.step && rank_ == hang_for_tests_.rank) HangInsideStepForTests(step);
    const int seq_len = cfg_.seq_len;
    absl::Time step_start = absl::Now();
    absl::Duration data_time;
    // The step's losses stay on the device until a logged step reads them: reading each would make
    // the host wait for every micro-step's forward pass.
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
    for (int micro = 0; micro < grad_accum_; ++micro) {
      absl::Time d0 = absl::Now();
      if (state_.batch >= sampler_->batches_per_epoch()) {
        ++state_.epoch;
        state_.batch = 0;
      }
      torch::Tensor batch = Batch(sampler_->Batch(state_.epoch, state_.batch));
      ++state_.batch;
      data_time += absl::Now() - d0;
      bool last = micro == grad_accum_ - 1;
      ddp_->set_sync(last);
      if (last) ddp_->Prepare();
      torch::Tensor loss = Loss(batch);
      (loss / grad_accum_).backward();
      loss_sum += loss.detach();
    }
    Collective("gradient all-reduce", [&] { ddp_->Finish(); });
    torch::Tensor grad_norm_on_device = ClipGradNorm(params_, cfg_.grad_clip);
    // A checkpoint round's copy of the state may still be going on (CheckpointRounds): the
    // optimizer step must not change what it copies. The wait counts as the round's pause.
    if (absl::Duration waited = rounds_->AwaitSnapshot(); waited > absl::ZeroDuration()) {
      step_metrics_["checkpoint_pause_seconds"] += absl::ToDoubleSeconds(waited);
    }
    double lr = schedule_.At(step);
    if (zero_) {
      zero_->Step(lr);
      Collective("all-gather of parameters (ZeRO-1)", [&] { zero_->ShareParameters(*group_); });
      model_->zero_grad();
    } else {
      for (auto& g : optimizer_->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      {
        RECORD_USER_SCOPE("dt::optimizer_step");
        StepAdamW(*optimizer_);
      }
      optimizer_->zero_grad();
    }
    state_.step = step;
    const int64_t tokens_per_step = static_cast<int64_t>(cfg_.batch_size) * seq_len * grad_accum_;
    state_.tokens_seen += tokens_per_step * world_;
    state_.samples_seen += static_cast<int64_t>(cfg_.batch_size) * grad_accum_ * world_;
    current_step_ = step;
    agent_.ReportProgress(step, total_steps_);
    // On a GPU, the step before's point: its figures reached the host while this step was queued.
    // Waiting for them keeps the host a step ahead of the device at most, so a step's time is the
    // device's pace.
    ReportHeldPoint();
    double step_seconds = absl::ToDoubleSeconds(absl::Now() - step_start);

    std::optional<StepFigures> figures;
    if (cfg_.log_freq > 0 && (step % cfg_.log_freq == 0 || step == total_steps_)) {
      figures = StageFigures(loss_sum, grad_norm_on_device, lr, tokens_per_step, step_seconds, data_time);
      if (!late_points_) {  // there at once: the step's line comes before its evaluation's
        LogStep(step, *figures, step_metrics_);
        figures.reset();
      }
    }
    if (cfg_.eval_freq > 0 && eval_samples_ >= world_ && (step % cfg_.eval_freq == 0 || step == total_steps_)) {
      double eval_loss = EvaluateLoss();
      best_eval_ = std::min(best_eval_, eval_loss);
      step_metrics_["eval_loss"] = eval_loss;
      step_metrics_["perplexity"] = std::exp(eval_loss);
      Log(absl::StrFormat("step %d eval_loss %.4f perplexity %.2f", step, eval_loss, std::exp(eval_loss)));
    }
    CollectCheckpoint(rounds_->Poll());  // a finished round's figures ride on this step's point
    // Everything a step reports goes out as one point (W&B wants one history row per step), queued
    // before a checkpoint at this step, which delivers it first. On a GPU the point waits for the
    // next step (HeldPoint).
    held_ = HeldPoint{step, std::move(step_metrics_), std::move(figures)};
    step_metrics_.clear();
    if (!late_points_) ReportHeldPoint();
    if (cfg_.ckpt_freq > 0 && step % cfg_.ckpt_freq == 0) Checkpoint(step);
    if (step == total_steps_ && checkpoint_started_ != step) Checkpoint(step);
  }

  // What a logged step reports. The loss and the gradient norm are on their way from the device.
  struct StepFigures {
    std::unique_ptr<LateRead> loss_and_grad_norm;  // the loss averaged over the ranks; the norm before clipping
    double lr;
    int64_t tokens_per_step;
    double step_seconds;
    absl::Duration data_time;
    double epoch;
    int64_t tokens_seen, samples_seen;
  };

  // A step's point, until its figures are read. On a GPU it waits for the next step to be queued:
  // reading the figures at once makes the host wait for the device, which then idles while the
  // host logs, reports and queues the next step (1.7 ms of an 80 ms step on an H200). A checkpoint,
  // the end and every way out report it first.
  struct HeldPoint {
    int64_t step = 0;
    std::map<std::string, double> metrics;
    std::optional<StepFigures> figures;  // none: not a logged step
  };

  void ReportHeldPoint() {
    if (!held_) return;
    RECORD_USER_SCOPE("dt::report_point");
    HeldPoint point = std::move(*held_);
    held_.reset();
    if (point.figures) LogStep(point.step, *point.figures, point.metrics);
    if (reporter_ && !point.metrics.empty()) reporter_->Add(point.step, point.metrics);
    std::lock_guard<std::mutex> lock(points_mu_);
    points_through_ = point.step;
    points_made_.notify_all();
  }

  // On a round's thread: waits until every point up to `step` is with the reporter, or the
  // trainer is going away (false).
  bool AwaitPointsThrough(int64_t step) {
    std::unique_lock<std::mutex> lock(points_mu_);
    points_made_.wait(lock, [&] { return points_through_ >= step || points_abandoned_; });
    return points_through_ >= step;
  }

  // A logged step's figures, queued for the host: the loss is averaged over the ranks on the device
  // (one all-reduce of 8 bytes; none for one rank).
  StepFigures StageFigures(const torch::Tensor& loss_sum, const torch::Tensor& grad_norm, double lr,
                           int64_t tokens_per_step, double step_seconds, absl::Duration data_time) {
    torch::Tensor loss = (loss_sum / grad_accum_).reshape({1});
    if (world_ > 1) {
      Collective("all-reduce of metrics", [&] {
        std::vector<torch::Tensor> t = {loss};
        RecordedWait("all-reduce", 8, [&] { return group_->allreduce(t); });
      });
      loss = loss / world_;
    }
    torch::Tensor both = torch::cat({loss, grad_norm.reshape({1}).to(loss.device(), torch::kDouble)});
    double epoch = static_cast<double>(state_.epoch) +
                   static_cast<double>(state_.batch) / static_cast<double>(sampler_->batches_per_epoch());
    // On the training stream: a round begun after this step queues its copies behind this read.
    return StepFigures{std::make_unique<LateRead>(both, CopyStream::kCurrent),
                       lr,
                       tokens_per_step,
                       step_seconds,
                       data_time,
                       epoch,
                       state_.tokens_seen,
                       state_.samples_seen};
  }

  // A logged step: its metrics into its point, and a line in rank 0's log.
  void LogStep(int64_t step, const StepFigures& f, std::map<std::string, double>& point) {
    const std::vector<double> read = f.loss_and_grad_norm->Values();
    last_loss_ = read[0];
    const double grad_norm = read[1];
    // Since the last logged step: everything the loop did, logging and reporting included, on
    // every thread (the metrics reporter, gRPC, a checkpoint's writer): on a busy node, the step's cost.
    const double cpu_now = ProcessCpuSeconds();
    const double cpu_per_step = (cpu_now - cpu_at_log_) / static_cast<double>(step - step_at_log_);
    cpu_at_log_ = cpu_now;
    step_at_log_ = step;
    const double tokens_per_s = static_cast<double>(f.tokens_per_step) / f.step_seconds;
    point.insert({{"loss", last_loss_},
                  {"lr", f.lr},
                  {"grad_norm", grad_norm},
                  {"tokens_per_s", tokens_per_s},
                  {"step_time_s", f.step_seconds},
                  {"cpu_time_s", cpu_per_step},
                  {"data_time_s", absl::ToDoubleSeconds(f.data_time)},
                  {"epoch", f.epoch},
                  {"tokens_seen", static_cast<double>(f.tokens_seen)},
                  {"samples_seen", static_cast<double>(f.samples_seen)},
                  {"rss_bytes", static_cast<double>(RssBytes())},
                  {"peak_rss_bytes", static_cast<double>(PeakRssBytes())},
                  {"optimizer_state_bytes", static_cast<double>(OptimizerStateBytes())}});
    Log(absl::StrFormat(
        "step %d/%d loss %.4f lr %.3g grad_norm %.3f %.0f tokens/s/rank %.3fs/step epoch %.2f cpu %.3fs", step,
        total_steps_, last_loss_, f.lr, grad_norm, tokens_per_s, f.step_seconds, f.epoch, cpu_per_step));
  }

  // The mean loss over the held-out samples (each rank a disjoint share, then all-reduced).
  double EvaluateLoss() {
    torch::NoGradGuard no_grad;
    model_->eval();
    double sum = 0, count = 0;
    int64_t per_rank = std::min<int64_t>(cfg_.eval_batches * cfg_.batch_size, eval_samples_ / world_);
    for (int64_t i = 0; i < per_rank; i += cfg_.batch_size) {
      std::vector<int64_t> ids;
      for (int64_t k = i; k < std::min(per_rank, i + cfg_.batch_size); ++k)
        ids.push_back(train_samples_ + k * world_ + rank_);
      torch::Tensor batch = Batch(ids);
      torch::Tensor loss = Loss(batch);
      sum += loss.item<double>() * static_cast<double>(ids.size());
      count += static_cast<double>(ids.size());
    }
    model_->train();
    return Collective("all-reduce of eval loss", [&] {
      std::vector<torch::Tensor> t = {torch::tensor({sum, count}, torch::kDouble).to(device_)};
      RecordedWait("all-reduce", 16, [&] { return group_->allreduce(t); });
      return t[0][1].item<double>() > 0 ? t[0][0].item<double>() / t[0][1].item<double>() : 0.0;
    });
  }

  // A checkpoint round at `step` (CheckpointRounds: asynchronous unless --sync-checkpoint). A round
  // that fails leaves training going (the coordinator stops this process through the heartbeat if
  // the generation is over); a full disk ends the run.
  // A round's pause is reported with the next step's point.
  // The round begins without waiting for the device: its copies are queued behind the step's work
  // while the device still runs it. Its commit waits for the step's point (SetBeforeCommit).
  void Checkpoint(int64_t step) {
    RECORD_USER_SCOPE("dt::checkpoint_round_begin");
    CollectCheckpoint(rounds_->Wait());  // at most one round in flight
    absl::StatusOr<absl::Duration> paused =
        zero_ ? rounds_->StartZero(model_, *zero_, state_) : rounds_->Start(model_, *optimizer_, state_);
    if (!paused.ok()) {
      throw CollectiveError(absl::StrCat("checkpoint round at step ", step, ": ", paused.status().ToString()));
    }
    // The step's point now, before anything of the next step can fail: the host waits for the step
    // to end on the device, which then runs the round's copies while the point is made.
    ReportHeldPoint();
    checkpoint_started_ = step;
    step_metrics_["checkpoint_pause_seconds"] = absl::ToDoubleSeconds(*paused);
    if (!rounds_->async()) CollectCheckpoint(rounds_->Wait());
  }

  // What a finished round came to: logged and reported; a full disk is thrown.
  void CollectCheckpoint(std::optional<CheckpointRounds::Outcome> outcome) {
    if (!outcome) return;
    if (outcome->disk_full) {
      throw StorageFullError(
          absl::StrCat("checkpoint at step ", outcome->step, " not written: ", outcome->committed.status().message()));
    }
    if (!outcome->committed.ok()) {
      DT_LOG(Warning) << "checkpoint at step " << outcome->step
                      << " was not committed: " << outcome->committed.status();
      return;
    }
    last_checkpoint_ = outcome->step;
    Log(absl::StrCat("checkpoint step-", outcome->step, " committed (", outcome->committed->bytes(), " bytes, ",
                     absl::FormatDuration(outcome->took), ")"));
    step_metrics_["checkpoint_seconds"] = absl::ToDoubleSeconds(outcome->took);
    step_metrics_["checkpoint_bytes"] = static_cast<double>(outcome->committed->bytes());
  }

  // Whether any rank was asked to stop by the scheduler (SIGUSR2 reaches the ranks moments apart,
  // or only some of them): one tiny all-reduce per step makes every rank stop after the same step.
  bool PreemptionAgreed() {
    RECORD_USER_SCOPE("dt::preemption_check");
    return Collective("preemption check", [&] {
      const float requested = PreemptionRequested() ? 1.0f : 0.0f;
      std::vector<torch::Tensor> t = {torch::full({1}, requested, torch::TensorOptions().device(device_))};
      c10d::AllreduceOptions max;
      max.reduceOp = c10d::ReduceOp::MAX;
      RecordedWait("all-reduce", 4, [&] { return group_->allreduce(t, max); });
      if (!device_.is_cuda()) return t[0].item<float>() > 0;
      return AgreedTheStepBefore(t[0]);
    });
  }

  // On a GPU every rank acts on the agreement of the step before: this step's answer is copied to
  // host memory behind the step's work and read a step later. Reading it now would make the host
  // wait for the device every step, and after a checkpoint round began the read queued behind the
  // round's copy of the state to the host (1.5 GB for GPT-2 small, 22 ms on an H200).
  bool AgreedTheStepBefore(const torch::Tensor& answer) {
    bool agreed = preemption_read_ && preemption_read_->Values()[0] > 0;  // done long ago: a step has run since
    preemption_read_ = std::make_unique<LateRead>(answer, CopyStream::kSide);
    return agreed;
  }

  // A preemption or the time limit: checkpoint this step and leave; the run is requeued and the
  // next job resumes here.
  int LeaveForPreemption() {
    ReportHeldPoint();
    if (checkpoint_started_ != state_.step) Checkpoint(state_.step);
    CollectCheckpoint(rounds_->Wait());
    if (reporter_) (void)reporter_->Flush(absl::Seconds(10));
    agent_.StopHeartbeats();
    CheckOk(agent_.Leave(state_.step, SIGUSR2));
    Log(absl::StrCat("stopped at step ", state_.step, " for the scheduler (SIGUSR2: preemption or time limit); ",
                     last_checkpoint_ == state_.step ? "checkpointed there" : "its checkpoint failed",
                     ", the job is requeued"));
    return kExitOk;
  }

  // Done: the last checkpoint (for a run resumed at its end), the summary metrics, Leave.
  int Finish() {
    ReportHeldPoint();
    if (checkpoint_started_ != state_.step && state_.step > 0) Checkpoint(state_.step);
    CollectCheckpoint(rounds_->Wait());
    if (reporter_) {
      std::map<std::string, double> summary = {{"final_step", static_cast<double>(state_.step)},
                                               {"tokens_seen", static_cast<double>(state_.tokens_seen)}};
      if (!std::isnan(last_loss_)) summary["final_loss"] = last_loss_;
      if (std::isfinite(best_eval_)) summary["best_eval_loss"] = best_eval_;
      reporter_->Summary(summary);
      (void)reporter_->Flush(absl::Seconds(10));
    }
    // No heartbeat after leaving: the last rank's Leave ends the run, and a heartbeat racing it
    // would be told to stop.
    agent_.StopHeartbeats();
    CheckOk(agent_.Leave(state_.step));
    Log(absl::StrCat("done: ", state_.step, " steps"));
    return kExitOk;
  }

  const TrainerConfig& cfg_;
  Agent& agent_;
  std::unique_ptr<MetricsReporter>& reporter_;
  std::atomic<int64_t>& current_step_;

  int rank_ = 0;
  int world_ = 1;
  int grad_accum_ = 1;  // micro-steps per optimizer step: --grad-accum, or from --global-batch-size
  int threads_ = 1;
  std::string exp_dir_;
  torch::Device device_ = torch::kCPU;  // cuda:<local rank> with NCCL
  Precision precision_ = Precision::kFp32;
  c10::intrusive_ptr<CommGroup> group_;

  std::unique_ptr<Gpt2Tokenizer> tokenizer_;
  std::unique_ptr<TokenCache> tokens_;
  std::unique_ptr<DistributedSampler> sampler_;
  int64_t train_samples_ = 0;
  int64_t eval_samples_ = 0;
  int64_t total_steps_ = 0;

  Gpt2 model_{nullptr};
  std::string model_config_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;  // null with --zero 1
  std::unique_ptr<ZeroAdamW> zero_;                 // --zero 1
  std::vector<torch::Tensor> params_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  LrSchedule schedule_;

  TrainState state_;
  // Between the loop and a round's thread (AwaitPointsThrough); declared before rounds_, whose
  // thread may wait on them until the trainer is destroyed.
  std::mutex points_mu_;
  std::condition_variable points_made_;
  int64_t points_through_ = 0;     // every point up to this step is with the reporter
  bool points_abandoned_ = false;  // the trainer is going away: a waiting round stops waiting
  std::thread::id loop_thread_;
  std::unique_ptr<CheckpointRounds> rounds_;
  // On a GPU, the ranks' preemption agreement on its way to host memory (AgreedTheStepBefore).
  std::unique_ptr<LateRead> preemption_read_;
  int64_t checkpoint_started_ = 0;  // the step of the last round started
  int64_t last_checkpoint_ = 0;     // the step of the last round committed
  const HangForTests hang_for_tests_ = HangForTestsFromEnvironment();
  double last_loss_ = std::nan("");
  // Process CPU and step at the last logged step: a logged step's CPU is per step since then.
  double cpu_at_log_ = 0;
  int64_t step_at_log_ = 0;
  double best_eval_ = std::numeric_limits<double>::infinity();
  std::map<std::string, double> step_metrics_;  // this step's point, sent after it
  std::optional<HeldPoint> held_;               // the last step's, on a GPU (ReportHeldPoint)
  bool late_points_ = false;                    // a GPU, or --late-step-points
};

// Runs `trainer` and turns an exception out of it into a report to the coordinator and an exit
// code. A collective's failure is usually the echo of another rank's: the coordinator gets time to
// name that one first.
int RunReportingFailure(Trainer& trainer, Agent& agent, const std::atomic<int64_t>& step) {
  std::string message, type;
  bool collective = false;
  bool fatal = false;  // restarting cannot help: the run fails without spending a restart
  int code = kExitFailed;
  try {
    code = trainer.Run();
    trainer.CloseProcessGroup(/*clean=*/code == kExitOk);
    return code;
  } catch (const CollectiveError& e) {
    message = e.what();
    type = "CollectiveError";
    collective = true;
  } catch (const ConfigError& e) {
    message = e.what();
    type = "ConfigError";
    code = kExitUsage;
    fatal = true;
  } catch (const StorageFullError& e) {
    message = e.what();
    type = "StorageFullError";
    fatal = true;
  } catch (const CorruptCheckpointError& e) {
    message = e.what();
    type = "CorruptCheckpointError";
    fatal = true;
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
    type = "c10::Error";
  } catch (const std::exception& e) {
    message = e.what();
    type = "std::exception";
  }
  if (collective) {
    // A silent peer, or one stopped from outside, takes the heartbeat timeout from before this
    // error to be named; the coordinator's check runs a few times a second and the stop arrives
    // with the next heartbeat, so a second beyond that for a loaded machine.
    const v1::TimeoutPolicy& t = agent.timeouts();
    absl::Duration window =
        absl::Milliseconds(t.heartbeat_timeout_ms() + 3 * t.heartbeat_interval_ms()) + absl::Seconds(1);
    DT_LOG(Warning) << message << " — waiting up to " << absl::FormatDuration(window)
                    << " for the coordinator to name the cause";
    absl::SleepFor(window);
  }
  DT_LOG(Error) << type << ": " << message;
  trainer.CloseProcessGroup(/*clean=*/false);
  // Heartbeats end first: the run's end that this report brings about would otherwise come back as
  // a heartbeat's STOP and end this process as a victim (exit 3) before it returns its own code.
  agent.StopHeartbeats();
  absl::Status reported = agent.ReportError(message, type, "", step.load(), fatal);
  if (!reported.ok()) DT_LOG(Warning) << "could not report the error: " << reported;
  return code;
}

// Why registration failed, and what to do about it.
std::string DescribeRegistrationFailure(const absl::Status& status, const TrainerConfig& cfg) {
  std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return absl::StrCat("the coordinator could not be reached for ", cfg.rendezvous_timeout_s, "s (", message,
                          "): is dtcoord running? check --coordinator/DT_COORDINATOR");
    case absl::StatusCode::kDeadlineExceeded:
      return absl::StrCat(message == "Deadline Exceeded" ? "" : message + "; ", "not every rank registered within ",
                          cfg.rendezvous_timeout_s,
                          "s: start the missing ranks (dtctl status shows who came) or raise --rendezvous-timeout");
    case absl::StatusCode::kUnauthenticated:
      return absl::StrCat(message,
                          " (set DT_RUN_TOKEN from dtctl submit, or DT_TOKEN to the admin token, or pass "
                          "--token-file)");
    default:
      return message;
  }
}

AgentOptions AgentIdentity(const TrainerConfig& cfg, const std::string& run_id) {
  AgentOptions id;
  id.scheduler_task = cfg.scheduler_task;
  id.run_id = run_id;
  id.node = cfg.node;
  id.local_slot = cfg.local_slot;
  id.host = HostName();
  id.pid = ::getpid();
  id.version = kVersion;
  if (cfg.expect_nodes > 0 && cfg.expect_procs_per_node > 0) {
    id.expected.set_nodes(cfg.expect_nodes);
    id.expected.set_procs_per_node(cfg.expect_procs_per_node);
    id.expected.set_world_size(cfg.expect_nodes * cfg.expect_procs_per_node);
  }
  return id;
}

}  // namespace

int RunTrainer(const TrainerConfig& cfg) {
  absl::StatusOr<std::shared_ptr<CoordinatorClient>> client =
      CoordinatorClient::Connect(cfg.coordinator, cfg.token, cfg.tls_ca);
  if (!client.ok()) {
    std::cerr << "dttrainer: " << client.status().message() << "\n";
    return kExitUsage;
  }
  std::string run_id = cfg.run_id;
  if (run_id.empty()) {
    // Bring your own sbatch: trainers of one job create or join the same run.
    JoinRunSpec join{cfg.experiment_name,
                     cfg.save_dir,
                     cfg.expect_nodes,
                     cfg.expect_procs_per_node,
                     cfg.max_restarts,
                     cfg.argv,
                     {},
                     {}};
    absl::StatusOr<std::string> run = CreateOrJoinRun(**client, join);
    if (!run.ok()) {
      std::cerr << "dttrainer: cannot create or join the run for experiment " << cfg.experiment_name << ": "
                << DescribeRegistrationFailure(run.status(), cfg) << "\n";
      return run.status().code() == absl::StatusCode::kUnavailable ? kExitFailed : kExitUsage;
    }
    run_id = *run;
  }

  Agent agent(*client, AgentIdentity(cfg, run_id));
  // A capture the coordinator asks for (a hang, or dtctl stacks): this process's threads, native
  // frames from eu-stack, and the collectives it issued.
  agent.SetStackCapturer([] {
    v1::RankStacks out;
    for (v1::ProcessStacks& p : CaptureProcessStacks({::getpid()}, StackCaptureOptions())) {
      *out.add_processes() = std::move(p);
    }
    for (v1::CollectiveRecord& c : CollectiveRing::Process().Snapshot()) *out.add_collectives() = std::move(c);
    return out;
  });
  std::atomic<int64_t> step{0};
  // SIGTERM/SIGINT from outside (srun ending the step after another task died, a cancel, a time
  // limit): tell the coordinator this rank is a victim, not a cause, then die by the signal.
  ScopedStopHandler on_stop([&agent, &step](int signal) {
    DT_LOG(Warning) << "stopped by " << SignalName(signal) << " from outside (the scheduler ending the job step, "
                    << "a cancel or a time limit) at step " << step.load();
    absl::Status reported = agent.ReportStopped(signal, step.load(), absl::Seconds(2));
    if (!reported.ok() && reported.code() != absl::StatusCode::kFailedPrecondition) {
      DT_LOG(Warning) << "could not tell the coordinator: " << reported;
    }
    std::cerr.flush();
  });
  absl::StatusOr<v1::RegisterResponse> assigned = agent.Register(absl::Seconds(cfg.rendezvous_timeout_s));
  if (!assigned.ok()) {
    std::cerr << "dttrainer (node " << cfg.node << ", slot " << cfg.local_slot << "): registration with run " << run_id
              << " at " << cfg.coordinator << " failed: " << DescribeRegistrationFailure(assigned.status(), cfg)
              << "\n";
    return assigned.status().code() == absl::StatusCode::kFailedPrecondition ||
                   assigned.status().code() == absl::StatusCode::kInvalidArgument
               ? kExitUsage
               : kExitFailed;
  }
  SetLogProgram(absl::StrCat("dttrainer rank ", assigned->rank()));
  if (!cfg.log_dir.empty()) RedirectOutput(cfg.log_dir, *assigned);

  std::unique_ptr<MetricsReporter> reporter;
  if (cfg.report_metrics) {
    reporter = std::make_unique<MetricsReporter>(*client, run_id, assigned->generation(), assigned->rank());
  }
  // Told to stop (a peer died, the run restarts or was cancelled): the main thread may be stuck
  // in a collective, so leave from here with the cause, after a bounded metrics flush.
  agent.StartHeartbeats([&](const std::string& reason) {
    DT_LOG(Error) << "stopping: " << reason;
    if (reporter) (void)reporter->Flush(absl::Seconds(2));
    std::cerr.flush();
    std::_Exit(kExitStopped);
  });
  Trainer trainer{cfg, agent, reporter, step};
  return RunReportingFailure(trainer, agent, step);
}

}  // namespace dt
