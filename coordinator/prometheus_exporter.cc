#include "coordinator/prometheus_exporter.h"

#include <CivetServer.h>

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/metric_points.h"
#include "common/run_state.h"

namespace dt {
namespace {

using prometheus::Histogram;

const Histogram::BucketBoundaries& StepBuckets() {
  static const Histogram::BucketBoundaries b = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
  return b;
}
const Histogram::BucketBoundaries& RpcBuckets() {
  static const Histogram::BucketBoundaries b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return b;
}
const Histogram::BucketBoundaries& WaitBuckets() {
  static const Histogram::BucketBoundaries b = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800};
  return b;
}
const Histogram::BucketBoundaries& CheckpointBuckets() {
  static const Histogram::BucketBoundaries b = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800};
  return b;
}

// A family of one unlabelled gauge.
prometheus::MetricFamily OneGauge(const std::string& name, const std::string& help, double value) {
  prometheus::MetricFamily family{name, help, prometheus::MetricType::Gauge, {}};
  prometheus::ClientMetric m;
  m.gauge.value = value;
  family.metric.push_back(m);
  return family;
}

}  // namespace

// Runs by state, registered and admitted ranks (and --max-ranks), unstored metric batches, counted from the coordinator
// at scrape time.
class PrometheusExporter::CensusCollectable : public prometheus::Collectable {
 public:
  explicit CensusCollectable(const Coordinator* c) : coordinator_(c) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    Coordinator::Census census = coordinator_->TakeCensus();
    prometheus::MetricFamily runs{
        "dt_coordinator_runs", "Runs the coordinator knows, by state", prometheus::MetricType::Gauge, {}};
    for (int s = v1::PENDING; s <= v1::REQUEUED; ++s) {
      prometheus::ClientMetric m;
      m.label.push_back({"state", v1::RunState_Name(static_cast<v1::RunState>(s))});
      auto it = census.runs_by_state.find(static_cast<v1::RunState>(s));
      m.gauge.value = it == census.runs_by_state.end() ? 0 : it->second;
      runs.metric.push_back(m);
    }
    return {runs,
            OneGauge("dt_coordinator_registered_ranks", "Ranks holding an assignment in active runs",
                     census.registered_ranks),
            OneGauge("dt_coordinator_admitted_ranks",
                     "Ranks of the runs not yet ended, held against dtcoord --max-ranks from submission to end",
                     static_cast<double>(census.admitted_ranks)),
            OneGauge("dt_coordinator_max_ranks", "dtcoord --max-ranks: a submission past it is refused",
                     static_cast<double>(coordinator_->options().max_ranks)),
            OneGauge("dt_coordinator_metric_batches_unstored",
                     "Metric batches accepted and not yet stored and delivered (grows while the disk under "
                     "--state-dir stalls writes)",
                     static_cast<double>(census.metric_batches_unstored))};
  }

 private:
  const Coordinator* coordinator_;
};

PrometheusExporter::PrometheusExporter(const ExporterOptions& options, const Coordinator* coordinator)
    : options_(options), registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  auto& r = *registry_;
  loss_ = &BuildGauge().Name("dt_train_loss").Help("Training loss at the last logged step").Register(r);
  lr_ = &BuildGauge().Name("dt_train_learning_rate").Help("Learning rate at the last logged step").Register(r);
  grad_norm_ = &BuildGauge().Name("dt_train_grad_norm").Help("Gradient norm before clipping").Register(r);
  tokens_per_second_ =
      &BuildGauge().Name("dt_train_tokens_per_second").Help("Tokens per second of one rank").Register(r);
  eval_loss_ = &BuildGauge().Name("dt_train_eval_loss").Help("Held-out loss at the last evaluation").Register(r);
  last_step_ = &BuildGauge().Name("dt_train_last_step").Help("Last optimizer step a rank reported").Register(r);
  rank_up_ = &BuildGauge().Name("dt_rank_up").Help("1 while the rank is registered and healthy").Register(r);
  step_time_ = &BuildHistogram().Name("dt_train_step_time_seconds").Help("Duration of optimizer steps").Register(r);
  tokens_seen_ = &BuildCounter()
                      .Name("dt_train_tokens_seen_total")
                      .Help("Tokens this rank trained on; sum over ranks for the run")
                      .Register(r);
  rpc_duration_ = &BuildHistogram()
                       .Name("dt_coordinator_rpc_duration_seconds")
                       .Help("Time to answer RPCs (waiting calls include their wait), by method and code")
                       .Register(r);
  barrier_wait_ = &BuildHistogram()
                       .Name("dt_coordinator_barrier_wait_seconds")
                       .Help("How long ranks waited at barriers")
                       .Register(r)
                       .Add({}, WaitBuckets());
  checkpoint_seconds_ = &BuildHistogram()
                             .Name("dt_coordinator_checkpoint_round_seconds")
                             .Help("Checkpoint rounds from opening to commit or abort, by outcome")
                             .Register(r);
  checkpoint_bytes_ = &BuildCounter()
                           .Name("dt_coordinator_checkpoint_bytes_total")
                           .Help("Bytes of committed checkpoints")
                           .Register(r)
                           .Add({});
  heartbeat_misses_ = &BuildCounter()
                           .Name("dt_coordinator_heartbeat_misses_total")
                           .Help("Ranks declared dead for missing heartbeats")
                           .Register(r)
                           .Add({});
  wandb_queue_ = &BuildGauge()
                      .Name("dt_wandb_queue_points")
                      .Help("Metric points spooled but not yet accepted by W&B")
                      .Register(r)
                      .Add({});
  wandb_requests_ = &BuildCounter()
                         .Name("dt_wandb_requests_total")
                         .Help("Requests to W&B by HTTP status (0: no response)")
                         .Register(r);
  dropped_ = &BuildCounter()
                  .Name("dt_metrics_points_dropped_total")
                  .Help("Metric points not forwarded, by reason")
                  .Register(r);
  // Known reasons start at 0, so rate() and alerts see the series before the first drop.
  for (const char* reason : {"step_already_logged", "wandb_rejected", "spool_write_failed", "spool_full"}) {
    dropped_->Add({{"reason", reason}});
  }
  points_ingested_ = &BuildCounter()
                          .Name("dt_metrics_points_ingested_total")
                          .Help("Metric points received from trainers")
                          .Register(r)
                          .Add({});
  series_omitted_ = &BuildCounter()
                         .Name("dt_metrics_series_omitted_total")
                         .Help("Metric points not exported because the rank-series cap was reached")
                         .Register(r)
                         .Add({});
}

std::string ExpositionText(std::string text) {
  static constexpr std::string_view kWrong = " Nan\n";
  for (size_t at = text.find(kWrong); at != std::string::npos; at = text.find(kWrong, at + kWrong.size())) {
    size_t line = text.rfind('\n', at);
    line = line == std::string::npos ? 0 : line + 1;
    if (text[line] != '#') text.replace(at, kWrong.size(), " NaN\n");
  }
  return text;
}

class PrometheusExporter::ScrapeHandler : public CivetHandler {
 public:
  explicit ScrapeHandler(const PrometheusExporter* exporter) : exporter_(exporter) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    std::string body = ExpositionText(exporter_->Render());
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
              "Content-Length: %zu\r\nConnection: close\r\n\r\n",
              body.size());
    mg_write(conn, body.data(), body.size());
    return true;
  }

 private:
  const PrometheusExporter* const exporter_;
};

absl::StatusOr<std::unique_ptr<PrometheusExporter>> PrometheusExporter::Start(const ExporterOptions& options,
                                                                              const Coordinator* coordinator) {
  std::unique_ptr<PrometheusExporter> e(new PrometheusExporter(options, coordinator));
  e->census_ = std::make_shared<CensusCollectable>(coordinator);
  try {
    std::vector<std::string> civet_options = {"listening_ports", options.listen, "num_threads", "2"};
    e->server_ = std::make_unique<CivetServer>(civet_options);
  } catch (const std::exception&) {
    // CivetWeb's own text ("null context when constructing CivetServer") says nothing more.
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", options.listen,
                     ": the port is in use (another dtcoord?) or the address is not this "
                     "host's; choose another --metrics-listen (port 0: any free one) or off"));
  }
  std::vector<int> ports = e->server_->getListeningPorts();
  std::string host = options.listen.substr(0, options.listen.rfind(':'));
  e->address_ = absl::StrCat(host, ":", ports.empty() ? 0 : ports.front());
  e->handler_ = std::make_unique<ScrapeHandler>(e.get());
  e->server_->addHandler("/metrics", e->handler_.get());
  PrometheusExporter* self = e.get();
  e->pruner_ = std::thread([self] {
    while (!self->stop_.WaitForNotificationWithTimeout(absl::Seconds(5))) self->Prune();
  });
  return e;
}

PrometheusExporter::~PrometheusExporter() {
  stop_.Notify();
  if (pruner_.joinable()) pruner_.join();
  if (server_) server_->close();  // no scrape runs after this
  server_.reset();
}

std::string PrometheusExporter::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<prometheus::MetricFamily> census = census_->Collect();
  families.insert(families.end(), census.begin(), census.end());
  return prometheus::TextSerializer().Serialize(families);
}

PrometheusExporter::RankSeries* PrometheusExporter::SeriesFor(const v1::Run& run, int rank) {
  RunSeries& rs = runs_[run.run_id()];
  auto it = rs.ranks.find(rank);
  if (it != rs.ranks.end()) return &it->second;
  if (rank_series_ >= options_.max_rank_series) return nullptr;
  // A rank beyond the current generation (an elastic run's shrunk world): its late points are not
  // a series of the run any more. The newest snapshot decides: a batch may carry an older one.
  int world = rs.world_size > 0 ? rs.world_size : run.world_size();
  if (world > 0 && rank >= world) return nullptr;
  std::string node;
  for (const auto& r : run.ranks()) {
    if (r.rank() == rank) node = r.node();
  }
  RankSeries& s = rs.ranks[rank];
  s.labels = {{"run", run.run_id()},
              {"experiment", run.spec().experiment_name()},
              {"rank", absl::StrCat(rank)},
              {"node", node}};
  s.loss = &loss_->Add(s.labels);
  s.lr = &lr_->Add(s.labels);
  s.grad_norm = &grad_norm_->Add(s.labels);
  s.tokens_per_second = &tokens_per_second_->Add(s.labels);
  s.eval_loss = &eval_loss_->Add(s.labels);
  s.last_step = &last_step_->Add(s.labels);
  s.up = &rank_up_->Add(s.labels);
  s.step_time = &step_time_->Add(s.labels, StepBuckets());
  s.tokens_seen = &tokens_seen_->Add({{"run", run.run_id()},
                                      {"experiment", run.spec().experiment_name()},
                                      {"rank", absl::StrCat(rank)},
                                      {"node", node}});
  ++rank_series_;
  return &s;
}

void PrometheusExporter::RemoveRank(RankSeries& s) {
  loss_->Remove(s.loss);
  lr_->Remove(s.lr);
  grad_norm_->Remove(s.grad_norm);
  tokens_per_second_->Remove(s.tokens_per_second);
  eval_loss_->Remove(s.eval_loss);
  last_step_->Remove(s.last_step);
  rank_up_->Remove(s.up);
  step_time_->Remove(s.step_time);
  tokens_seen_->Remove(s.tokens_seen);
  --rank_series_;
}

void PrometheusExporter::OnRunChanged(const v1::Run& run) {
  absl::MutexLock lock(&mu_);
  RunSeries& series = runs_[run.run_id()];
  if (run.revision() < series.revision) return;  // overtaken by a newer change
  series.revision = run.revision();
  series.world_size = run.world_size();
  if (IsTerminal(run.state())) {
    auto it = runs_.find(run.run_id());
    if (it == runs_.end()) return;
    if (it->second.ended == absl::InfiniteFuture()) it->second.ended = absl::Now();
    for (auto& [rank, s] : it->second.ranks) s.up->Set(0);
    return;
  }
  // A generation of another size or on other nodes (an elastic run): the series of ranks it does
  // not have go, and a rank that is on another node now gets series labelled with it.
  for (auto it = series.ranks.begin(); it != series.ranks.end();) {
    if (run.world_size() > 0 && it->first >= run.world_size()) {
      RemoveRank(it->second);
      it = series.ranks.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& r : run.ranks()) {
    if (r.rank() < 0) continue;
    auto held = series.ranks.find(r.rank());
    if (held != series.ranks.end() && !r.node().empty() && !held->second.labels["node"].empty() &&
        held->second.labels["node"] != r.node()) {
      RemoveRank(held->second);
      series.ranks.erase(held);
    }
    RankSeries* s = SeriesFor(run, r.rank());
    if (s != nullptr) s->up->Set(r.state() == v1::RankStatus::ACTIVE ? 1 : 0);
  }
}

PrometheusExporter::Feed PrometheusExporter::FeedOf(absl::string_view name) {
  if (name == "loss") return Feed::kLoss;
  if (name == "lr") return Feed::kLr;
  if (name == "grad_norm") return Feed::kGradNorm;
  if (name == "tokens_per_s") return Feed::kTokensPerSecond;
  if (name == "eval_loss") return Feed::kEvalLoss;
  if (name == "step_time_s") return Feed::kStepTime;
  if (name == "tokens_seen") return Feed::kTokensSeen;
  return Feed::kNone;
}

void PrometheusExporter::Apply(RankSeries& s, Feed feed, double value, int world) {
  switch (feed) {
    case Feed::kNone:
      return;
    case Feed::kLoss:
      return s.loss->Set(value);
    case Feed::kLr:
      return s.lr->Set(value);
    case Feed::kGradNorm:
      return s.grad_norm->Set(value);
    case Feed::kTokensPerSecond:
      return s.tokens_per_second->Set(value);
    case Feed::kEvalLoss:
      return s.eval_loss->Set(value);
    case Feed::kStepTime:
      return s.step_time->Observe(value);
    case Feed::kTokensSeen: {
      // Trainers report the run's running total; this rank's share is a world-th of it. A
      // resumed run starts lower again, which Prometheus reads as a counter reset.
      double share = value / std::max(1, world);
      if (share >= s.tokens_seen_value) {
        s.tokens_seen->Increment(share - s.tokens_seen_value);
      } else {
        tokens_seen_->Remove(s.tokens_seen);
        s.tokens_seen = &tokens_seen_->Add(s.labels);
        s.tokens_seen->Increment(share);
      }
      s.tokens_seen_value = share;
      return;
    }
  }
}

void PrometheusExporter::OnMetrics(const v1::Run& run, const v1::MetricBatch& batch) {
  const auto points = static_cast<double>(MetricPointCount(batch));
  points_ingested_->Increment(points);
  absl::MutexLock lock(&mu_);
  RankSeries* s = SeriesFor(run, batch.rank());
  if (s == nullptr) {
    series_omitted_->Increment(points);
    return;
  }
  const int world = run.world_size();
  double last_step = s->last_step->Value();
  for (const v1::MetricPoint& p : batch.points()) {
    for (const auto& [name, value] : p.values()) Apply(*s, FeedOf(name), value, world);
    last_step = std::max(last_step, static_cast<double>(p.step()));
  }
  // Columns (after the points, in point order): a gauge takes its column's last value, a
  // histogram and the token counter every value. The batch was validated: the arrays agree.
  const v1::MetricColumns& c = batch.columns();
  const int n = c.names_size();
  for (int j = 0; j < n; ++j) {
    const Feed feed = FeedOf(c.names(j));
    if (feed == Feed::kNone) continue;
    const bool every_value = feed == Feed::kStepTime || feed == Feed::kTokensSeen;
    for (int k = 0; k < c.steps_size(); ++k) {
      const int i = every_value ? k : c.steps_size() - 1 - k;
      const size_t cell = static_cast<size_t>(i) * n + j;
      if (cell >= static_cast<size_t>(c.values_size()) || MetricValueAbsent(c, cell)) continue;
      Apply(*s, feed, c.values(static_cast<int>(cell)), world);
      if (!every_value) break;
    }
  }
  for (int64_t step : c.steps()) last_step = std::max(last_step, static_cast<double>(step));
  if (last_step > s->last_step->Value()) s->last_step->Set(last_step);
}

void PrometheusExporter::Prune() {
  absl::MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  for (auto it = runs_.begin(); it != runs_.end();) {
    if (it->second.ended != absl::InfiniteFuture() && now - it->second.ended >= options_.ended_run_grace) {
      for (auto& [rank, s] : it->second.ranks) RemoveRank(s);
      it = runs_.erase(it);
    } else {
      ++it;
    }
  }
}

void PrometheusExporter::OnRpcDone(const char* method, absl::StatusCode code, absl::Duration latency) {
  rpc_duration_->Add({{"method", method}, {"code", absl::StatusCodeToString(code)}}, RpcBuckets())
      .Observe(absl::ToDoubleSeconds(latency));
}

void PrometheusExporter::ObserveBarrierWait(absl::Duration waited) {
  barrier_wait_->Observe(absl::ToDoubleSeconds(waited));
}

void PrometheusExporter::ObserveCheckpointRound(bool committed, absl::Duration took, int64_t bytes) {
  checkpoint_seconds_->Add({{"outcome", committed ? "committed" : "aborted"}}, CheckpointBuckets())
      .Observe(absl::ToDoubleSeconds(took));
  if (committed) checkpoint_bytes_->Increment(static_cast<double>(bytes));
}

void PrometheusExporter::CountHeartbeatMiss() { heartbeat_misses_->Increment(); }

void PrometheusExporter::SetWandbQueue(int64_t points) { wandb_queue_->Set(static_cast<double>(points)); }

void PrometheusExporter::CountWandbRequest(int http_code) {
  wandb_requests_->Add({{"code", absl::StrCat(http_code)}}).Increment();
}

void PrometheusExporter::CountDroppedPoints(const char* reason, int64_t points) {
  dropped_->Add({{"reason", reason}}).Increment(static_cast<double>(points));
}

}  // namespace dt
