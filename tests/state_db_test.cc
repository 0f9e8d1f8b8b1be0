// SQLite persistence round trip.
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <tuple>

#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"

#include "common/fs.h"
#include "coordinator/state_db.h"
#include "tests/test_util.h"

namespace dt {
namespace {

// One batch of `points` from `rank`, as the coordinator's storage pass writes it.
absl::Status Append(StateDb& db, const std::string& run_id, int32_t rank, const std::vector<v1::MetricPoint>& points) {
  v1::MetricBatch batch;
  for (const v1::MetricPoint& p : points) *batch.add_points() = p;
  return db.AppendMetricBatches({StateDb::MetricAppend{&run_id, rank, &batch}});
}

TEST(StateDb, RoundTripsRunsRanksFailuresCheckpointsAndMetrics) {
  testing::TempDir tmp;
  std::string path = JoinPath(tmp.path(), "state.db");
  {
    auto db = StateDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    StoredRun run;
    run.run.set_run_id("r-0000000000000001");
    run.run.set_state(v1::RUNNING);
    run.run.set_generation(2);
    run.run.mutable_spec()->set_experiment_name("exp");
    run.run.set_exp_dir("/tmp/exp");
    run.token_sha256 = "abc";
    run.join_key = "exp@slurm-1";
    ASSERT_TRUE((*db)->SaveRun(run).ok());
    run.run.set_state(v1::RESTARTING);
    ASSERT_TRUE((*db)->SaveRun(run).ok());  // an update, not a second row
    std::vector<v1::RankStatus> ranks(2);
    ranks[0].set_rank(0);
    ranks[0].set_node("n1");
    ranks[1].set_rank(1);
    ranks[1].set_step(42);
    ASSERT_TRUE((*db)->SaveRanks("r-0000000000000001", ranks).ok());
    v1::Failure f;
    f.set_rank(1);
    f.set_message("boom");
    ASSERT_TRUE((*db)->AddFailure("r-0000000000000001", f).ok());
    v1::CheckpointInfo c;
    c.set_step(10);
    c.set_path("/tmp/exp/checkpoints/step-10");
    ASSERT_TRUE((*db)->SaveCheckpoint("r-0000000000000001", c).ok());
    c.set_step(20);
    ASSERT_TRUE((*db)->SaveCheckpoint("r-0000000000000001", c).ok());
    ASSERT_TRUE((*db)->DeleteCheckpoint("r-0000000000000001", 10).ok());
    v1::MetricPoint p;
    p.set_step(3);
    p.set_time(1.5);
    (*p.mutable_values())["loss"] = 2.5;
    (*p.mutable_values())["lr"] = 0.1;
    ASSERT_TRUE(Append(**db, "r-0000000000000001", 1, {p}).ok());
    (*p.mutable_values())["loss"] = 2.25;  // resent or re-logged: replaces
    ASSERT_TRUE(Append(**db, "r-0000000000000001", 1, {p}).ok());
  }
  auto db = StateDb::Open(path);  // a restarted coordinator
  ASSERT_TRUE(db.ok());
  auto runs = (*db)->LoadRuns();
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  const LoadedRun& r = (*runs)[0];
  EXPECT_EQ(r.stored.run.state(), v1::RESTARTING);
  EXPECT_EQ(r.stored.run.generation(), 2);
  EXPECT_EQ(r.stored.token_sha256, "abc");
  EXPECT_EQ(r.stored.join_key, "exp@slurm-1");
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[1].step(), 42);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].message(), "boom");
  ASSERT_EQ(r.checkpoints.size(), 1u);
  EXPECT_EQ(r.checkpoints[0].step(), 20);
  auto query = [&](const std::string& name, std::optional<int32_t> rank) {
    StateDb::MetricQuery q;
    q.run_id = "r-0000000000000001";
    q.name = name;
    q.rank = rank;
    q.limit = 100;
    return (*db)->QueryMetrics(q);
  };
  auto loss = query("loss", std::nullopt);
  ASSERT_TRUE(loss.ok());
  ASSERT_EQ(loss->records.size(), 1u);
  EXPECT_EQ(loss->records[0].value(), 2.25);
  EXPECT_EQ(loss->records[0].rank(), 1);
  EXPECT_FALSE(loss->more);
  EXPECT_EQ(query("", std::nullopt)->records.size(), 2u);
  EXPECT_TRUE(query("", 0)->records.empty());
}

// Every rank's progress is one record per run; loading lays it over the ranks' rows of the same
// generation, keeping whichever step and heartbeat is newer.
TEST(StateDb, TheProgressRecordIsLaidOverTheRanksOfItsGeneration) {
  testing::TempDir tmp;
  std::string path = JoinPath(tmp.path(), "state.db");
  const std::string id = "r-0000000000000002";
  {
    auto db = StateDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    StoredRun run;
    run.run.set_run_id(id);
    run.run.set_state(v1::RUNNING);
    ASSERT_TRUE((*db)->SaveRun(run).ok());
    std::vector<v1::RankStatus> ranks(3);
    for (int r = 0; r < 3; ++r) {
      ranks[r].set_rank(r);
      ranks[r].set_generation(1);
      ranks[r].set_step(10);
      ranks[r].set_pid(100 + r);
      ranks[r].set_node("n1");
    }
    ranks[2].set_step(30);  // its row was written after the progress record below
    ranks[2].mutable_last_heartbeat()->set_seconds(1'800'000'000);
    ASSERT_TRUE((*db)->SaveRanks(id, ranks).ok());
    v1::RankProgress progress;
    progress.set_generation(1);
    for (int r = 0; r < 3; ++r) {
      progress.add_steps(20 + r);
      progress.add_last_heartbeat_unix_ms(1'700'000'000'000 + r);
      progress.add_pids(r == 1 ? 555 : r == 2 ? 777 : 0);
      progress.add_idle_ms(r == 0 ? 1500 : 0);
    }
    ASSERT_TRUE((*db)->SaveRankProgress(id, progress).ok());
    progress.set_steps(0, 21);  // a later flush replaces the record
    ASSERT_TRUE((*db)->SaveRankProgress(id, progress).ok());
  }
  auto db = StateDb::Open(path);
  ASSERT_TRUE(db.ok());
  auto runs = (*db)->LoadRuns();
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 1u);
  const std::vector<v1::RankStatus>& ranks = (*runs)[0].ranks;
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[0].step(), 21);
  EXPECT_EQ(ranks[1].step(), 21);
  EXPECT_EQ(ranks[2].step(), 30);
  EXPECT_EQ(ranks[0].pid(), 100);
  EXPECT_EQ(ranks[1].pid(), 555);
  EXPECT_EQ(ranks[2].pid(), 102);  // the row heard rank 2 later than the record did
  EXPECT_EQ(ranks[2].last_heartbeat().seconds(), 1'800'000'000);
  EXPECT_EQ(ranks[0].idle_ms(), 1500);
  EXPECT_EQ(ranks[1].last_heartbeat().seconds(), 1'700'000'000);
  EXPECT_EQ(ranks[0].node(), "n1");

  // A record of another generation, or of another size, changes nothing.
  std::vector<v1::RankStatus> next = ranks;
  v1::RankProgress old;
  old.set_generation(0);
  for (int r = 0; r < 3; ++r) {
    old.add_steps(99);
    old.add_last_heartbeat_unix_ms(0);
    old.add_pids(0);
    old.add_idle_ms(0);
  }
  ApplyRankProgress(old, next);
  EXPECT_EQ(next[0].step(), 21);
  old.set_generation(1);
  old.add_steps(99);
  ApplyRankProgress(old, next);
  EXPECT_EQ(next[0].step(), 21);
}

// Another program's SQLite database is refused, naming its tables, rather than taken as an empty state.
TEST(StateDb, AnotherProgramsDatabaseIsRefused) {
  testing::TempDir tmp;
  std::string path = JoinPath(tmp.path(), "other.db");
  {
    auto db = StateDb::Open(JoinPath(tmp.path(), "ours.db"));
    ASSERT_TRUE(db.ok());
  }
  sqlite3* foreign = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &foreign), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(foreign, "CREATE TABLE invoices(id INTEGER)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(foreign);
  auto other = StateDb::Open(path);
  ASSERT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
  EXPECT_NE(other.status().message().find("another program's SQLite database (tables invoices)"), std::string::npos)
      << other.status();
  EXPECT_TRUE(StateDb::Open(JoinPath(tmp.path(), "ours.db")).ok());  // dtcoord's own opens again
}

// The coordinator stores what arrived during the previous commit in one transaction: batches of
// different runs and ranks, each read back under its own run and rank; a batch without points
// adds nothing.
TEST(StateDb, BatchesOfManyRunsAndRanksAreStoredTogether) {
  testing::TempDir tmp;
  auto db = StateDb::Open(tmp.Sub("s") + "/state.db");
  ASSERT_TRUE(db.ok());
  std::string a = "r-a", b = "r-b";
  v1::MetricBatch a0, a1, b0, empty;
  for (auto [batch, step, loss] : {std::tuple{&a0, 4, 1.0}, std::tuple{&a1, 5, 2.0}, std::tuple{&b0, 9, 3.0}}) {
    v1::MetricPoint* p = batch->add_points();
    p->set_step(step);
    (*p->mutable_values())["loss"] = loss;
  }
  ASSERT_TRUE((*db)->AppendMetricBatches({{&a, 0, &a0}, {&a, 1, &a1}, {&b, 0, &empty}, {&b, 3, &b0}}).ok());
  StateDb::MetricQuery q;
  q.run_id = a;
  q.limit = 10;
  auto got = (*db)->QueryMetrics(q);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->records.size(), 2u);
  EXPECT_EQ(got->records[0].rank(), 0);
  EXPECT_EQ(got->records[0].step(), 4);
  EXPECT_EQ(got->records[1].rank(), 1);
  EXPECT_EQ(got->records[1].value(), 2.0);
  q.run_id = b;
  got = (*db)->QueryMetrics(q);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->records.size(), 1u);
  EXPECT_EQ(got->records[0].rank(), 3);
  EXPECT_EQ(got->records[0].step(), 9);
  EXPECT_EQ(got->batches_read, 1);
}

// Many batches of two ranks, steps 0..n-1, each batch covering 10 steps of one rank.
void FillHistory(StateDb& db, const std::string& run, int steps) {
  for (int rank = 0; rank < 2; ++rank) {
    for (int first = 0; first < steps; first += 10) {
      std::vector<v1::MetricPoint> points(10);
      for (int i = 0; i < 10; ++i) {
        points[i].set_step(first + i);
        (*points[i].mutable_values())["loss"] = 100.0 - first - i;
        (*points[i].mutable_values())["lr"] = 0.001;
      }
      ASSERT_TRUE(Append(db, run, rank, points).ok());
    }
  }
}

TEST(StateDb, MetricPagesFollowEachOtherInStepRankNameOrderWithNothingLostOrRepeated) {
  testing::TempDir tmp;
  auto db = StateDb::Open(tmp.Sub("s") + "/state.db");
  ASSERT_TRUE(db.ok());
  ASSERT_NO_FATAL_FAILURE(FillHistory(**db, "r-1", 50));
  StateDb::MetricQuery q;
  q.run_id = "r-1";
  q.limit = 7;
  std::vector<std::tuple<int64_t, int32_t, std::string>> seen;
  for (int page = 0; page < 100; ++page) {
    auto got = (*db)->QueryMetrics(q);
    ASSERT_TRUE(got.ok()) << got.status();
    for (const auto& r : got->records) seen.emplace_back(r.step(), r.rank(), r.name());
    if (!got->more) break;
    v1::MetricCursor after;
    after.set_step(got->records.back().step());
    after.set_rank(got->records.back().rank());
    after.set_name(got->records.back().name());
    q.after = after;
  }
  ASSERT_EQ(seen.size(), 50u * 2 * 2);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(seen.front(), std::make_tuple(int64_t{0}, 0, std::string("loss")));
  EXPECT_EQ(seen.back(), std::make_tuple(int64_t{49}, 1, std::string("lr")));
}

TEST(StateDb, ASmallLimitReadsOnlyTheBatchesItNeeds) {
  // A long history: 2 ranks × 2,000 batches.
  testing::TempDir tmp;
  auto db = StateDb::Open(tmp.Sub("s") + "/state.db");
  ASSERT_TRUE(db.ok());
  ASSERT_NO_FATAL_FAILURE(FillHistory(**db, "r-1", 20'000));
  v1::MetricPoint resent;
  resent.set_step(0);
  (*resent.mutable_values())["loss"] = -1;  // re-logged later: the newest value wins
  ASSERT_TRUE(Append(**db, "r-1", 0, {resent}).ok());
  StateDb::MetricQuery q;
  q.run_id = "r-1";
  q.name = "loss";
  q.limit = 1;
  auto first = (*db)->QueryMetrics(q);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->records.size(), 1u);
  EXPECT_EQ(first->records[0].step(), 0);
  EXPECT_EQ(first->records[0].value(), -1);
  EXPECT_TRUE(first->more);
  // Rank 0's and rank 1's first batches, the re-logged one, and the one that ends the read.
  EXPECT_LE(first->batches_read, 4);
  q.from_step = 19'999;
  q.rank = 1;
  auto last = (*db)->QueryMetrics(q);
  ASSERT_EQ(last->records.size(), 1u);
  EXPECT_EQ(last->records[0].value(), 100.0 - 19'999);
  EXPECT_FALSE(last->more);
}

// Column `column` of every row `sql` returns, read from the database file on a connection of the
// test's own (empty if it cannot be opened or the statement fails).
std::vector<std::string> ReadColumn(const std::string& path, const std::string& sql, int column) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  std::unique_ptr<sqlite3, decltype(&sqlite3_close)> owned(db, &sqlite3_close);
  std::vector<std::string> out;
  sqlite3_stmt* st = nullptr;
  if (rc != SQLITE_OK || sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) return out;
  while (sqlite3_step(st) == SQLITE_ROW)
    out.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(st, column)));
  sqlite3_finalize(st);
  return out;
}

// SQLite's plan for a metric page, one line per step of it.
std::vector<std::string> MetricPagePlan(const std::string& path) {
  return ReadColumn(path, std::string("EXPLAIN QUERY PLAN ") + StateDb::kMetricPageQuery, 3);
}

bool SortsEveryBatch(const std::vector<std::string>& plan) {
  return std::any_of(plan.begin(), plan.end(),
                     [](const std::string& line) { return line == "USE TEMP B-TREE FOR ORDER BY"; });
}

// A page is read from an index in step order, from its first batch, and stops early: SQLite never
// sorts a run's whole history (with blobs) before its first row, as it did with schema 4's index
// on (run_id, last_step) (3.5 s for a page of a 160,000-batch run). A database of an older
// dtcoord loses that index when it is opened.
TEST(StateDb, AMetricPageIsReadInStepOrderFromItsFirstBatchAndTheOlderIndexIsDropped) {
  testing::TempDir tmp;
  std::string path = JoinPath(tmp.path(), "state.db");
  { ASSERT_TRUE(StateDb::Open(path).ok()); }
  // From the index, seeking to the page's first batch (a page late in a long run does not walk
  // the run's earlier batches), with no sort of the whole.
  auto served_in_step_order = [](const std::vector<std::string>& plan) {
    ASSERT_FALSE(plan.empty());
    EXPECT_FALSE(SortsEveryBatch(plan)) << absl::StrJoin(plan, "\n");
    EXPECT_NE(plan[0].find("metric_batches_by_first_step (run_id=? AND first_step>?)"), std::string::npos)
        << absl::StrJoin(plan, "\n");
  };
  ASSERT_NO_FATAL_FAILURE(served_in_step_order(MetricPagePlan(path)));

  {
    sqlite3* older = nullptr;
    int rc = sqlite3_open(path.c_str(), &older);
    std::unique_ptr<sqlite3, decltype(&sqlite3_close)> owned(older, &sqlite3_close);
    ASSERT_EQ(rc, SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(older,
                           "CREATE INDEX metric_batches_by_run ON metric_batches(run_id, last_step); "
                           "PRAGMA user_version=4;",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
  }
  ASSERT_NO_FATAL_FAILURE(served_in_step_order(MetricPagePlan(path)));
  auto reopened = StateDb::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ASSERT_NO_FATAL_FAILURE(served_in_step_order(MetricPagePlan(path)));
  EXPECT_EQ(ReadColumn(path, "SELECT COUNT(*) FROM sqlite_master WHERE name = 'metric_batches_by_run'", 0),
            std::vector<std::string>{"0"})
      << "the older index, which every ingested batch paid to keep, is still there";
}

// A page that starts late seeks past batches that cannot reach it, by the run's widest batch: a
// batch spanning many steps is still found from a step inside it, including one stored after a
// page had learned the run's width.
TEST(StateDb, APageThatStartsLateStillFindsABatchThatBeganLongBefore) {
  testing::TempDir tmp;
  auto db = StateDb::Open(tmp.Sub("s") + "/state.db");
  ASSERT_TRUE(db.ok());
  ASSERT_NO_FATAL_FAILURE(FillHistory(**db, "r-1", 2'000));  // batches of 10 steps
  auto point = [](int64_t step, double loss) {
    v1::MetricPoint p;
    p.set_step(step);
    (*p.mutable_values())["wide"] = loss;
    return p;
  };
  auto wide_at = [&](int64_t from_step) {
    StateDb::MetricQuery q;
    q.run_id = "r-1";
    q.name = "wide";
    q.from_step = from_step;
    q.limit = 10;
    std::vector<int64_t> steps;
    auto page = (*db)->QueryMetrics(q);
    EXPECT_TRUE(page.ok()) << page.status();
    if (page.ok()) {
      for (const auto& r : page->records) steps.push_back(r.step());
    }
    return steps;
  };
  ASSERT_TRUE(Append(**db, "r-1", 2, {point(100, 1), point(1'500, 2)}).ok());
  EXPECT_EQ(wide_at(1'400), std::vector<int64_t>{1'500});
  EXPECT_EQ(wide_at(1'501), std::vector<int64_t>{});
  // Wider than any before, stored after the width above was learned.
  ASSERT_TRUE(Append(**db, "r-1", 3, {point(10, 3), point(1'900, 4)}).ok());
  EXPECT_EQ(wide_at(1'800), std::vector<int64_t>{1'900});
  EXPECT_EQ(wide_at(1'000), (std::vector<int64_t>{1'500, 1'900}));
  // A coordinator restarted on the same database learns the widths from what is stored.
  std::string path = tmp.Sub("s") + "/state.db";
  db->reset();
  auto again = StateDb::Open(path);
  ASSERT_TRUE(again.ok());
  db = std::move(again);
  EXPECT_EQ(wide_at(1'800), std::vector<int64_t>{1'900});
}

}  // namespace
}  // namespace dt

namespace dt {
namespace {

// A query for a name no batch holds, over a long history, reads a bounded number of batches per call
// and says where to go on (a tester's four such loops held every run's writes for seconds); the
// pages together read every batch once and find nothing. And a write proceeds while a read is in
// the middle of its scan: reads have a connection of their own.
TEST(StateDb, AQueryReadsABoundedNumberOfBatchesAndNeverHoldsTheWrites) {
  testing::TempDir tmp;
  auto db = StateDb::Open(tmp.Sub("s") + "/state.db");
  ASSERT_TRUE(db.ok());
  ASSERT_NO_FATAL_FAILURE(FillHistory(**db, "r-1", 2'000));
  StateDb::MetricQuery q;
  q.run_id = "r-1";
  q.name = "nonexistent";
  q.limit = 100;
  q.max_batches = 50;
  int64_t pages = 0, read = 0;
  while (true) {
    auto page = (*db)->QueryMetrics(q);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_TRUE(page->records.empty());
    EXPECT_LE(page->batches_read, q.max_batches);
    read += page->batches_read;
    ++pages;
    if (!page->more) break;
    ASSERT_TRUE(page->next.has_value());
    q.after = *page->next;
    ASSERT_LT(pages, 100);
  }
  EXPECT_GE(pages, 4);
  EXPECT_LT(read, 3 * 400);  // 2 ranks × 200 batches, each read about once, not the whole history per page
  // A page cut by the bound still returns every record before the cut, in order.
  q.name = "loss";
  q.after.reset();
  q.limit = 100'000;
  std::vector<v1::MetricRecord> all;
  while (true) {
    auto page = (*db)->QueryMetrics(q);
    ASSERT_TRUE(page.ok());
    for (auto& r : page->records) all.push_back(r);
    if (!page->more) break;
    q.after = *page->next;
  }
  ASSERT_EQ(all.size(), 2u * 2'000);
  for (size_t k = 1; k < all.size(); ++k) {
    EXPECT_TRUE(std::make_tuple(all[k - 1].step(), all[k - 1].rank()) < std::make_tuple(all[k].step(), all[k].rank()));
  }

  // A write while a read is mid-scan: the read waits in its hook until the write is done.
  absl::Notification reading, written;
  StateDb::MetricQuery slow;
  slow.run_id = "r-1";
  slow.name = "nonexistent";
  slow.limit = 1;
  bool first = true;
  slow.on_batch = [&] {
    if (!first) return;
    first = false;
    reading.Notify();
    written.WaitForNotificationWithTimeout(absl::Seconds(30));
  };
  std::thread reader([&] { EXPECT_TRUE((*db)->QueryMetrics(slow).ok()); });
  ASSERT_TRUE(reading.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::Notification saved;
  std::thread writer([&] {
    StoredRun run;
    run.run.set_run_id("r-2");
    run.run.set_exp_dir("/x");
    EXPECT_TRUE((*db)->SaveRun(run).ok());
    saved.Notify();
  });
  // Microseconds when the scan does not hold the writes; the scan waits 30 s otherwise.
  EXPECT_TRUE(saved.WaitForNotificationWithTimeout(absl::Seconds(10))) << "the write waited for the read";
  written.Notify();
  writer.join();
  reader.join();
}

}  // namespace
}  // namespace dt
