#include "coordinator/wandb/forwarder.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/background_thread.h"
#include "common/fs.h"
#include "common/host.h"
#include "common/log.h"
#include "common/metric_points.h"
#include "common/run_env.h"
#include "common/run_state.h"

namespace dt::wandb {
namespace {

// One history row: the merged values of consecutive points with the same step.
struct Row {
  int64_t step = 0;
  double time = 0;
  size_t begin = 0, end = 0;  // its values in RowBatch::values, each name once
  int64_t points = 0;
  // The batch's consumed and skipped points before the row's first point: holding the row back
  // leaves it, and everything read after it (skipped points between its points too), unread.
  int64_t consumed_before = 0, skipped_before = 0;
};

nlohmann::json Number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// Points after the last accepted one, as history rows: consecutive points of one step merge into
// one row (a later value of a name replaces the earlier); points at or below W&B's last step are
// skipped (a replay after a restart); the batch stops once its rows are about `max_bytes`.
struct RowBatch {
  std::vector<Row> rows;
  std::vector<NamedValue> values;  // the rows' values, row after row (names index Points::names)
  int64_t consumed = 0;            // points the batch covers, skipped ones included
  int64_t skipped = 0;
};

RowBatch BatchRows(const Points& read, int64_t last_step, size_t max_bytes) {
  RowBatch b;
  b.values.reserve(read.values.size());
  // Where each name's value sits in the last row: merging a point into it costs one lookup per
  // value, however wide the row. Valid for a name while its row_of entry is that row's number.
  std::vector<size_t> slot(read.names.size());
  std::vector<size_t> row_of(read.names.size(), 0);
  auto place = [&](const NamedValue& v) {
    row_of[v.name] = b.rows.size();
    slot[v.name] = b.values.size();
    b.values.push_back(v);
  };
  size_t bytes = 0;
  for (const Points::Point& p : read.points) {
    const NamedValue* first = read.values.data() + p.begin;
    const NamedValue* last = read.values.data() + p.end;
    if (!b.rows.empty() && b.rows.back().step == p.step) {
      for (const NamedValue* v = first; v != last; ++v) {
        if (row_of[v->name] == b.rows.size()) {
          b.values[slot[v->name]].value = v->value;
        } else {
          place(*v);
        }
      }
      Row& row = b.rows.back();  // the last row: its values end the array
      row.end = b.values.size();
      ++row.points;
      ++b.consumed;
      continue;
    }
    if (p.step <= last_step) {
      ++b.consumed;
      ++b.skipped;
      continue;
    }
    if (bytes > max_bytes) break;
    b.rows.push_back(Row{p.step, p.time, b.values.size(), b.values.size(), 1, b.consumed, b.skipped});
    for (const NamedValue* v = first; v != last; ++v) place(*v);
    b.rows.back().end = b.values.size();
    bytes += 64 + (p.end - p.begin) * 48;
    last_step = p.step;
    ++b.consumed;
  }
  return b;
}

// The rows as W&B history lines (with _step, _timestamp, _runtime); `latest` gets the newest
// value of each key, for the summary.
HistoryContent HistoryLines(const RowBatch& batch, const std::vector<std::string>& names, const SpoolState& st,
                            std::map<std::string, double>* latest) {
  HistoryContent lines(names);
  lines.Reserve(batch.rows.size() * 96 + batch.values.size() * 32);  // about what a line and a value take
  auto runtime = [&](const Row& r) { return st.runtime_base + std::max(0.0, r.time - st.start_time); };
  std::vector<std::optional<double>> newest(names.size());
  for (const Row& r : batch.rows) {
    absl::Span<const NamedValue> values(batch.values.data() + r.begin, r.end - r.begin);
    lines.AddLine(r.step, r.time, runtime(r), values);
    for (const NamedValue& v : values) newest[v.name] = v.value;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (newest[i]) (*latest)[names[i]] = *newest[i];
  }
  if (!batch.rows.empty()) {
    const Row& r = batch.rows.back();
    (*latest)["_step"] = static_cast<double>(r.step);
    (*latest)["_runtime"] = runtime(r);
    (*latest)["_timestamp"] = r.time;
  }
  return lines;
}

// The run's settings (from the submit spec, else the coordinator's WANDB_* environment). The base
// URL is the coordinator's alone: the API key goes nowhere a run names.
struct Settings {
  std::string project, entity, mode, base_url, api_key, group;
  std::vector<std::string> tags;
};

Settings Resolve(const v1::Run& run, const std::map<std::string, std::string>& env) {
  auto env_or = [&](const std::string& value, const char* name) {
    if (!value.empty()) return value;
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  };
  const v1::WandbSettings& w = run.spec().wandb();
  Settings s;
  s.project = env_or(w.project(), "WANDB_PROJECT");
  s.entity = env_or(w.entity(), "WANDB_ENTITY");
  s.mode = env_or(w.mode(), "WANDB_MODE");
  if (s.mode.empty()) s.mode = "online";
  s.base_url = env_or("", "WANDB_BASE_URL");
  if (s.base_url.empty()) s.base_url = "https://api.wandb.ai";
  while (!s.base_url.empty() && s.base_url.back() == '/') s.base_url.pop_back();
  auto key = env.find("WANDB_API_KEY");
  s.api_key = key == env.end() ? "" : key->second;
  s.group = w.group().empty() ? run.spec().experiment_name() : w.group();
  s.tags.assign(w.tags().begin(), w.tags().end());
  return s;
}

// The trainer's flags as W&B config, as the seed guides log them, plus the run's shape.
std::string ConfigJson(const v1::Run& run, std::vector<std::string>* tags) {
  nlohmann::json config = nlohmann::json::object();
  const auto& args = run.spec().trainer_args();
  for (int i = 0; i < args.size(); ++i) {
    absl::string_view flag = args[i];
    if (!absl::ConsumePrefix(&flag, "--") || flag.empty()) continue;
    std::string key(flag), value = "true";
    size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    }
    double number = 0;
    config[key] = {{"value", absl::SimpleAtod(value, &number) ? nlohmann::json(number) : nlohmann::json(value)}};
    if (key == "model") tags->push_back(value);
    if (key == "dataset") {
      tags->push_back(std::filesystem::path(value).filename().string());
      struct stat st;
      if (::stat(value.c_str(), &st) == 0) config["dataset_bytes"] = {{"value", static_cast<int64_t>(st.st_size)}};
    }
  }
  config["world_size"] = {{"value", WorldSize(run.spec())}};
  config["nodes"] = {{"value", run.spec().nodes()}};
  config["procs_per_node"] = {{"value", run.spec().procs_per_node()}};
  config["experiment"] = {{"value", run.spec().experiment_name()}};
  config["dt_run_id"] = {{"value", run.run_id()}};
  // Without _wandb.t the SDK treats a run as never started.
  config["_wandb"] = {{"value", {{"t", nlohmann::json::object()}}}};
  return config.dump();
}

}  // namespace

std::map<std::string, std::string> WandbEnvironment() {
  std::map<std::string, std::string> env;
  for (const char* name :
       {"WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_MODE", "WANDB_HTTP_TIMEOUT"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') env[name] = v;
  }
  return env;
}

Forwarder::Forwarder(ForwarderOptions options, Coordinator* coordinator, ForwarderStats* stats)
    : options_(std::move(options)), coordinator_(coordinator), stats_(stats) {
  auto timeout = options_.env.find("WANDB_HTTP_TIMEOUT");
  double seconds = 0;
  if (timeout != options_.env.end() && absl::SimpleAtod(timeout->second, &seconds) && seconds > 0) {
    options_.http_timeout = absl::Seconds(seconds);
  }
}

Forwarder::~Forwarder() { Stop(); }

Forwarder::Target* Forwarder::AddTarget(std::unique_ptr<Spool> spool) {
  auto t = std::make_unique<Target>();
  const SpoolMeta& m = spool->meta();
  t->name = absl::StrCat(m.run.project, "/", m.run.run_id);
  t->offline = m.mode == "offline";
  auto key = options_.env.find("WANDB_API_KEY");
  t->api_key = key == options_.env.end() ? "" : key->second;
  if (!t->offline && t->api_key.empty()) {
    DT_LOG(Warning) << "W&B run " << t->name << ": WANDB_API_KEY is not set in the coordinator's environment; "
                    << "points are spooled until it is (restart dtcoord with it)";
    t->offline = true;
  }
  t->http = options_.http ? options_.http(t->api_key, options_.http_timeout)
                          : std::make_unique<HttpClient>(t->api_key, options_.http_timeout);
  t->spooled = spool->size();
  t->acked = spool->state().acked_points;
  t->ended = spool->state().exitcode.has_value();
  t->finished = spool->state().finished;
  t->dt_run_id = m.dt_run_id;
  t->spool = std::move(spool);
  Target* raw = t.get();
  targets_[absl::StrCat(m.run.project, "/", m.run.run_id)] = std::move(t);  // `m` lives in the spool
  return raw;
}

absl::Status Forwarder::Load() {
  std::error_code ec;
  if (!std::filesystem::exists(options_.spool_dir, ec)) return absl::OkStatus();
  std::vector<std::pair<Target*, std::string>> loaded;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& project : std::filesystem::directory_iterator(options_.spool_dir, ec)) {
      for (const auto& run : std::filesystem::directory_iterator(project.path(), ec)) {
        absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Load(run.path().string());
        if (!spool.ok()) {
          DT_LOG(Warning) << "skipping W&B spool " << run.path() << ": " << spool.status();
          continue;
        }
        if ((*spool)->state().finished) continue;
        std::string dt_run = (*spool)->meta().dt_run_id;
        loaded.emplace_back(AddTarget(std::move(*spool)), dt_run);
      }
    }
  }
  // A run that ended while the coordinator was down still gets its final post.
  for (auto& [t, dt_run] : loaded) {
    if (coordinator_ == nullptr) break;
    absl::StatusOr<v1::Run> r = coordinator_->GetRun(dt_run);
    if (r.ok() && IsTerminal(r->state())) {
      absl::MutexLock tl(&t->mu);
      t->spool->state().exitcode = r->state() == v1::SUCCEEDED ? 0 : 1;
      t->ended = true;
    }
  }
  if (!loaded.empty()) DT_LOG(Info) << "W&B forwarder: resumed " << loaded.size() << " unfinished W&B run spool(s)";
  return absl::OkStatus();
}

void Forwarder::Start() {
  absl::MutexLock lock(&mu_);
  stopping_ = false;
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

void Forwarder::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
  }
  for (auto& w : workers_) w.join();
  workers_.clear();
  std::vector<Target*> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, t] : targets_) all.push_back(t.get());
  }
  for (Target* t : all) {
    absl::MutexLock tl(&t->mu);
    t->spool->Sync(/*force=*/true);
  }
}

Forwarder::Route& Forwarder::RouteFor(const v1::Run& run) {
  auto it = routes_.find(run.run_id());
  if (it != routes_.end()) return it->second;
  Route& route = routes_[run.run_id()];
  Settings s = Resolve(run, options_.env);
  route.strategy = run.spec().log_strategy() == v1::LOG_STRATEGY_UNSPECIFIED ? v1::MAIN : run.spec().log_strategy();
  if (s.project.empty()) {
    route.reason = "no W&B project (--wandb-project or WANDB_PROJECT)";
  } else if (s.mode == "disabled") {
    route.reason = "W&B mode disabled";
  } else {
    route.enabled = true;
    DT_LOG(Info) << "run " << run.run_id() << ": forwarding metrics to W&B project " << s.project << " at "
                 << s.base_url << " (" << v1::LogStrategy_Name(route.strategy) << ", " << s.mode << ")";
  }
  return route;
}

Forwarder::Target* Forwarder::TargetFor(const v1::Run& run, Route& route, int rank, std::optional<SpoolToOpen>* open) {
  auto cached = route.by_rank.find(rank);
  if (cached != route.by_rank.end()) return cached->second;
  const v1::RankStatus* status = nullptr;
  for (const auto& r : run.ranks()) {
    if (r.rank() == rank) status = &r;
  }
  const std::string& experiment = run.spec().experiment_name();
  std::string display;
  int node_rank = 0;
  switch (route.strategy) {
    case v1::NODE:
      if (status == nullptr) return nullptr;  // not assigned yet: decide on the next batch
      if (status->local_rank() != 0) {
        route.by_rank[rank] = nullptr;
        return nullptr;
      }
      node_rank = status->node_rank();
      display = absl::StrCat("node-", node_rank);
      break;
    case v1::ALL:
      display = absl::StrCat("rank-", rank);
      break;
    default:
      if (rank != 0) {
        route.by_rank[rank] = nullptr;
        return nullptr;
      }
      display = experiment;
      break;
  }
  // The same id dtrun gives a program that calls wandb.init itself (WANDB_RUN_ID).
  std::string id = WandbRunIdFor(route.strategy, run.spec().save_dir(), experiment, rank, node_rank);
  Settings s = Resolve(run, options_.env);
  std::string key = absl::StrCat(s.project, "/", id);
  struct Opening {
    const std::set<std::string>* opening;
    const std::string* key;
  } wait{&opening_, &key};
  mu_.Await(absl::Condition(
      +[](Opening* w) { return w->opening->count(*w->key) == 0; }, &wait));
  auto existing = targets_.find(key);
  if (existing != targets_.end()) {
    route.by_rank[rank] = existing->second.get();
    if (existing->second->dt_run_id != run.run_id()) {
      existing->second->dt_run_id = run.run_id();
      rebind_.push_back({existing->second.get(), run.run_id()});
    }
    return existing->second.get();
  }
  SpoolMeta meta;
  meta.run.entity = s.entity;
  meta.run.project = s.project;
  meta.run.run_id = id;
  meta.run.display_name = display;
  meta.run.group = s.group;
  meta.run.tags = s.tags;
  meta.run.config_json = ConfigJson(run, &meta.run.tags);
  meta.run.host = status != nullptr ? status->host() : HostName();
  meta.base_url = s.base_url;
  meta.mode = s.mode;
  meta.dt_run_id = run.run_id();
  opening_.insert(key);
  *open = SpoolToOpen{key, JoinPath(JoinPath(options_.spool_dir, SanitizeRunId(s.project)), id), std::move(meta), rank};
  return nullptr;
}

Forwarder::Target* Forwarder::OpenTarget(const v1::Run& run, const SpoolToOpen& open) {
  if (options_.before_spool_open) options_.before_spool_open(open.dir);
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(open.dir, open.meta);
  // A spool of an earlier dt run of the same experiment (main strategy) continues it.
  if (spool.ok() && (*spool)->meta().dt_run_id != run.run_id()) {
    if (absl::Status st = (*spool)->Rebind(run.run_id()); !st.ok()) DT_LOG(Error) << st;
  }
  absl::MutexLock lock(&mu_);
  opening_.erase(open.key);
  if (!spool.ok()) {
    // Not routed: the rank's next batch tries again.
    DT_LOG(Error) << "W&B spool for " << open.meta.run.run_id << ": " << spool.status();
    return nullptr;
  }
  Target* t = AddTarget(std::move(*spool));
  t->dt_run_id = run.run_id();
  auto route = routes_.find(run.run_id());
  if (route != routes_.end()) route->second.by_rank[open.rank] = t;
  // A reopened spool may hold points W&B has not accepted, with nothing staged to signal them.
  work_.SignalAll();
  return t;
}

void Forwarder::OnMetrics(const v1::Run& run, const v1::MetricBatch& batch) {
  Target* target = nullptr;
  std::optional<SpoolToOpen> open;
  std::vector<std::pair<Target*, std::string>> rebind;
  {
    absl::MutexLock lock(&mu_);
    Route& route = RouteFor(run);
    if (!route.enabled) return;
    target = TargetFor(run, route, batch.rank(), &open);
    rebind.swap(rebind_);
  }
  if (open) target = OpenTarget(run, *open);
  for (auto& [t, dt_run] : rebind) {
    // A W&B run this coordinator already served now belongs to a new dt run: start a new session.
    absl::MutexLock tl(&t->mu);
    FlushStaged(*t);  // the earlier dt run's last points belong to its session
    if (absl::Status st = t->spool->Rebind(dt_run); !st.ok()) DT_LOG(Error) << st;
    t->checked = false;
    t->upserted = false;
    t->ended = false;
    t->finished = false;
  }
  if (target == nullptr) return;
  const int64_t points = MetricPointCount(batch);
  {
    absl::MutexLock tl(&target->mu);
    SpoolState& st = target->spool->state();
    if (points > 0 && st.start_time == 0) {
      st.start_time = batch.points_size() > 0 ? batch.points(0).time() : batch.columns().times(0);
    }
    for (const auto& [k, v] : batch.summary()) st.summary[k] = v;
    if (!SpoolHasRoom(*target)) {
      if (stats_ != nullptr) stats_->CountDroppedPoints("spool_full", points);
      return;
    }
    target->spool->Stage(batch);
  }
  absl::MutexLock lock(&mu_);
  if (!target->staged) {
    target->staged = true;
    staged_.push_back(target);
  }
}

void Forwarder::OnMetricPassEnd() {
  std::vector<Target*> staged;
  {
    absl::MutexLock lock(&mu_);
    staged.swap(staged_);
    for (Target* t : staged) t->staged = false;
  }
  if (staged.empty()) return;
  for (Target* target : staged) {
    absl::MutexLock tl(&target->mu);
    // A batch after the final post (a rank's last flush once the run had ended; its summary alone
    // too) reopens the W&B run.
    if (FlushStaged(*target) && target->finished) ReopenFinished(*target);
  }
  absl::MutexLock lock(&mu_);
  work_.SignalAll();  // a pass may have fed several W&B runs
}

bool Forwarder::FlushStaged(Target& t) {
  const int64_t points = t.spool->staged_points();
  if (absl::Status s = t.spool->Flush(); !s.ok()) {
    DT_LOG(Error) << s.message();
    if (stats_ != nullptr) stats_->CountDroppedPoints("spool_write_failed", points);
    return false;
  }
  t.spooled = t.spool->size();
  return true;
}

void Forwarder::Finished(Target& t) {
  SpoolState& st = t.spool->state();
  st.finished = true;
  t.finished = true;
  t.spool->StateChanged();
  // Points spooled while the final post was in flight.
  if (t.spool->size() > st.acked_points) ReopenFinished(t);
}

void Forwarder::ReopenFinished(Target& t) {
  // W&B takes no more history for a run it saw complete, so the run is resumed first, as the SDK
  // resumes one (check, upsert), then streamed, then finished again.
  t.finished = false;
  t.checked = false;
  t.upserted = false;
}

bool Forwarder::SpoolHasRoom(Target& t) {
  int64_t waiting = t.spool->unacked_bytes() + t.spool->staged_bytes();
  bool full = waiting >= options_.max_spool_bytes;
  if (full && !t.spool_full) {
    DT_LOG(Warning) << "W&B run " << t.name << ": " << waiting << " bytes of points wait for W&B, the limit of "
                    << options_.max_spool_bytes << " (dtcoord --wandb-spool-bytes): newer points are not sent to W&B "
                    << "until it catches up; the run's history keeps them (dtctl metrics)";
  } else if (!full && t.spool_full) {
    DT_LOG(Info) << "W&B run " << t.name << ": W&B caught up; spooling points again";
  }
  t.spool_full = full;
  return !full;
}

void Forwarder::OnRunChanged(const v1::Run& run) {
  if (!IsTerminal(run.state())) {
    absl::MutexLock lock(&mu_);
    auto it = routes_.find(run.run_id());
    // A new generation may place ranks on other nodes: recompute node routes.
    if (it != routes_.end() && it->second.strategy == v1::NODE) it->second.by_rank.clear();
    return;
  }
  std::vector<Target*> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, t] : targets_) {
      if (t->dt_run_id == run.run_id()) ended.push_back(t.get());
    }
  }
  for (Target* t : ended) {
    {
      absl::MutexLock tl(&t->mu);
      t->spool->state().exitcode = run.state() == v1::SUCCEEDED ? 0 : 1;
      t->spool->StateChanged();
      t->ended = true;
    }
    (void)t->spool->FlushState();
  }
  absl::MutexLock lock(&mu_);
  work_.SignalAll();
}

std::vector<WandbRunInfo> Forwarder::RunsOf(const std::string& dt_run_id) const {
  std::vector<Target*> mine;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, t] : targets_) {
      if (t->dt_run_id == dt_run_id) mine.push_back(t.get());
    }
  }
  // Targets live as long as the forwarder; their own lock comes before mu_, so it is taken after.
  std::vector<WandbRunInfo> out;
  for (Target* t : mine) {
    absl::MutexLock lock(&t->mu);
    const SpoolMeta& meta = t->spool->meta();
    WandbRunInfo info;
    info.base_url = meta.base_url;
    info.entity = t->entity.empty() ? meta.run.entity : t->entity;
    info.project = t->project.empty() ? meta.run.project : t->project;
    info.run_id = meta.run.run_id;
    info.display_name = meta.run.display_name;
    info.mode = meta.mode;
    info.spooled = t->spooled.load();
    info.accepted = t->acked.load();
    info.finished = t->finished.load();
    out.push_back(std::move(info));
  }
  return out;
}

int64_t Forwarder::QueueDepth() const {
  absl::MutexLock lock(&mu_);
  int64_t depth = 0;
  for (const auto& [key, t] : targets_) depth += t->spooled.load() - t->acked.load();
  return depth;
}

bool Forwarder::Idle() const {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, t] : targets_) {
    if (t->offline) continue;
    if (t->spooled.load() > t->acked.load() || (t->ended.load() && !t->finished.load()) || t->busy) return false;
  }
  return true;
}

absl::Time Forwarder::WorkDue(const Target& t) const {
  if (t.busy || t.offline) return absl::InfiniteFuture();
  if (t.spooled.load() > t.acked.load()) return t.due;
  if (t.ended.load() && !t.finished.load()) return t.due;
  // Keep an idle, unfinished W&B run alive.
  if (t.upserted.load() && !t.finished.load()) return std::max(t.due, t.last_post() + options_.heartbeat_after);
  return absl::InfiniteFuture();  // until new points or the run's end (both wake the workers)
}

Forwarder::Target* Forwarder::TakeDue(absl::Time* next_wake) {
  absl::Time now = options_.clock->Now();
  absl::Time next = absl::InfiniteFuture();
  Target* t = nullptr;
  for (auto& [key, target] : targets_) {
    absl::Time work = WorkDue(*target);
    if (work > now) {
      next = std::min(next, work);
    } else if (t == nullptr || target->due < t->due) {
      t = target.get();
    }
  }
  if (t != nullptr) t->busy = true;
  if (next_wake != nullptr) *next_wake = next;
  return t;
}

bool Forwarder::ServeDue() {
  Target* t = nullptr;
  {
    absl::MutexLock lock(&mu_);
    t = TakeDue();
  }
  if (t == nullptr) return false;
  Serve(*t);
  absl::MutexLock lock(&mu_);
  t->busy = false;
  return true;
}

void Forwarder::WorkerLoop() {
  // The spool already holds every point: uploading them takes the time that ingest, heartbeats
  // and the store leave (W&B caps a project's file_stream at 120 MB/s by default anyway).
  YieldToForegroundWork();
  absl::Time last_stats = absl::InfinitePast();
  while (true) {
    Target* t = nullptr;
    {
      absl::MutexLock lock(&mu_);
      absl::Time next_wake;
      while (!stopping_ && (t = TakeDue(&next_wake)) == nullptr) {
        // Sleep until a run's work falls due; new points, a run's end and Stop() signal work_
        // sooner. An idle coordinator's workers then do not wake at all.
        work_.WaitWithTimeout(&mu_, TimeToSleep(options_.clock, next_wake));
      }
      if (stopping_) {
        if (t != nullptr) t->busy = false;
        return;
      }
    }
    Serve(*t);
    {
      absl::MutexLock lock(&mu_);
      t->busy = false;
    }
    if (stats_ != nullptr && absl::Now() - last_stats > absl::Seconds(1)) {
      last_stats = absl::Now();
      stats_->SetWandbQueue(QueueDepth());
    }
  }
}

void Forwarder::SetDue(Target& t, absl::Time due) {
  absl::MutexLock lock(&mu_);
  t.due = due;
}

void Forwarder::Backoff(Target& t, const HttpResult& r) {
  absl::Duration next =
      t.backoff == absl::ZeroDuration() ? options_.retry_base : std::min(t.backoff * 2, options_.retry_cap);
  t.backoff = next;
  static thread_local std::mt19937 rng(std::random_device{}());
  double jitter = std::uniform_real_distribution<double>(0.75, 1.25)(rng);
  SetDue(t, options_.clock->Now() + std::max(next * jitter, r.retry_after));
}

void Forwarder::Serve(Target& t) {
  std::optional<Request> req;
  std::optional<StreamView> stream;
  {
    absl::MutexLock tl(&t.mu);
    req = NextRequest(t, &stream);
    if (req) t.inflight = *req;
  }
  t.spool->Sync();
  if (stream) {
    StreamPost post = BuildStreamPost(*t.spool, *stream, options_.clock->Now());
    absl::MutexLock tl(&t.mu);
    req = TakeStreamPost(t, std::move(post));
    if (req) t.inflight = *req;
  }
  (void)t.spool->FlushState();
  if (!req) return;
  HttpResult r = t.http->PostJson(req->url, req->body);
  if (stats_ != nullptr) stats_->CountWandbRequest(r.code);
  {
    absl::MutexLock tl(&t.mu);
    if (r.code >= 200 && r.code < 300) {
      t.inflight.reset();
      t.backoff = absl::ZeroDuration();
      Accepted(t, *req, r);
    } else if (Retryable(r)) {
      DT_LOG(Warning) << "W&B run " << t.name << ": " << (r.code == 0 ? r.error : absl::StrCat("HTTP ", r.code))
                      << "; retrying the same request";
      Backoff(t, r);
    } else {
      t.inflight.reset();
      Refused(t, *req, r);
    }
  }
  (void)t.spool->FlushState();  // what W&B now has, written before the next request is built
}

std::optional<Forwarder::Request> Forwarder::NextRequest(Target& t, std::optional<StreamView>* stream) {
  const SpoolMeta& meta = t.spool->meta();
  if (t.inflight) return *t.inflight;
  if (!t.checked) return Request{Request::kResume, absl::StrCat(meta.base_url, "/graphql"), ResumeStatusBody(meta.run)};
  if (!t.upserted) {
    return Request{Request::kUpsert, absl::StrCat(meta.base_url, "/graphql"), UpsertBucketBody(meta.run, "")};
  }
  const SpoolState& st = t.spool->state();
  StreamView& view = stream->emplace();
  view.url = FileStreamUrl(meta.base_url, t.entity, t.project, meta.run.run_id);
  view.acked_points = st.acked_points;
  view.acked_lines = st.acked_lines;
  view.last_step = st.last_step;
  view.spooled = t.spool->size();
  view.runtime_base = st.runtime_base;
  view.start_time = st.start_time;
  view.summary = st.summary;
  view.ended = t.ended;
  return std::nullopt;
}

Forwarder::StreamPost Forwarder::BuildStreamPost(const Spool& spool, const StreamView& view, absl::Time now) const {
  StreamPost post;
  post.url = view.url;
  const size_t waiting = static_cast<size_t>(std::max<int64_t>(0, view.spooled - view.acked_points));
  absl::StatusOr<Points> points = spool.Read(view.acked_points, std::min<size_t>(waiting, 20'000));
  if (!points.ok()) {
    post.read = points.status();
    return post;
  }
  RowBatch batch = BatchRows(*points, view.last_step, options_.max_post_bytes / 2);
  std::vector<Row>& rows = batch.rows;
  post.consumed = batch.consumed;
  post.skipped = batch.skipped;
  // The newest step may still be completed by points still on their way (eval after train):
  // hold it back briefly unless the run is over.
  bool at_end = view.acked_points + post.consumed == view.spooled;
  double unix_now = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  if (!rows.empty() && at_end && !view.ended &&
      unix_now - rows.back().time < absl::ToDoubleSeconds(options_.post_interval)) {
    post.consumed = rows.back().consumed_before;
    post.skipped = rows.back().skipped_before;
    rows.pop_back();
  }
  if (rows.empty()) return post;
  SpoolState st;  // what HistoryLines reads: the runtime's origin
  st.runtime_base = view.runtime_base;
  st.start_time = view.start_time;
  std::map<std::string, double> latest;
  HistoryContent lines = HistoryLines(batch, points->names, st, &latest);
  std::map<std::string, double> summary = view.summary;
  for (const auto& [k, v] : latest) summary[k] = v;
  nlohmann::json sj = nlohmann::json::object();
  for (const auto& [k, v] : summary) sj[k] = Number(v);
  sj["_wandb"] = {{"runtime", static_cast<int64_t>(summary["_runtime"])}};
  Request& req = post.request.emplace(Request::kStream, view.url,
                                      FileStreamBody(view.acked_lines, lines, sj.dump(), std::nullopt));
  req.points = post.consumed;
  req.rows = static_cast<int64_t>(rows.size());
  req.last_step = rows.back().step;
  req.values = std::move(latest);
  return post;
}

std::optional<Forwarder::Request> Forwarder::TakeStreamPost(Target& t, StreamPost post) {
  Spool& spool = *t.spool;
  SpoolState& st = spool.state();
  absl::Time now = options_.clock->Now();
  if (!post.read.ok()) {
    // A damaged spool: say so, and look again later rather than spinning on it.
    DT_LOG(Error) << "W&B run " << t.name << ": " << post.read;
    Backoff(t, HttpResult{});
    return std::nullopt;
  }
  if (post.skipped > 0 && stats_ != nullptr) stats_->CountDroppedPoints("step_already_logged", post.skipped);
  if (post.request) return std::move(post.request);
  if (post.skipped > 0) {
    st.acked_points += post.consumed;
    t.acked = st.acked_points;
    spool.StateChanged();
    return std::nullopt;  // due now: the next step reads on
  }
  if (t.ended && st.acked_points + post.consumed == spool.size() && st.exitcode) {
    nlohmann::json sj = nlohmann::json::object();
    for (const auto& [k, v] : st.summary) sj[k] = Number(v);
    sj["_wandb"] = {{"runtime", static_cast<int64_t>(st.summary.count("_runtime") ? st.summary["_runtime"] : 0)}};
    return Request{Request::kFinal, post.url,
                   FileStreamBody(st.acked_lines, HistoryContent({}), sj.dump(), *st.exitcode)};
  }
  if (now - t.last_post() >= options_.heartbeat_after && !t.ended) {
    return Request{Request::kHeartbeat, post.url, HeartbeatBody()};
  }
  SetDue(t, now + absl::Milliseconds(200));  // a held-back row: look again soon
  return std::nullopt;
}

void Forwarder::Accepted(Target& t, const Request& req, const HttpResult& r) {
  SpoolState& st = t.spool->state();
  absl::Time now = options_.clock->Now();
  absl::Time next_due = now;
  switch (req.kind) {
    case Request::kResume: {
      absl::StatusOr<ResumeState> resume = ParseResumeStatus(r.body);
      if (!resume.ok()) {
        DT_LOG(Error) << "W&B run " << t.name << ": " << resume.status();
        Backoff(t, HttpResult{});
        return;
      }
      if (resume->exists) {
        // Continue the existing run: after its last line and its last step.
        if (st.acked_lines == 0 && st.acked_points == 0) st.runtime_base = resume->runtime;
        st.acked_lines = std::max(st.acked_lines, resume->history_lines);
        st.last_step = std::max(st.last_step, resume->last_step);
        DT_LOG(Info) << "W&B run " << t.name << " exists: resuming at history line " << st.acked_lines
                     << ", after step " << st.last_step;
      }
      t.checked = true;
      t.spool->StateChanged();
      break;
    }
    case Request::kUpsert: {
      absl::StatusOr<UpsertResult> up = ParseUpsertBucket(r.body);
      if (!up.ok()) {
        DT_LOG(Error) << "W&B run " << t.name << ": " << up.status();
        Backoff(t, HttpResult{});
        return;
      }
      t.entity = up->entity;
      t.project = up->project;
      t.upserted = true;
      break;
    }
    case Request::kStream:
      st.acked_points += req.points;
      st.acked_lines += req.rows;
      st.last_step = req.last_step;
      for (const auto& [k, v] : req.values) st.summary[k] = v;
      t.spool->StateChanged();
      t.acked = st.acked_points;
      next_due = now + options_.post_interval;
      break;
    case Request::kFinal:
      DT_LOG(Info) << "W&B run " << t.name << " finished (exit code " << st.exitcode.value_or(0) << ", "
                   << st.acked_lines << " history lines)";
      Finished(t);
      break;
    case Request::kHeartbeat:
      break;
  }
  t.last_post_ns = absl::ToUnixNanos(now);
  SetDue(t, next_due);
}

void Forwarder::Refused(Target& t, const Request& req, const HttpResult& r) {
  DT_LOG(Error) << "W&B run " << t.name << " refused a request with HTTP " << r.code << ": " << r.body.substr(0, 300);
  SpoolState& st = t.spool->state();
  if (req.kind == Request::kStream) {
    st.acked_points += req.points;
    t.acked = st.acked_points;
    t.spool->StateChanged();
    if (stats_ != nullptr) stats_->CountDroppedPoints("wandb_rejected", req.points);
  } else if (req.kind == Request::kFinal) {
    Finished(t);
  } else {
    // The run cannot be created or checked (bad key, no such entity): try again much later.
    SetDue(t, options_.clock->Now() + absl::Minutes(5));
  }
}

}  // namespace dt::wandb
