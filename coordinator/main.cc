// dtcoord: the dt coordinator server.
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <tuple>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"

#include "absl/strings/str_cat.h"
#include "common/cli_checks.h"
#include "common/duration.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/stop_signals.h"
#include "common/timeout_policy.h"
#include "common/version.h"
#include "coordinator/dtcoord.h"

namespace {

std::string DefaultStateDir() {
  const char* home = std::getenv("HOME");
  return dt::JoinPath(home != nullptr && *home != '\0' ? home : "/tmp", ".dt/coord");
}

int Fail(const std::string& message) {
  DT_LOG(Error) << message;
  return 1;
}

// What the command line holds before it becomes DtcoordOptions (durations and modes as text).
struct CommandLine {
  dt::ServerOptions server;
  dt::CoordinatorOptions coordinator;
  std::string state_dir = DefaultStateDir();
  std::string metrics_listen = "127.0.0.1:9464";
  std::string http_listen = "off";
  std::string heartbeat_interval = "2s", heartbeat_timeout = "30s", hang_timeout = "10m", rendezvous_timeout = "10m";
  std::string wandb_post_interval = "2s", wandb_retry_base = "2s";
  int64_t wandb_spool_bytes = int64_t{1} << 30;
  int wandb_workers = 4;
  std::string checkpoint_verify = "sizes";
};

void DeclareListeners(CLI::App& app, CommandLine& c) {
  app.add_option("--listen", c.server.listen, "gRPC address HOST:PORT (port 0: any free port)")
      ->check(dt::HostPort(/*port_zero_ok=*/true))
      ->capture_default_str();
  app.add_option("--state-dir", c.state_dir, "where the SQLite state and admin.token live")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must not be empty") : ""; }, "DIR"))
      ->capture_default_str();
  app.add_option("--metrics-listen", c.metrics_listen, "Prometheus /metrics address HOST:PORT; 'off' disables it")
      ->check(dt::HostPort(true, "off"))
      ->capture_default_str();
  app.add_option("--http-listen", c.http_listen,
                 "the read-only web console HOST:PORT (runs, ranks, charts, checkpoints, logs; sign in with the admin "
                 "or a run token); off by default; loopback addresses only (reach it from elsewhere through an SSH "
                 "tunnel)")
      ->check(dt::HostPort(true, "off"))
      ->capture_default_str();
  app.add_option("--tls-cert", c.server.tls_cert, "PEM certificate (with --tls-key: serve TLS)");
  app.add_option("--tls-key", c.server.tls_key, "PEM private key");
}

void DeclarePolicy(CLI::App& app, CommandLine& c) {
  app.add_option("--heartbeat-interval", c.heartbeat_interval, "how often trainers heartbeat")->capture_default_str();
  app.add_option("--heartbeat-timeout", c.heartbeat_timeout, "a rank silent this long is declared dead")
      ->capture_default_str();
  app.add_option("--hang-timeout", c.hang_timeout, "a group whose step has not advanced this long is declared hung")
      ->capture_default_str();
  app.add_option("--rendezvous-timeout", c.rendezvous_timeout,
                 "how long a generation may take to register every rank (also the init timeout)")
      ->capture_default_str();
  app.add_option("--store-bytes-per-run", c.coordinator.store_bytes_per_run,
                 "most bytes (keys plus values) one run may keep in its store, e.g. 256MiB")
      ->transform(CLI::AsSizeValue(false))
      ->check(dt::AtLeast(1))
      ->capture_default_str();
  app.add_option("--store-bytes-total", c.coordinator.store_bytes_total,
                 "most bytes every run's store may keep together, e.g. 2GiB")
      ->transform(CLI::AsSizeValue(false))
      ->check(dt::AtLeast(1))
      ->capture_default_str();
  app.add_option("--metric-bytes-per-run", c.coordinator.metric_bytes_per_run,
                 "most bytes of one run's metric batches held while they wait to be stored (a run sending faster "
                 "than the disk stores is told to send again later), e.g. 64MiB; at least 1MiB, one batch")
      ->transform(CLI::AsSizeValue(false))
      ->check(dt::AtLeast(static_cast<int64_t>(dt::kMaxMetricBatchBytes)))
      ->capture_default_str();
  app.add_option("--max-ranks", c.coordinator.max_ranks,
                 "most ranks of every run not yet ended together; a submission past it is refused "
                 "(RESOURCE_EXHAUSTED), so the runs admitted keep the coordinator (docs/guide/operating-dtcoord.md: "
                 "what a rank costs)")
      ->check(dt::AtLeast(1))
      ->capture_default_str();
  app.add_option("--preflight-slowdown", c.coordinator.preflight.slowdown_limit,
                 "a rank whose device pre-flight (a timed matrix multiply before its first step) takes more than "
                 "this many times the median of the run's ranks is unhealthy: on Slurm its node is excluded")
      ->check(dt::NumberAtLeast(1.5))
      ->capture_default_str();
  app.add_option("--checkpoint-verify", c.checkpoint_verify,
                 "what a checkpoint commit checks before publishing: 'sizes' (each listed file present at its size; "
                 "the SHA-256 digests its writer computed are recorded and checked by the rank that loads it and by "
                 "dtctl checkpoints --verify) or 'digests' (also re-read and hash every byte here, on this machine)")
      ->capture_default_str();
  app.add_option("--wandb-post-interval", c.wandb_post_interval,
                 "at most one W&B post per W&B run this often (W&B settings come from WANDB_* variables)")
      ->capture_default_str();
  app.add_option("--wandb-retry-base", c.wandb_retry_base,
                 "first W&B retry delay; doubles to 60s, with jitter, or as Retry-After says")
      ->capture_default_str();
  app.add_option("--wandb-spool-bytes", c.wandb_spool_bytes,
                 "most bytes of points one W&B run's spool holds that W&B has not accepted (W&B unreachable): "
                 "past it newer points skip W&B (counted as dropped) until W&B catches up; the run's history "
                 "keeps them")
      ->transform(CLI::AsSizeValue(false))
      ->check(dt::AtLeast(static_cast<int64_t>(dt::kMaxMetricBatchBytes)))
      ->capture_default_str();
  app.add_option("--wandb-workers", c.wandb_workers, "threads posting to W&B")
      ->check(dt::AtLeast(1))
      ->capture_default_str();
}

// The parsed command line as DtcoordOptions; a usage error says what was wrong.
absl::StatusOr<dt::DtcoordOptions> ToOptions(const CommandLine& c) {
  dt::CoordinatorOptions options = c.coordinator;
  options.version = dt::kVersion;
  struct {
    const char* flag;
    const std::string& text;
    absl::Duration* out;
  } durations[] = {{"--heartbeat-interval", c.heartbeat_interval, &options.timeouts.heartbeat_interval},
                   {"--heartbeat-timeout", c.heartbeat_timeout, &options.timeouts.heartbeat_timeout},
                   {"--hang-timeout", c.hang_timeout, &options.timeouts.hang_timeout},
                   {"--rendezvous-timeout", c.rendezvous_timeout, &options.timeouts.rendezvous_timeout}};
  for (auto& d : durations) {
    absl::StatusOr<absl::Duration> parsed = dt::ParsePositiveDuration(d.flag, d.text);
    if (!parsed.ok()) return parsed.status();
    *d.out = *parsed;
  }
  if (absl::Status s = dt::ValidateTimeouts(options.timeouts); !s.ok()) return s;
  if (c.http_listen != "off") {
    if (absl::Status s = dt::ValidateConsoleListen(c.http_listen); !s.ok()) return s;
  }
  if (c.checkpoint_verify != "sizes" && c.checkpoint_verify != "digests") {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-verify must be 'sizes' or 'digests', got '", c.checkpoint_verify, "'"));
  }
  options.checkpoint_verification =
      c.checkpoint_verify == "digests" ? dt::CheckpointVerification::kDigests : dt::CheckpointVerification::kSizes;
  options.health_check_period =
      std::clamp(options.timeouts.heartbeat_interval / 4, absl::Milliseconds(20), absl::Seconds(1));

  dt::DtcoordOptions out;
  out.state_dir = c.state_dir;
  out.coordinator = options;
  out.server = c.server;
  out.metrics_listen = c.metrics_listen;
  out.http_listen = c.http_listen;
  dt::wandb::ForwarderOptions& fo = out.wandb.emplace();
  fo.env = dt::wandb::WandbEnvironment();
  fo.workers = c.wandb_workers;
  fo.max_spool_bytes = c.wandb_spool_bytes;
  for (auto [flag, text, to] : {std::tuple{"--wandb-post-interval", &c.wandb_post_interval, &fo.post_interval},
                                std::tuple{"--wandb-retry-base", &c.wandb_retry_base, &fo.retry_base}}) {
    absl::StatusOr<absl::Duration> d = dt::ParsePositiveDuration(flag, *text);
    if (!d.ok()) return d.status();
    *to = *d;
  }
  return out;
}

// Fills `out` from the command line and the WANDB_* environment; an exit code when the process
// should end here (0 after --help or --version, 2 on a usage error, said on stderr).
std::optional<int> ParseCommandLine(int argc, char** argv, dt::DtcoordOptions& out) {
  CLI::App app{"dtcoord: the dt coordinator (rendezvous, store, barriers, health, checkpoints, metrics)"};
  app.set_version_flag("--version", std::string(dt::kVersion));
  // A later occurrence of a flag overrides an earlier one (service files append to defaults).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  CommandLine c;
  DeclareListeners(app, c);
  DeclarePolicy(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dt::ExitOnParseError(app, e, "dtcoord");
  }
  absl::StatusOr<dt::DtcoordOptions> options = ToOptions(c);
  if (!options.ok()) {
    std::cerr << "dtcoord: " << options.status().message() << " (see dtcoord --help)\n";
    return 2;
  }
  out = std::move(*options);
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  // absl's lock-order checking costs a graph update per lock; the tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // The W&B forwarder's posts (up to 8 MB, their spool reads and history text as large) were blocks
  // past glibc's 128 KiB mmap threshold: a fresh mapping, faulted in and zeroed, at every post
  // (9,000-14,000 page faults a second under metric ingest; bench/findings.md, 12-02). Blocks up to
  // 32 MB come from the heap instead, and an arena keeps up to 32 MB free at its top: half a
  // thread heap's 64 MB, so a thread's heap still shrinks after a peak.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 32 << 20);
  dt::SetLogProgram("dtcoord");
  dt::DtcoordOptions dtcoord;
  if (std::optional<int> code = ParseCommandLine(argc, argv, dtcoord)) return *code;
  const dt::CoordinatorTimeouts& timeouts = dtcoord.coordinator.timeouts;
  const std::string& state_dir = dtcoord.state_dir;
  // SIGTERM/SIGINT are waited for in main: block them before any thread starts.
  dt::BlockStopSignals();
  absl::StatusOr<std::unique_ptr<dt::Dtcoord>> server = dt::Dtcoord::Start(dtcoord);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  std::string metrics = (*server)->metrics_address();
  std::string console = (*server)->console_url();
  DT_LOG(Info) << "dtcoord " << dt::kVersion << " serving on " << (*server)->address() << " (state dir " << state_dir
               << ", admin token in " << dt::JoinPath(state_dir, "admin.token") << "; heartbeat "
               << absl::FormatDuration(timeouts.heartbeat_interval) << "/"
               << absl::FormatDuration(timeouts.heartbeat_timeout) << ", hang "
               << absl::FormatDuration(timeouts.hang_timeout) << ", rendezvous "
               << absl::FormatDuration(timeouts.rendezvous_timeout) << ")"
               << (metrics.empty() ? "" : absl::StrCat("; Prometheus metrics on http://", metrics, "/metrics"))
               << (console.empty() ? "" : absl::StrCat("; web console on ", console));

  int sig = dt::WaitForStopSignal();
  DT_LOG(Info) << "received " << dt::SignalName(sig) << ": draining in-flight calls (up to 5s)";
  (*server)->Shutdown(absl::Seconds(5));
  DT_LOG(Info) << "stopped";
  return 0;
}
