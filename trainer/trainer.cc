#include "trainer/trainer.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/agent.h"
#include "client/join_run.h"
#include "client/metrics_reporter.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/stop_signals.h"
#include "common/version.h"
#include "trainer/checkpoint_io.h"
#include "client/coordinator_store.h"
#include "trainer/ddp.h"
#include "trainer/gpt2_model.h"
#include "trainer/gpt2_tokenizer.h"
#include "trainer/lr_schedule.h"
#include "trainer/process_group.h"
#include "trainer/sampler.h"
#include "trainer/device_preflight.h"
#include "trainer/token_cache.h"

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

void Check(const absl::Status& s) {
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

double Now() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

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
  DT_LOG(Info) << "=== run " << a.run_id() << " generation " << a.generation() << ": rank " << a.rank()
               << " of " << a.world_size() << ", pid " << ::getpid() << " on " << HostName() << " ===";
}

struct Trainer {
  const TrainerConfig& cfg;
  Agent& agent;
  std::unique_ptr<MetricsReporter>& reporter;
  std::atomic<int64_t>& current_step;

  int rank = 0;
  int world = 1;
  std::string exp_dir;
  c10::intrusive_ptr<CommGroup> group;

  void Log(const std::string& line) {
    if (rank == 0) std::cout << line << std::endl;
  }

  torch::Device device = torch::kCPU;  // cuda:<local rank> with NCCL

  double AllReduceMean(double value) {
    return Collective("all-reduce of metrics", [&] {
      std::vector<torch::Tensor> t = {torch::tensor({value}, torch::kDouble).to(device)};
      group->allreduce(t)->wait();
      return t[0].item<double>() / world;
    });
  }

  // Whether any rank was asked to stop by the scheduler (SIGUSR2 reaches the ranks moments apart,
  // or only some of them): one tiny all-reduce per step makes every rank stop after the same step.
  bool PreemptionAgreed() {
    return Collective("preemption check", [&] {
      std::vector<torch::Tensor> t = {torch::tensor({PreemptionRequested() ? 1.0f : 0.0f}).to(device)};
      c10d::AllreduceOptions max;
      max.reduceOp = c10d::ReduceOp::MAX;
      group->allreduce(t, max)->wait();
      return t[0].item<float>() > 0;
    });
  }

  // Before the first step: times this rank's device and the group (RunDevicePreflight) and tells
  // the coordinator, which compares the ranks. False when the generation ended over a pre-flight
  // (this rank's device or another's): this process leaves, the run restarts without the node.
  bool DevicePreflightPassed() {
    v1::DevicePreflight result =
        Collective("device pre-flight all-reduce", [&] { return RunDevicePreflight(*group, device); });
    if (result.error().empty()) {
      DT_LOG(Info) << absl::StrFormat("device pre-flight on %s: matrix multiply (order %d) %.1f ms, all-reduce %.1f ms",
                                      result.device(), result.matmul_size(), result.matmul_seconds() * 1e3,
                                      result.allreduce_seconds() * 1e3);
    } else {
      DT_LOG(Error) << "device pre-flight on " << result.device() << " failed: " << result.error();
    }
    absl::StatusOr<v1::ReportPreflightResponse> reply = agent.ReportPreflight(result);
    if (!reply.ok()) {
      // The generation may have ended for another reason; the heartbeat says so.
      DT_LOG(Warning) << "could not report the device pre-flight: " << reply.status();
    } else if (!reply->unhealthy().empty()) {
      DT_LOG(Error) << "stopping: " << reply->unhealthy();
      agent.StopHeartbeats();
      return false;
    }
    if (!result.error().empty()) throw std::runtime_error("device pre-flight: " + result.error());
    return true;
  }

  int Run() {
    const v1::RegisterResponse& a = agent.assignment();
    rank = a.rank();
    world = a.world_size();
    exp_dir = a.exp_dir();
    const v1::TimeoutPolicy& timeouts = a.timeouts();
    int threads = cfg.threads;
    if (threads <= 0) {
      const char* omp = std::getenv("OMP_NUM_THREADS");
      threads = omp != nullptr && std::atoi(omp) > 0 ? std::atoi(omp) : 1;
    }
    torch::set_num_threads(threads);

    // Process group through the coordinator's store.
    absl::StatusOr<std::string> backend = ResolveBackend(cfg.backend);
    if (!backend.ok()) throw ConfigError(std::string(backend.status().message()));
    // NCCL works on GPU tensors: one device per rank, the local rank's.
    if (*backend == "nccl") device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(a.local_rank()));
    absl::StatusOr<std::unique_ptr<StoreSession>> session = agent.OpenStore();
    if (!session.ok()) throw CollectiveError(absl::StrCat("cannot open the coordinator store: ", session.status().ToString()));
    auto store = c10::make_intrusive<CoordinatorStore>(std::move(*session),
                                                       std::chrono::milliseconds(timeouts.store_timeout_ms()));
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("pg.", backend.value()), store);
    absl::Time pg_start = absl::Now();
    absl::StatusOr<c10::intrusive_ptr<CommGroup>> pg = CreateProcessGroup(
        *backend, prefixed, rank, world, a.local_rank(), std::chrono::milliseconds(timeouts.collective_timeout_ms()));
    if (!pg.ok()) throw CollectiveError(std::string(pg.status().message()));
    group = *pg;
    DT_LOG(Info) << "rank " << rank << "/" << world << " (node " << agent.assignment().node_rank()
                 << ", local " << a.local_rank() << ", generation " << a.generation() << "): " << *backend
                 << " process group ready in " << absl::FormatDuration(absl::Now() - pg_start);
    if (!DevicePreflightPassed()) return kExitStopped;

    // Data, rank 0 first.
    absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> tokenizer = Gpt2Tokenizer::Load(cfg.tokenizer_dir);
    if (!tokenizer.ok()) throw ConfigError(std::string(tokenizer.status().message()));
    absl::StatusOr<std::string> cache_name = TokenCacheName(cfg.dataset, (*tokenizer)->fingerprint());
    if (!cache_name.ok()) throw ConfigError(std::string(cache_name.status().message()));
    // Tokenized data is cached beside the experiment directories, so other experiments on the
    // same dataset and tokenizer skip the work (the name covers both).
    std::string data_dir = cfg.data_cache_dir.empty() ? JoinPath(Dirname(exp_dir), ".dt-cache") : cfg.data_cache_dir;
    std::string cache_path = JoinPath(data_dir, *cache_name);
    if (rank == 0 && !std::filesystem::exists(cache_path)) {
      Check(MakeDirs(data_dir));
      absl::Time t0 = absl::Now();
      absl::Status built = BuildTokenCache(cfg.dataset, **tokenizer, cache_path);
      if (!built.ok()) throw ConfigError(std::string(built.message()));
      DT_LOG(Info) << "tokenized " << cfg.dataset << " into " << cache_path << " in "
                   << absl::FormatDuration(absl::Now() - t0);
    }
    absl::Status ready = agent.Barrier("dt.data-ready", absl::Milliseconds(timeouts.init_timeout_ms()));
    if (!ready.ok()) throw CollectiveError(absl::StrCat("waiting for rank 0 to prepare the data: ", ready.ToString()));
    absl::StatusOr<std::unique_ptr<TokenCache>> tokens = TokenCache::Open(cache_path);
    if (!tokens.ok()) throw std::runtime_error(tokens.status().ToString());
    const int seq_len = cfg.seq_len;
    int64_t num_samples = ((*tokens)->size() - 1) / seq_len;
    int64_t eval_samples = cfg.eval_split > 0 ? std::max<int64_t>(1, std::llround(num_samples * cfg.eval_split)) : 0;
    int64_t train_samples = num_samples - eval_samples;
    DistributedSampler sampler(train_samples, world, rank, cfg.batch_size, cfg.seed);
    if (sampler.batches_per_epoch() < cfg.grad_accum) {
      throw ConfigError(absl::StrCat("the dataset has ", train_samples, " training samples of ", seq_len,
                                     " tokens: too few for ", world, " ranks x batch ", cfg.batch_size,
                                     " x accumulation ", cfg.grad_accum));
    }
    int64_t steps_per_epoch = sampler.batches_per_epoch() / cfg.grad_accum;
    int64_t total_steps = cfg.max_steps > 0 ? cfg.max_steps : cfg.num_epochs * steps_per_epoch;

    // Model and optimizer.
    absl::StatusOr<Gpt2Config> mc = MakeGpt2Config(cfg.model, cfg.config_overrides);
    if (!mc.ok()) throw ConfigError(std::string(mc.status().message()));
    mc->vocab_size = (*tokenizer)->vocab_size();
    mc->dropout = cfg.dropout;
    if (seq_len > mc->n_positions) {
      throw ConfigError(absl::StrCat("--seq-len ", seq_len, " exceeds the model's n_positions ", mc->n_positions));
    }
    torch::manual_seed(cfg.seed);
    Gpt2 model(*mc);
    model->to(device);
    std::vector<torch::Tensor> decay, no_decay;
    for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    auto options = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(cfg.lr).betas({cfg.beta1, cfg.beta2}).weight_decay(wd));
    };
    groups.emplace_back(decay, options(cfg.weight_decay));
    groups.emplace_back(no_decay, options(0.0));
    torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(cfg.lr));

    TrainState state;
    if (a.has_resume() && !a.resume().path().empty()) {
      absl::Time t0 = absl::Now();
      absl::StatusOr<TrainState> loaded = LoadCheckpoint(a.resume().path(), model, optimizer, device);
      if (!loaded.ok()) throw std::runtime_error(loaded.status().ToString());
      state = *loaded;
      // The sampler position counts micro-batches of world × batch samples: carry it over in
      // samples when the shape changed.
      int64_t then = static_cast<int64_t>(state.world_size) * state.batch_size;
      int64_t now = static_cast<int64_t>(world) * cfg.batch_size;
      if (then > 0 && then != now) {
        int64_t samples = state.batch * then;
        state.batch = samples / now;
        DT_LOG(Warning) << "the checkpoint was taken with " << state.world_size << " ranks x batch "
                        << state.batch_size << "; continuing at sample " << samples << " of epoch " << state.epoch
                        << (samples % now != 0 ? " (rounded down to a whole batch)" : "")
                        << "; the data order differs from an uninterrupted run with this shape";
      }
      Log(absl::StrCat("resumed from ", a.resume().path(), " at step ", state.step, " (loaded in ",
                       absl::FormatDuration(absl::Now() - t0), ")"));
    }
    state.world_size = world;
    state.batch_size = cfg.batch_size;
    state.grad_accum = cfg.grad_accum;
    state.seed = cfg.seed;
    state.model_config = DescribeConfig(*mc);
    std::vector<torch::Tensor> params = model->parameters();
    DistributedDataParallel ddp(params, group);
    Collective("broadcast of parameters from rank 0", [&] { ddp.BroadcastParameters(); });
    LrSchedule schedule{cfg.lr, cfg.min_lr >= 0 ? cfg.min_lr : cfg.lr / 10, cfg.warmup_steps, total_steps};
    Log(absl::StrCat("GPT-2 ", cfg.model, " with ", model->NumParameters(), " parameters; ", train_samples,
                     " training samples of ", seq_len, " tokens (", eval_samples, " held out); ", total_steps,
                     " steps; ", world, " rank(s) x batch ", cfg.batch_size, " x accumulation ", cfg.grad_accum,
                     "; ", threads, " thread(s) per rank; ", ddp.bucket_count(), " gradient bucket(s)"));

    agent.ReportProgress(state.step, total_steps);
    current_step = state.step;
    double best_eval = std::numeric_limits<double>::infinity();
    double last_loss = std::nan("");
    int64_t last_checkpoint = state.step;
    const int64_t tokens_per_micro = static_cast<int64_t>(cfg.batch_size) * seq_len;

    // Everything a step reports goes out as one point (W&B wants one history row per step).
    std::map<std::string, double> step_metrics;
    auto checkpoint = [&](int64_t step) {
      absl::Time t0 = absl::Now();
      absl::StatusOr<v1::BeginCheckpointResponse> round = agent.BeginCheckpoint(step);
      if (!round.ok()) {
        throw CollectiveError(absl::StrCat("checkpoint round at step ", step, ": ", round.status().ToString()));
      }
      absl::StatusOr<v1::CheckpointInfo> done;
      if (round->writer_rank() == rank) {
        absl::StatusOr<v1::Manifest> manifest = WriteCheckpoint(round->partial_dir(), model, optimizer, state);
        if (!manifest.ok()) {
          (void)agent.AbortCheckpoint(round->round_id(), manifest.status().ToString());
          DT_LOG(Error) << "checkpoint at step " << step << " not written: " << manifest.status();
          if (absl::IsResourceExhausted(manifest.status())) {
            throw StorageFullError(absl::StrCat("checkpoint at step ", step, " not written: ",
                                                manifest.status().message()));
          }
          return;
        }
        done = agent.CommitCheckpoint(round->round_id(), &*manifest);
      } else {
        done = agent.CommitCheckpoint(round->round_id(), nullptr);
      }
      if (!done.ok()) {
        // The round failed but the group may be fine: training goes on; the coordinator stops
        // this process through the heartbeat if the generation is over.
        DT_LOG(Warning) << "checkpoint at step " << step << " was not committed: " << done.status();
        return;
      }
      last_checkpoint = step;
      Log(absl::StrCat("checkpoint step-", step, " committed (", done->bytes(), " bytes, ",
                       absl::FormatDuration(absl::Now() - t0), ")"));
      step_metrics["checkpoint_seconds"] = absl::ToDoubleSeconds(absl::Now() - t0);
      step_metrics["checkpoint_bytes"] = static_cast<double>(done->bytes());
    };

    auto evaluate = [&]() -> double {
      torch::NoGradGuard no_grad;
      model->eval();
      double sum = 0, count = 0;
      int64_t per_rank = std::min<int64_t>(cfg.eval_batches * cfg.batch_size, eval_samples / world);
      for (int64_t i = 0; i < per_rank; i += cfg.batch_size) {
        std::vector<int64_t> ids;
        for (int64_t k = i; k < std::min(per_rank, i + cfg.batch_size); ++k) ids.push_back(train_samples + k * world + rank);
        torch::Tensor batch = Gather(**tokens, ids, seq_len).to(device);
        torch::Tensor loss = model->Loss(batch.narrow(1, 0, seq_len), batch.narrow(1, 1, seq_len));
        sum += loss.item<double>() * static_cast<double>(ids.size());
        count += static_cast<double>(ids.size());
      }
      model->train();
      return Collective("all-reduce of eval loss", [&] {
        std::vector<torch::Tensor> t = {torch::tensor({sum, count}, torch::kDouble).to(device)};
        group->allreduce(t)->wait();
        return t[0][1].item<double>() > 0 ? t[0][0].item<double>() / t[0][1].item<double>() : 0.0;
      });
    };

    model->train();
    while (state.step < total_steps) {
      const int64_t step = state.step + 1;
      absl::Time step_start = absl::Now();
      absl::Duration data_time;
      double loss_sum = 0;
      for (int micro = 0; micro < cfg.grad_accum; ++micro) {
        absl::Time d0 = absl::Now();
        if (state.batch >= sampler.batches_per_epoch()) {
          ++state.epoch;
          state.batch = 0;
        }
        torch::Tensor batch = Gather(**tokens, sampler.Batch(state.epoch, state.batch), seq_len).to(device);
        ++state.batch;
        data_time += absl::Now() - d0;
        bool last = micro == cfg.grad_accum - 1;
        ddp.set_sync(last);
        if (last) ddp.Prepare();
        torch::Tensor loss = model->Loss(batch.narrow(1, 0, seq_len), batch.narrow(1, 1, seq_len));
        (loss / cfg.grad_accum).backward();
        loss_sum += loss.item<double>();
      }
      Collective("gradient all-reduce", [&] { ddp.Finish(); });
      double grad_norm = torch::nn::utils::clip_grad_norm_(params, cfg.grad_clip);
      double lr = schedule.At(step);
      for (auto& g : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
      optimizer.step();
      optimizer.zero_grad();
      state.step = step;
      state.tokens_seen += tokens_per_micro * cfg.grad_accum * world;
      state.samples_seen += static_cast<int64_t>(cfg.batch_size) * cfg.grad_accum * world;
      current_step = step;
      agent.ReportProgress(step, total_steps);
      double step_seconds = absl::ToDoubleSeconds(absl::Now() - step_start);

      bool log_now = cfg.log_freq > 0 && (step % cfg.log_freq == 0 || step == total_steps);
      if (log_now) {
        last_loss = AllReduceMean(loss_sum / cfg.grad_accum);
        double epoch = static_cast<double>(state.epoch) +
                       static_cast<double>(state.batch) / static_cast<double>(sampler.batches_per_epoch());
        step_metrics.insert({{"loss", last_loss},
                             {"lr", lr},
                             {"grad_norm", grad_norm},
                             {"tokens_per_s", tokens_per_micro * cfg.grad_accum / step_seconds},
                             {"step_time_s", step_seconds},
                             {"data_time_s", absl::ToDoubleSeconds(data_time)},
                             {"epoch", epoch},
                             {"tokens_seen", static_cast<double>(state.tokens_seen)},
                             {"samples_seen", static_cast<double>(state.samples_seen)},
                             {"rss_bytes", static_cast<double>(RssBytes())}});
        Log(absl::StrFormat("step %d/%d loss %.4f lr %.3g grad_norm %.3f %.0f tokens/s/rank %.3fs/step epoch %.2f",
                            step, total_steps, last_loss, lr, grad_norm,
                            tokens_per_micro * cfg.grad_accum / step_seconds, step_seconds, epoch));
      }
      if (cfg.eval_freq > 0 && eval_samples >= world && (step % cfg.eval_freq == 0 || step == total_steps)) {
        double eval_loss = evaluate();
        best_eval = std::min(best_eval, eval_loss);
        step_metrics["eval_loss"] = eval_loss;
        step_metrics["perplexity"] = std::exp(eval_loss);
        Log(absl::StrFormat("step %d eval_loss %.4f perplexity %.2f", step, eval_loss, std::exp(eval_loss)));
      }
      if (cfg.ckpt_freq > 0 && step % cfg.ckpt_freq == 0) checkpoint(step);
      if (state.step == total_steps && last_checkpoint != state.step) checkpoint(state.step);
      if (reporter && !step_metrics.empty()) reporter->Add(step, step_metrics);
      step_metrics.clear();
      if (state.step < total_steps && PreemptionAgreed()) {
        // A preemption or the time limit: checkpoint this step and leave; the run is requeued
        // and the next job resumes here.
        if (last_checkpoint != state.step) checkpoint(state.step);
        if (reporter) (void)reporter->Flush(absl::Seconds(10));
        agent.StopHeartbeats();
        Check(agent.Leave(state.step, SIGUSR2));
        Log(absl::StrCat("stopped at step ", state.step, " for the scheduler (SIGUSR2: preemption or time limit); ",
                         last_checkpoint == state.step ? "checkpointed there" : "its checkpoint failed",
                         ", the job is requeued"));
        return kExitOk;
      }
      if (cfg.exit_after_step > 0 && step == cfg.exit_after_step) {
        DT_LOG(Warning) << "--exit-after-step " << step << ": vanishing without cleanup (fault injection)";
        std::_Exit(137);
      }
    }
    if (last_checkpoint != state.step && state.step > 0) checkpoint(state.step);  // resumed at the end
    if (reporter) {
      std::map<std::string, double> summary = {{"final_step", static_cast<double>(state.step)},
                                               {"tokens_seen", static_cast<double>(state.tokens_seen)}};
      if (!std::isnan(last_loss)) summary["final_loss"] = last_loss;
      if (std::isfinite(best_eval)) summary["best_eval_loss"] = best_eval;
      reporter->Summary(summary);
      (void)reporter->Flush(absl::Seconds(10));
    }
    // No heartbeat after leaving: the last rank's Leave ends the run, and a heartbeat racing it
    // would be told to stop.
    agent.StopHeartbeats();
    Check(agent.Leave(state.step));
    Log(absl::StrCat("done: ", state.step, " steps"));
    return kExitOk;
  }
};

}  // namespace

int RunTrainer(const TrainerConfig& cfg) {
  ClientOptions options;
  options.address = cfg.coordinator;
  options.token = cfg.token;
  options.tls_ca_file = cfg.tls_ca;
  absl::StatusOr<std::shared_ptr<CoordinatorClient>> client = CoordinatorClient::Connect(options);
  if (!client.ok()) {
    std::cerr << "dttrainer: " << client.status().message() << "\n";
    return kExitUsage;
  }
  std::string run_id = cfg.run_id;
  if (run_id.empty()) {
    // Bring your own sbatch: trainers of one job create or join the same run.
    JoinRunSpec join{cfg.experiment_name, cfg.save_dir, cfg.expect_nodes, cfg.expect_procs_per_node,
                     cfg.max_restarts, cfg.argv, {}};
    absl::StatusOr<std::string> run = CreateOrJoinRun(**client, join);
    if (!run.ok()) {
      std::cerr << "dttrainer: cannot create or join the run for experiment " << cfg.experiment_name
                << ": " << run.status() << "\n";
      return run.status().code() == absl::StatusCode::kUnavailable ? kExitFailed : kExitUsage;
    }
    run_id = *run;
  }

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
  Agent agent(*client, id);
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
    std::cerr << "dttrainer (node " << cfg.node << ", slot " << cfg.local_slot
              << "): registration with run " << run_id << " at " << cfg.coordinator << " failed: "
              << assigned.status() << "\n";
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
  std::string message, type;
  bool collective = false;
  bool fatal = false;
  int code = kExitFailed;
  try {
    return trainer.Run();
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
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
    type = "c10::Error";
  } catch (const std::exception& e) {
    message = e.what();
    type = "std::exception";
  }
  if (collective) {
    // Usually the echo of another rank's failure: give the coordinator time to detect it (a silent
    // peer, or one stopped from outside, takes the heartbeat timeout from before this error) and
    // stop this process with the real cause: its check runs a few times a second and the stop
    // arrives with the next heartbeat, so a second beyond that for a loaded machine.
    const v1::TimeoutPolicy& t = assigned->timeouts();
    absl::Duration window =
        absl::Milliseconds(t.heartbeat_timeout_ms() + 3 * t.heartbeat_interval_ms()) + absl::Seconds(1);
    DT_LOG(Warning) << message << " — waiting up to " << absl::FormatDuration(window)
                    << " for the coordinator to name the cause";
    absl::SleepFor(window);
  }
  DT_LOG(Error) << type << ": " << message;
  absl::Status reported = agent.ReportError(message, type, "", step.load(), fatal);
  if (!reported.ok()) DT_LOG(Warning) << "could not report the error: " << reported;
  agent.StopHeartbeats();
  return code;
}

}  // namespace dt
