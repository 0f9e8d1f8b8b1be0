#include "coordinator/state_db.h"

#include <sqlite3.h>

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/metric_points.h"
#include "common/proto_time.h"

namespace dt {
namespace {

constexpr int kSchemaVersion = 5;  // 4: rank_progress; 5: metric_batches_by_run dropped

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS runs(
  run_id TEXT PRIMARY KEY,
  exp_dir TEXT NOT NULL,
  join_key TEXT NOT NULL DEFAULT '',
  state INTEGER NOT NULL,
  created_at REAL NOT NULL,
  token_sha256 TEXT NOT NULL,
  resume_from TEXT NOT NULL DEFAULT '',
  record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runs_by_join_key ON runs(join_key);
CREATE TABLE IF NOT EXISTS ranks(
  run_id TEXT NOT NULL, rank INTEGER NOT NULL, record TEXT NOT NULL,
  PRIMARY KEY(run_id, rank));
-- Every rank's progress (a RankProgress), newer than the ranks' rows it was written after.
CREATE TABLE IF NOT EXISTS rank_progress(run_id TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS failures(
  run_id TEXT NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS failures_by_run ON failures(run_id, seq);
CREATE TABLE IF NOT EXISTS checkpoints(
  run_id TEXT NOT NULL, step INTEGER NOT NULL, record TEXT NOT NULL,
  PRIMARY KEY(run_id, step));
-- One row per received batch (cheap to write at ingestion rates); readers decode the points.
-- A point resent after a broken stream, or re-logged by a restarted generation, supersedes the
-- earlier one with the same rank, step and metric names (see QueryMetrics).
CREATE TABLE IF NOT EXISTS metric_batches(
  run_id TEXT NOT NULL, rank INTEGER NOT NULL, first_step INTEGER NOT NULL, last_step INTEGER NOT NULL,
  points BLOB NOT NULL);
-- Databases of schema 4 and before had an index on (run_id, last_step). SQLite's planner chose it
-- for QueryMetrics and then sorted every later batch, blobs and all, before the first row came
-- back (3.5 s for a page of a 160,000-batch run), and every batch ingested paid for it.
DROP INDEX IF EXISTS metric_batches_by_run;
-- Stack captures: every hang's, and a run's latest on-demand ones (the body is a StackCapture).
CREATE TABLE IF NOT EXISTS stack_captures(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, generation INTEGER NOT NULL,
  live INTEGER NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS stack_captures_by_run ON stack_captures(run_id, seq);
-- QueryMetrics reads a run's batches in step order and stops early: covering for its filter.
CREATE INDEX IF NOT EXISTS metric_batches_by_first_step
  ON metric_batches(run_id, first_step, last_step, rank);
)sql";

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

absl::Status FromJson(const std::string& json, google::protobuf::Message* m) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // rows written by a newer dtcoord
  auto status = google::protobuf::util::JsonStringToMessage(json, m, options);
  if (!status.ok()) return absl::DataLossError(absl::StrCat("corrupt state row: ", status.ToString()));
  return absl::OkStatus();
}

std::string ColumnText(sqlite3_stmt* st, int i) {
  const unsigned char* text = sqlite3_column_text(st, i);
  return text ? std::string(reinterpret_cast<const char*>(text), sqlite3_column_bytes(st, i)) : "";
}

// Resets a cached statement when the scope ends, whatever path it takes.
struct StatementReset {
  sqlite3_stmt* st;
  ~StatementReset() {
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
  }
};

void BindText(sqlite3_stmt* st, int i, const std::string& s) {
  sqlite3_bind_text(st, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateDb>> StateDb::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("cannot open state database ", path, ": ", msg));
  }
  std::unique_ptr<StateDb> state(new StateDb(db));
  absl::MutexLock lock(&state->mu_);
  sqlite3_busy_timeout(db, 5000);
  // 16 KiB pages for a new database (an existing one keeps its own): metric batches are most of
  // what is written, and SQLite writes the log a page at a time (a header and a page, two writes
  // per page, and a third when checkpointed). With 4 KiB pages that was 42,000 writes a second
  // under ingest, which read about 0.8x of what it reads with 16 KiB (bench/findings.md, 12-02).
  for (const char* pragma : {"PRAGMA page_size=16384;", "PRAGMA journal_mode=WAL;", "PRAGMA synchronous=NORMAL;",
                             "PRAGMA foreign_keys=ON;"}) {
    if (absl::Status s = state->Exec(pragma); !s.ok()) return s;
  }
  if (absl::Status s = state->CheckIsOurs(path); !s.ok()) return s;
  if (absl::Status s = state->Exec(kSchema); !s.ok()) return s;
  if (absl::Status s = state->Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion, ";").c_str()); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<WalCheckpointer>> checkpointer = WalCheckpointer::Start(path, db);
  if (!checkpointer.ok()) return checkpointer.status();
  state->checkpointer_ = std::move(*checkpointer);
  absl::MutexLock read_lock(&state->read_mu_);
  if (sqlite3_open_v2(path.c_str(), &state->read_db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX, nullptr) !=
      SQLITE_OK) {
    std::string msg = state->read_db_ ? sqlite3_errmsg(state->read_db_) : "out of memory";
    return absl::FailedPreconditionError(absl::StrCat("cannot open state database ", path, " for reading: ", msg));
  }
  sqlite3_busy_timeout(state->read_db_, 5000);
  return state;
}

StateDb::StateDb(sqlite3* db) : db_(db) {}

absl::Status StateDb::CheckIsOurs(const std::string& path) {
  sqlite3_stmt* st = Prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
  if (st == nullptr) return Error("read the schema");
  StatementReset reset{st};
  std::vector<std::string> tables;
  while (sqlite3_step(st) == SQLITE_ROW) tables.push_back(ColumnText(st, 0));
  if (tables.empty() || std::find(tables.begin(), tables.end(), "runs") != tables.end()) return absl::OkStatus();
  if (tables.size() > 8) tables.resize(8);
  return absl::FailedPreconditionError(
      absl::StrCat("the state database ", path, " is another program's SQLite database (tables ",
                   absl::StrJoin(tables, ", "), "), not dtcoord's: move it away, or give dtcoord another --state-dir"));
}

StateDb::~StateDb() {
  {
    absl::MutexLock read_lock(&read_mu_);
    sqlite3_close(read_db_);
  }
  absl::MutexLock lock(&mu_);
  checkpointer_.reset();
  for (auto& [sql, st] : cache_) sqlite3_finalize(st);
  sqlite3_close(db_);
}

absl::Status StateDb::Error(const char* what) {
  return absl::InternalError(absl::StrCat("state database: ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status StateDb::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("state database: ", msg));
  }
  return absl::OkStatus();
}

absl::Status StateDb::Commit() {
  absl::Status s = Exec("COMMIT;");
  // A failed COMMIT (a full disk, an I/O error) can leave the transaction open, and every later
  // BEGIN would fail until a restart.
  if (!s.ok()) (void)Exec("ROLLBACK;");
  return s;
}

sqlite3_stmt* StateDb::Prepare(const char* sql) {
  for (auto& [text, st] : cache_) {
    if (text == sql) return st;
  }
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr) != SQLITE_OK) {
    return nullptr;
  }
  cache_.emplace_back(sql, st);
  return st;
}

absl::Status StateDb::SaveRun(const StoredRun& run) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = Prepare(
      "INSERT INTO runs(run_id, exp_dir, join_key, state, created_at, token_sha256, resume_from, record) "
      "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT(run_id) DO UPDATE SET "
      "state=excluded.state, record=excluded.record, resume_from=excluded.resume_from");
  if (st == nullptr) return Error("prepare SaveRun");
  StatementReset reset{st};
  v1::Run record = run.run;
  record.clear_ranks();
  record.clear_failures();
  BindText(st, 1, record.run_id());
  BindText(st, 2, record.exp_dir());
  BindText(st, 3, run.join_key);
  sqlite3_bind_int(st, 4, record.state());
  sqlite3_bind_double(st, 5, static_cast<double>(record.created_at().seconds()) + record.created_at().nanos() * 1e-9);
  BindText(st, 6, run.token_sha256);
  BindText(st, 7, run.resume_from ? ToJson(*run.resume_from) : "");
  BindText(st, 8, ToJson(record));
  if (sqlite3_step(st) != SQLITE_DONE) return Error("save run");
  return absl::OkStatus();
}

absl::Status StateDb::SaveRanks(const std::string& run_id, const std::vector<v1::RankStatus>& ranks) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE;"); !s.ok()) return s;
  sqlite3_stmt* del = Prepare("DELETE FROM ranks WHERE run_id = ?1");
  sqlite3_stmt* ins = Prepare("INSERT INTO ranks(run_id, rank, record) VALUES(?1, ?2, ?3)");
  if (del == nullptr || ins == nullptr) {
    (void)Exec("ROLLBACK;");
    return Error("prepare SaveRanks");
  }
  {
    StatementReset reset{del};
    BindText(del, 1, run_id);
    if (sqlite3_step(del) != SQLITE_DONE) {
      absl::Status s = Error("delete ranks");
      (void)Exec("ROLLBACK;");
      return s;
    }
  }
  for (const auto& r : ranks) {
    StatementReset reset{ins};
    BindText(ins, 1, run_id);
    sqlite3_bind_int(ins, 2, r.rank());
    BindText(ins, 3, ToJson(r));
    if (sqlite3_step(ins) != SQLITE_DONE) {
      absl::Status s = Error("insert rank");
      (void)Exec("ROLLBACK;");
      return s;
    }
  }
  return Commit();
}

absl::Status StateDb::SaveRankProgress(const std::string& run_id, const v1::RankProgress& progress) {
  std::string record = progress.SerializeAsString();
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = Prepare(
      "INSERT INTO rank_progress(run_id, record) VALUES(?1, ?2) "
      "ON CONFLICT(run_id) DO UPDATE SET record=excluded.record");
  if (st == nullptr) return Error("prepare SaveRankProgress");
  StatementReset reset{st};
  BindText(st, 1, run_id);
  sqlite3_bind_blob(st, 2, record.data(), static_cast<int>(record.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(st) != SQLITE_DONE) return Error("save rank progress");
  return absl::OkStatus();
}

void ApplyRankProgress(const v1::RankProgress& progress, std::vector<v1::RankStatus>& ranks) {
  const size_t n = ranks.size();
  if (progress.steps_size() != static_cast<int>(n) || progress.last_heartbeat_unix_ms_size() != static_cast<int>(n) ||
      progress.pids_size() != static_cast<int>(n) || progress.idle_ms_size() != static_cast<int>(n)) {
    return;  // another generation's shape
  }
  for (size_t i = 0; i < n; ++i) {
    v1::RankStatus& rank = ranks[i];
    if (rank.generation() != progress.generation() || rank.rank() != static_cast<int>(i)) continue;
    // Steps and heartbeat times only grow within a generation: whichever write is newer wins.
    rank.set_step(std::max(rank.step(), progress.steps(i)));
    absl::Time heard = absl::FromUnixMillis(progress.last_heartbeat_unix_ms(i));
    if (heard <= FromProtoTime(rank.last_heartbeat())) continue;  // the row is as new: it holds
    *rank.mutable_last_heartbeat() = ToProtoTime(heard);
    if (progress.pids(i) > 0) rank.set_pid(progress.pids(i));
    rank.set_idle_ms(progress.idle_ms(i));
  }
}

absl::Status StateDb::AddFailure(const std::string& run_id, const v1::Failure& failure) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = Prepare("INSERT INTO failures(run_id, record) VALUES(?1, ?2)");
  if (st == nullptr) return Error("prepare AddFailure");
  StatementReset reset{st};
  BindText(st, 1, run_id);
  BindText(st, 2, ToJson(failure));
  if (sqlite3_step(st) != SQLITE_DONE) return Error("add failure");
  return absl::OkStatus();
}

absl::Status StateDb::SaveCheckpoint(const std::string& run_id, const v1::CheckpointInfo& info) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = Prepare(
      "INSERT INTO checkpoints(run_id, step, record) VALUES(?1, ?2, ?3) "
      "ON CONFLICT(run_id, step) DO UPDATE SET record=excluded.record");
  if (st == nullptr) return Error("prepare SaveCheckpoint");
  StatementReset reset{st};
  BindText(st, 1, run_id);
  sqlite3_bind_int64(st, 2, info.step());
  BindText(st, 3, ToJson(info));
  if (sqlite3_step(st) != SQLITE_DONE) return Error("save checkpoint");
  return absl::OkStatus();
}

absl::Status StateDb::SaveStackCapture(const v1::StackCapture& capture, int keep_live) {
  absl::MutexLock lock(&mu_);
  std::string body = capture.SerializeAsString();
  {
    sqlite3_stmt* st = Prepare("INSERT INTO stack_captures(run_id, generation, live, body) VALUES(?1, ?2, ?3, ?4)");
    if (st == nullptr) return Error("prepare SaveStackCapture");
    StatementReset reset{st};
    BindText(st, 1, capture.run_id());
    sqlite3_bind_int64(st, 2, capture.generation());
    sqlite3_bind_int(st, 3, capture.live() ? 1 : 0);
    sqlite3_bind_blob(st, 4, body.data(), static_cast<int>(body.size()), SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) return Error("save stack capture");
  }
  if (!capture.live()) return absl::OkStatus();
  sqlite3_stmt* st = Prepare(
      "DELETE FROM stack_captures WHERE run_id = ?1 AND live = 1 AND seq NOT IN "
      "(SELECT seq FROM stack_captures WHERE run_id = ?1 AND live = 1 ORDER BY seq DESC LIMIT ?2)");
  if (st == nullptr) return Error("prepare SaveStackCapture retention");
  StatementReset reset{st};
  BindText(st, 1, capture.run_id());
  sqlite3_bind_int(st, 2, keep_live);
  if (sqlite3_step(st) != SQLITE_DONE) return Error("retire stack captures");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::StackCapture>> StateDb::LoadStackCaptures(const std::string& run_id,
                                                                         std::optional<int64_t> generation, int limit) {
  absl::MutexLock lock(&read_mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(read_db_,
                         "SELECT body FROM stack_captures WHERE run_id = ?1 AND (?2 < 0 OR generation = ?2) "
                         "ORDER BY seq DESC LIMIT ?3",
                         -1, &st, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database: prepare LoadStackCaptures: ", sqlite3_errmsg(read_db_)));
  }
  std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> owned(st, &sqlite3_finalize);
  BindText(st, 1, run_id);
  sqlite3_bind_int64(st, 2, generation.value_or(-1));
  sqlite3_bind_int(st, 3, limit);
  std::vector<v1::StackCapture> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    v1::StackCapture& c = out.emplace_back();
    if (!c.ParseFromArray(sqlite3_column_blob(st, 0), sqlite3_column_bytes(st, 0))) {
      return absl::DataLossError(absl::StrCat("corrupt stack capture of run ", run_id));
    }
  }
  if (rc != SQLITE_DONE) {
    return absl::InternalError(absl::StrCat("state database: load stack captures: ", sqlite3_errmsg(read_db_)));
  }
  return out;
}

absl::Status StateDb::DeleteCheckpoint(const std::string& run_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* st = Prepare("DELETE FROM checkpoints WHERE run_id = ?1 AND step = ?2");
  if (st == nullptr) return Error("prepare DeleteCheckpoint");
  StatementReset reset{st};
  BindText(st, 1, run_id);
  sqlite3_bind_int64(st, 2, step);
  if (sqlite3_step(st) != SQLITE_DONE) return Error("delete checkpoint");
  return absl::OkStatus();
}

absl::Status StateDb::InsertMetricRow(const std::string& run_id, int32_t rank, int64_t first_step, int64_t last_step,
                                      const std::string& points) {
  sqlite3_stmt* st =
      Prepare("INSERT INTO metric_batches(run_id, rank, first_step, last_step, points) VALUES(?1, ?2, ?3, ?4, ?5)");
  if (st == nullptr) return Error("prepare AppendMetrics");
  StatementReset reset{st};
  BindText(st, 1, run_id);
  sqlite3_bind_int(st, 2, rank);
  sqlite3_bind_int64(st, 3, first_step);
  sqlite3_bind_int64(st, 4, last_step);
  sqlite3_bind_blob(st, 5, points.data(), static_cast<int>(points.size()), SQLITE_STATIC);
  if (sqlite3_step(st) != SQLITE_DONE) return Error("insert metrics");
  return absl::OkStatus();
}

absl::Status StateDb::AppendMetricBatches(const std::vector<MetricAppend>& appends) {
  // Serialised before the lock, whole: copying out the points alone cost more than the few bytes of
  // run id and rank stored beside them, which QueryMetrics does not read.
  struct Row {
    int64_t first = 0, last = 0;
    std::string blob;
  };
  std::vector<Row> rows(appends.size());
  bool any = false;
  for (size_t i = 0; i < appends.size(); ++i) {
    const v1::MetricBatch& batch = *appends[i].batch;
    if (MetricPointCount(batch) == 0) continue;
    any = true;
    Row& row = rows[i];
    row.first = std::numeric_limits<int64_t>::max();
    row.last = std::numeric_limits<int64_t>::min();
    auto span = [&row](int64_t step) {
      row.first = std::min(row.first, step);
      row.last = std::max(row.last, step);
    };
    for (const v1::MetricPoint& p : batch.points()) span(p.step());
    for (int64_t step : batch.columns().steps()) span(step);
    batch.SerializeToString(&row.blob);
  }
  if (!any) return absl::OkStatus();
  {
    // Before the commit: a page's reader that scanned without these rows sees their width here.
    absl::MutexLock widest_lock(&widest_mu_);
    for (size_t i = 0; i < appends.size(); ++i) {
      if (rows[i].blob.empty()) continue;
      Widest& w = widest_[*appends[i].run_id];
      w.steps = std::max(w.steps, rows[i].last - rows[i].first);
    }
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE;"); !s.ok()) return s;
  for (size_t i = 0; i < appends.size(); ++i) {
    if (rows[i].blob.empty()) continue;
    absl::Status s = InsertMetricRow(*appends[i].run_id, appends[i].rank, rows[i].first, rows[i].last, rows[i].blob);
    if (!s.ok()) {
      (void)Exec("ROLLBACK;");
      return s;
    }
  }
  return Commit();
}

absl::StatusOr<std::vector<LoadedRun>> StateDb::LoadRuns() {
  absl::MutexLock lock(&mu_);
  std::vector<LoadedRun> runs;
  std::map<std::string, size_t> index;
  {
    sqlite3_stmt* st = Prepare("SELECT record, token_sha256, join_key, resume_from FROM runs ORDER BY created_at");
    if (st == nullptr) return Error("prepare LoadRuns");
    StatementReset reset{st};
    while (sqlite3_step(st) == SQLITE_ROW) {
      LoadedRun r;
      if (absl::Status s = FromJson(ColumnText(st, 0), &r.stored.run); !s.ok()) return s;
      r.stored.token_sha256 = ColumnText(st, 1);
      r.stored.join_key = ColumnText(st, 2);
      std::string resume = ColumnText(st, 3);
      if (!resume.empty()) {
        v1::CheckpointInfo info;
        if (absl::Status s = FromJson(resume, &info); !s.ok()) return s;
        r.stored.resume_from = info;
      }
      index[r.stored.run.run_id()] = runs.size();
      runs.push_back(std::move(r));
    }
  }
  struct Child {
    const char* sql;
    int kind;
  };
  for (Child child : {Child{"SELECT run_id, record FROM ranks ORDER BY run_id, rank", 0},
                      Child{"SELECT run_id, record FROM failures ORDER BY seq", 1},
                      Child{"SELECT run_id, record FROM checkpoints ORDER BY run_id, step", 2}}) {
    sqlite3_stmt* st = Prepare(child.sql);
    if (st == nullptr) return Error("prepare LoadRuns children");
    StatementReset reset{st};
    while (sqlite3_step(st) == SQLITE_ROW) {
      auto it = index.find(ColumnText(st, 0));
      if (it == index.end()) continue;
      LoadedRun& r = runs[it->second];
      std::string json = ColumnText(st, 1);
      absl::Status s;
      if (child.kind == 0) {
        s = FromJson(json, &r.ranks.emplace_back());
      } else if (child.kind == 1) {
        s = FromJson(json, &r.failures.emplace_back());
      } else {
        s = FromJson(json, &r.checkpoints.emplace_back());
      }
      if (!s.ok()) return s;
    }
  }
  sqlite3_stmt* st = Prepare("SELECT run_id, record FROM rank_progress");
  if (st == nullptr) return Error("prepare LoadRuns progress");
  StatementReset reset{st};
  while (sqlite3_step(st) == SQLITE_ROW) {
    auto it = index.find(ColumnText(st, 0));
    if (it == index.end()) continue;
    v1::RankProgress progress;
    const void* blob = sqlite3_column_blob(st, 1);
    if (blob != nullptr && !progress.ParseFromArray(blob, sqlite3_column_bytes(st, 1))) {
      return absl::DataLossError(absl::StrCat("state database: the rank progress of run ", it->first, " is damaged"));
    }
    ApplyRankProgress(progress, runs[it->second].ranks);
  }
  return runs;
}

namespace {

// (step, rank, metric name): the order of the history and the identity of a record.
using MetricKey = std::tuple<int64_t, int32_t, std::string>;

struct StoredValue {
  int64_t rowid;  // a later batch supersedes an earlier one
  double time;
  double value;
};

// The first `limit` of `found` as a page, and where the next page starts: after the page's last
// record, or (the read stopped at `cut_at`) past every record of the steps before the cut.
StateDb::MetricPage PageOf(const std::map<MetricKey, StoredValue>& found, int32_t limit, std::optional<int64_t> cut_at,
                           int64_t batches_read) {
  StateDb::MetricPage page;
  page.batches_read = batches_read;
  for (const auto& [key, stored] : found) {
    if (static_cast<int32_t>(page.records.size()) == limit) {
      page.more = true;
      break;
    }
    v1::MetricRecord& rec = page.records.emplace_back();
    rec.set_step(std::get<0>(key));
    rec.set_rank(std::get<1>(key));
    rec.set_name(std::get<2>(key));
    rec.set_time(stored.time);
    rec.set_value(stored.value);
  }
  if (page.more) {
    const v1::MetricRecord& last = page.records.back();
    page.next.emplace();
    page.next->set_step(last.step());
    page.next->set_rank(last.rank());
    page.next->set_name(last.name());
  } else if (cut_at) {
    page.more = true;
    page.next.emplace();
    page.next->set_step(*cut_at - 1);
    page.next->set_rank(std::numeric_limits<int32_t>::max());
  }
  return page;
}

}  // namespace

absl::StatusOr<int64_t> StateDb::WidestBatch(const std::string& run_id) {
  {
    absl::MutexLock lock(&widest_mu_);
    auto it = widest_.find(run_id);
    if (it != widest_.end() && it->second.scanned) return it->second.steps;
  }
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(read_db_, "SELECT MAX(last_step - first_step) FROM metric_batches WHERE run_id = ?1", -1, &st,
                         nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("state database: prepare WidestBatch: ", sqlite3_errmsg(read_db_)));
  }
  std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> owned(st, &sqlite3_finalize);
  BindText(st, 1, run_id);
  if (sqlite3_step(st) != SQLITE_ROW) {
    return absl::InternalError(absl::StrCat("state database: widest metric batch: ", sqlite3_errmsg(read_db_)));
  }
  const int64_t stored = sqlite3_column_int64(st, 0);  // NULL (no batch) reads 0
  absl::MutexLock lock(&widest_mu_);
  Widest& w = widest_[run_id];
  w.steps = std::max(w.steps, stored);
  w.scanned = true;
  return w.steps;
}

absl::StatusOr<StateDb::MetricPage> StateDb::QueryMetrics(const MetricQuery& q) {
  const int32_t limit = std::max(q.limit, 1);
  std::optional<MetricKey> after;
  if (q.after) after = MetricKey{q.after->step(), q.after->rank(), q.after->name()};
  const int64_t from_step = std::max(q.from_step, after ? std::get<0>(*after) : q.from_step);
  std::map<MetricKey, StoredValue> found;
  int64_t batches_read = 0;
  // Whether the first limit+1 records all lie before `step`, so no batch starting there matters.
  auto settled_before = [&](int64_t step) {
    if (static_cast<int64_t>(found.size()) <= limit) return false;
    auto it = found.begin();
    std::advance(it, limit);
    return std::get<0>(it->first) < step;
  };
  std::optional<int64_t> cut_at;  // the first step a batch not read could hold (the query stopped)
  {
    absl::MutexLock lock(&read_mu_);
    absl::StatusOr<int64_t> widest = WidestBatch(q.run_id);
    if (!widest.ok()) return widest.status();
    const int64_t lowest_first_step = from_step < std::numeric_limits<int64_t>::min() + *widest
                                          ? std::numeric_limits<int64_t>::min()
                                          : from_step - *widest;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(read_db_, kMetricPageQuery, -1, &st, nullptr) != SQLITE_OK) {
      return absl::InternalError(absl::StrCat("state database: prepare QueryMetrics: ", sqlite3_errmsg(read_db_)));
    }
    std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> owned(st, &sqlite3_finalize);
    BindText(st, 1, q.run_id);
    sqlite3_bind_int64(st, 2, from_step);
    sqlite3_bind_int(st, 3, q.rank.value_or(-1));
    sqlite3_bind_int64(st, 4, lowest_first_step);
    v1::MetricBatch batch;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      int64_t first_step = sqlite3_column_int64(st, 2);
      if (settled_before(first_step)) break;
      if (batches_read >= q.max_batches) {
        cut_at = first_step;  // every record before this step has been read; later ones may not
        break;
      }
      int64_t rowid = sqlite3_column_int64(st, 0);
      int32_t rank = sqlite3_column_int(st, 1);
      ++batches_read;
      if (q.on_batch) q.on_batch();
      batch.Clear();
      if (!batch.ParseFromArray(sqlite3_column_blob(st, 3), sqlite3_column_bytes(st, 3))) {
        return absl::DataLossError(absl::StrCat("a stored metric batch of run ", q.run_id, " is corrupt"));
      }
      ForEachMetricPoint(batch, [&](const MetricPointView& p) {
        if (p.step < from_step) return;
        for (const auto& [metric, value] : p.values) {
          if (!q.name.empty() && metric != q.name) continue;
          MetricKey key{p.step, rank, std::string(metric)};
          if (after && !(*after < key)) continue;
          auto [it, inserted] = found.try_emplace(std::move(key), StoredValue{rowid, p.time, value});
          if (!inserted && it->second.rowid < rowid) it->second = StoredValue{rowid, p.time, value};
        }
      });
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
      return absl::InternalError(absl::StrCat("state database: query metrics: ", sqlite3_errmsg(read_db_)));
    }
  }
  if (cut_at) {
    // Only what precedes the cut is complete: drop the rest, and go on from the cut next time.
    found.erase(found.lower_bound(MetricKey{*cut_at, std::numeric_limits<int32_t>::min(), ""}), found.end());
  }
  return PageOf(found, limit, cut_at, batches_read);
}

}  // namespace dt
