// The W&B forwarder: the coordinator's metric points go to Weights & Biases per each run's log
// strategy — main (rank 0, one W&B run with id sha1(<save_dir>/<experiment>)), node (local rank 0
// of each node), all (one W&B run per rank, "rank-<R>", id "<experiment>-<R>", grouped by the
// experiment). Ingestion only appends to a per-W&B-run spool; worker threads post from the spools
// with batching, retries (exponential backoff with jitter, Retry-After, identical bodies) and
// resume checks, so a slow or failing W&B never slows ingestion or another run, and a W&B outage,
// a 429 or a coordinator restart loses nothing and sends nothing twice.
#pragma once

#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/observers.h"
#include "coordinator/wandb/spool.h"
#include "coordinator/wandb/wandb_http.h"

namespace dt::wandb {

struct ForwarderOptions {
  std::string spool_dir;  // <state-dir>/wandb
  absl::Duration post_interval = absl::Seconds(2);
  absl::Duration retry_base = absl::Seconds(2);
  absl::Duration retry_cap = absl::Seconds(60);
  absl::Duration heartbeat_after = absl::Seconds(30);
  absl::Duration http_timeout = absl::Seconds(20);
  int workers = 4;
  size_t max_post_bytes = 8 << 20;  // W&B wants posts under ~10 MB
  // Bytes one W&B run's spool may hold that W&B has not accepted (W&B unreachable, or the API key
  // missing): past it, newer points are not spooled for W&B (counted as dropped, "spool_full")
  // until W&B catches up. The run's own history (the state database) keeps every point.
  int64_t max_spool_bytes = int64_t{1} << 30;
  // WANDB_* settings of the coordinator's environment (API key, base URL, entity, project, mode).
  std::map<std::string, std::string> env;
  const Clock* clock = RealClock::Get();
  HttpPosterFactory http;  // unset: libcurl (HttpClient)
  // Tests: called with a spool's directory before it is opened (off the forwarder's lock), to
  // stall it as a slow disk would.
  std::function<void(const std::string& dir)> before_spool_open;
};

// Reads WANDB_API_KEY, WANDB_BASE_URL, WANDB_ENTITY, WANDB_PROJECT, WANDB_MODE, WANDB_HTTP_TIMEOUT.
std::map<std::string, std::string> WandbEnvironment();

// A W&B run that a dt run's metrics go to, as the web console links it.
struct WandbRunInfo {
  std::string base_url;  // the API's, e.g. https://api.wandb.ai
  std::string entity;    // empty until W&B named the key's default entity
  std::string project;
  std::string run_id;
  std::string display_name;
  std::string mode;       // online | offline
  int64_t spooled = 0;    // points spooled for it
  int64_t accepted = 0;   // points W&B has accepted
  bool finished = false;  // its final post was accepted
};

class Forwarder : public RunObserver {
 public:
  Forwarder(ForwarderOptions options, Coordinator* coordinator, ForwarderStats* stats);
  ~Forwarder() override;

  // Reopens the spools of W&B runs that were not finished when the coordinator stopped.
  absl::Status Load();
  void Start();
  void Stop();

  void OnRunChanged(const v1::Run& run) override;
  // Stages the batch's points in its W&B run's spool; OnMetricPassEnd writes them.
  void OnMetrics(const v1::Run& run, const v1::MetricBatch& batch) override;
  // Writes each spool's staged points (one write per W&B run per pass) and wakes the workers.
  void OnMetricPassEnd() override;

  // The W&B runs of dt run `dt_run_id` (none when its metrics do not go to W&B).
  std::vector<WandbRunInfo> RunsOf(const std::string& dt_run_id) const;

  // Points spooled and not yet accepted by W&B, over every W&B run.
  int64_t QueueDepth() const;
  // True when every spool is drained and every ended run's W&B run is finished (tests, shutdown).
  bool Idle() const;
  // Takes one step of the W&B run that is due first (what each worker thread does in a loop);
  // false when none is due now. Tests drive it directly on a fake clock, with no worker started.
  bool ServeDue();

 private:
  struct Request {
    enum Kind { kResume, kUpsert, kStream, kFinal, kHeartbeat };
    Request(Kind k, std::string u, std::string b) : kind(k), url(std::move(u)), body(std::move(b)) {}
    Kind kind;
    std::string url, body;
    int64_t points = 0, rows = 0, last_step = -1;
    std::map<std::string, double> values;  // what the summary gains on success
  };

  // One W&B run's session. Defined in the class (not in the .cc) so clang's thread-safety analysis
  // sees `mu` in the ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) contracts below.
  struct Target {
    absl::Mutex mu;  // the spool's appends and state, and the session; never held across HTTP
    // Set once. Stage, Flush, state() and Rebind under `mu`; Read, Sync and FlushState are the spool's
    // own (see Spool), so a worker does them without `mu`, and ingest never waits behind them.
    std::unique_ptr<Spool> spool;
    std::string api_key;
    std::unique_ptr<HttpPoster> http;
    // Session state of this coordinator process.
    bool checked ABSL_GUARDED_BY(mu) = false;
    std::atomic<bool> upserted{false};  // also read by the scheduler
    std::string entity ABSL_GUARDED_BY(mu), project ABSL_GUARDED_BY(mu);
    std::optional<Request> inflight ABSL_GUARDED_BY(mu);  // resent byte for byte until it is accepted
    // Unix nanoseconds of the last accepted post; read by the scheduler without `mu`.
    std::atomic<int64_t> last_post_ns{std::numeric_limits<int64_t>::min()};
    absl::Time last_post() const { return absl::FromUnixNanos(last_post_ns.load()); }
    // Read by the scheduler without `mu`.
    std::atomic<int64_t> spooled{0};
    std::atomic<int64_t> acked{0};
    std::atomic<bool> ended{false};
    std::atomic<bool> finished{false};
    bool offline = false;                         // decided when the target is added, never changed
    bool spool_full ABSL_GUARDED_BY(mu) = false;  // points are being dropped: said once, until it drains
    std::string name;                             // for logs
    // Scheduling and routing (guarded by the forwarder's mu_).
    std::string dt_run_id;  // the dt run this W&B run belongs to now (the spool's copy is under `mu`)
    bool busy = false;
    bool staged = false;  // in staged_
    absl::Time due = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
  };
  struct Route {
    bool enabled = false;
    std::string reason;  // why not, for the log
    v1::LogStrategy strategy = v1::MAIN;
    std::map<int, Target*> by_rank;
  };

  Route& RouteFor(const v1::Run& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A W&B run's spool to open for a rank's first batch: reserved under mu_ (`key` in opening_),
  // opened (mkdir, fsync, reading what an earlier coordinator spooled) outside it.
  struct SpoolToOpen {
    std::string key;  // "<project>/<W&B run id>", as in targets_
    std::string dir;
    SpoolMeta meta;
    int rank = 0;
  };
  // The rank's target, or nullptr with `open` set when its spool must be opened first (nullptr
  // alone: the rank's points go nowhere). Waits while another batch opens the same spool.
  Target* TargetFor(const v1::Run& run, Route& route, int rank, std::optional<SpoolToOpen>* open)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the reserved spool outside mu_, then adds its target and routes the rank to it.
  Target* OpenTarget(const v1::Run& run, const SpoolToOpen& open) ABSL_LOCKS_EXCLUDED(mu_);
  Target* AddTarget(std::unique_ptr<Spool> spool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop();
  // The due target with the earliest due time, marked busy; nullptr when none is due. `next_wake`
  // gets when the first target not taken falls due (InfiniteFuture: none until it is signalled).
  Target* TakeDue(absl::Time* next_wake = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One step of one W&B run's protocol (resume check, upsert, a history post, the final post).
  void Serve(Target& t);
  // What a history post is built from, copied under the W&B run's lock: reading the spool and
  // building the body (milliseconds for thousands of rows) then hold no lock that ingest takes.
  struct StreamView {
    std::string url;
    int64_t acked_points = 0, acked_lines = 0, last_step = -1;
    int64_t spooled = 0;  // points in the spool when the view was taken: the post reads no further
    double runtime_base = 0, start_time = 0;
    std::map<std::string, double> summary;
    bool ended = false;
  };
  // What the spool's next points make: a history post, or points to skip (W&B has their steps).
  struct StreamPost {
    std::string url;    // the run's file_stream, as the view had it (also for a final post or a heartbeat)
    absl::Status read;  // of the spool
    std::optional<Request> request;
    int64_t consumed = 0, skipped = 0;
  };
  // The request to send next that needs no spool read (the one in flight again, byte for byte,
  // until it is accepted; a resume check; an upsert); else nullopt with `stream` set.
  std::optional<Request> NextRequest(Target& t, std::optional<StreamView>* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // The history rows after the last accepted point, batched into one file_stream post: under no lock.
  StreamPost BuildStreamPost(const Spool& spool, const StreamView& view, absl::Time now) const;
  // Under the lock again: the post; else the skipped points acknowledged, or the final post, or a
  // heartbeat; nullopt when there is nothing to send now (and `t.due` says when to look again).
  std::optional<Request> TakeStreamPost(Target& t, StreamPost post) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  void Accepted(Target& t, const Request& req, const HttpResult& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // Not retryable (400, 401, 403, 404, 409, 410): counted, and the run moves on.
  void Refused(Target& t, const Request& req, const HttpResult& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // When the target has something to send: its due time once it holds unsent points or owes its
  // final post, or when its keep-alive falls due; InfiniteFuture while it is being served, is
  // offline, or waits for points (scheduler state: called under mu_).
  absl::Time WorkDue(const Target& t) const;
  // Whether the target's spool is under max_spool_bytes of points W&B has not accepted; says so
  // in the log when that changes.
  bool SpoolHasRoom(Target& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // Writes the target's staged points to its spool; false when the write failed (the points
  // counted as dropped).
  bool FlushStaged(Target& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // W&B answered the final post (accepted or refused): the run is complete there, and reopened
  // at once when points were spooled while the post was in flight.
  void Finished(Target& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  // Points or a summary came after W&B completed the run: resume it before streaming them.
  void ReopenFinished(Target& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu);
  void Backoff(Target& t, const HttpResult& r);
  void SetDue(Target& t, absl::Time due);

  ForwarderOptions options_;
  Coordinator* coordinator_;
  ForwarderStats* stats_;

  mutable absl::Mutex mu_;
  absl::CondVar work_;
  std::map<std::string, Route> routes_ ABSL_GUARDED_BY(mu_);                     // dt run id → route
  std::map<std::string, std::unique_ptr<Target>> targets_ ABSL_GUARDED_BY(mu_);  // spool dir → target
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Existing W&B runs taken over by a new dt run, rebound outside mu_ (lock order: target, then mu_).
  std::vector<std::pair<Target*, std::string>> rebind_ ABSL_GUARDED_BY(mu_);
  // Targets with points staged since the last OnMetricPassEnd. The coordinator's passes run one
  // at a time; where they did not (tests), a pass would only flush another's points early.
  std::vector<Target*> staged_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> opening_ ABSL_GUARDED_BY(mu_);  // targets_ keys whose spool is being opened
  std::vector<std::thread> workers_;
};

}  // namespace dt::wandb
