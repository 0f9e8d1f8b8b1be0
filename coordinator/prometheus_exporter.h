// The coordinator's Prometheus endpoint (prometheus-cpp): training series per run and rank
// (labels run, experiment, rank, node) fed by the metric stream, and coordinator health (ranks,
// runs by state, RPC latency, barrier waits, checkpoint rounds, heartbeat misses, the W&B queue).
// Series of ended runs go away after a grace period; the number of rank series is capped, with a
// counter of what was left out.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "coordinator/observers.h"

class CivetServer;

namespace dt {

// prometheus-cpp's text with every sample value in the exposition format's spelling: NaN, not
// "Nan" (prometheus-cpp 1.0). A sample's value is the last token of its line (no timestamps).
std::string ExpositionText(std::string text);

struct ExporterOptions {
  std::string listen = "127.0.0.1:9464";  // port 0: any free port
  absl::Duration ended_run_grace = absl::Minutes(5);
  int64_t max_rank_series = 10'000;  // runs × ranks exported at most
};

class PrometheusExporter : public RunObserver, public RpcObserver, public CoordinatorStats, public ForwarderStats {
 public:
  // Serves /metrics; UNAVAILABLE naming the address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<PrometheusExporter>> Start(const ExporterOptions& options,
                                                                   const Coordinator* coordinator);
  ~PrometheusExporter() override;

  // "host:port" actually bound.
  const std::string& address() const { return address_; }
  // The text a scrape returns (also for tests without HTTP).
  std::string Render() const;
  // Removes series of runs that ended more than the grace period ago (the exporter's thread does
  // this every few seconds).
  void Prune();

  void OnRunChanged(const v1::Run& run) override;
  void OnMetrics(const v1::Run& run, const v1::MetricBatch& batch) override;
  void OnRpcDone(const char* method, absl::StatusCode code, absl::Duration latency) override;
  void ObserveBarrierWait(absl::Duration waited) override;
  void ObserveCheckpointRound(bool committed, absl::Duration took, int64_t bytes) override;
  void CountHeartbeatMiss() override;
  void SetWandbQueue(int64_t points) override;
  void CountWandbRequest(int http_code) override;
  void CountDroppedPoints(const char* reason, int64_t points) override;

 private:
  PrometheusExporter(const ExporterOptions& options, const Coordinator* coordinator);

  struct RankSeries {
    prometheus::Gauge* loss = nullptr;
    prometheus::Gauge* lr = nullptr;
    prometheus::Gauge* grad_norm = nullptr;
    prometheus::Gauge* tokens_per_second = nullptr;
    prometheus::Gauge* eval_loss = nullptr;
    prometheus::Gauge* last_step = nullptr;
    prometheus::Gauge* up = nullptr;
    prometheus::Histogram* step_time = nullptr;
    prometheus::Counter* tokens_seen = nullptr;
    double tokens_seen_value = 0;
    prometheus::Labels labels;
  };
  struct RunSeries {
    std::map<int, RankSeries> ranks;
    absl::Time ended = absl::InfiniteFuture();
    uint64_t revision = 0;
    int world_size = 0;  // of the newest snapshot seen (OnRunChanged); 0: none yet
  };
  RankSeries* SeriesFor(const v1::Run& run, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The series a metric name feeds, decided once per name (a column holds many points' values).
  enum class Feed { kNone, kLoss, kLr, kGradNorm, kTokensPerSecond, kEvalLoss, kStepTime, kTokensSeen };
  static Feed FeedOf(absl::string_view name);
  // One value of a rank's `feed`, `world` ranks sharing the run's tokens.
  void Apply(RankSeries& s, Feed feed, double value, int world) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveRank(RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  class CensusCollectable;
  class ScrapeHandler;

  ExporterOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<CensusCollectable> census_;
  // /metrics is served by CivetWeb directly rather than prometheus::Exposer, whose serializer's
  // output is passed through ExpositionText (prometheus-cpp 1.0 prints NaN as "Nan").
  std::unique_ptr<ScrapeHandler> handler_;
  std::unique_ptr<CivetServer> server_;
  std::string address_;

  mutable absl::Mutex mu_;
  std::map<std::string, RunSeries> runs_ ABSL_GUARDED_BY(mu_);
  int64_t rank_series_ ABSL_GUARDED_BY(mu_) = 0;

  prometheus::Family<prometheus::Gauge>* loss_;
  prometheus::Family<prometheus::Gauge>* lr_;
  prometheus::Family<prometheus::Gauge>* grad_norm_;
  prometheus::Family<prometheus::Gauge>* tokens_per_second_;
  prometheus::Family<prometheus::Gauge>* eval_loss_;
  prometheus::Family<prometheus::Gauge>* last_step_;
  prometheus::Family<prometheus::Gauge>* rank_up_;
  prometheus::Family<prometheus::Histogram>* step_time_;
  prometheus::Family<prometheus::Counter>* tokens_seen_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  prometheus::Histogram* barrier_wait_;
  prometheus::Family<prometheus::Histogram>* checkpoint_seconds_;
  prometheus::Counter* checkpoint_bytes_;
  prometheus::Counter* heartbeat_misses_;
  prometheus::Gauge* wandb_queue_;
  prometheus::Family<prometheus::Counter>* wandb_requests_;
  prometheus::Family<prometheus::Counter>* dropped_;
  prometheus::Counter* points_ingested_;
  prometheus::Counter* series_omitted_;

  absl::Notification stop_;
  std::thread pruner_;
};

}  // namespace dt
