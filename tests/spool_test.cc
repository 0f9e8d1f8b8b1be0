// The W&B spool's records: a batch's columns are one record, a point of the map form one record
// (as every coordinator before columns wrote them), and a spool holding both reads back every point
// in order, from any point (inside a columns record too), before and after a reload.
#include "coordinator/wandb/spool.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/fs.h"
#include "tests/test_util.h"

namespace dt::wandb {
namespace {

SpoolMeta Meta() {
  SpoolMeta m;
  m.run.project = "p";
  m.run.run_id = "r";
  m.base_url = "http://127.0.0.1:1";
  m.mode = "online";
  m.dt_run_id = "run-1";
  return m;
}

// Appends a length-prefixed record to the spool's points.bin, as a coordinator writes it.
void AppendRaw(const std::string& dir, const std::string& record) {
  std::string framed(sizeof(uint32_t), '\0');
  const uint32_t len = static_cast<uint32_t>(record.size());
  std::memcpy(framed.data(), &len, sizeof(len));
  framed += record;
  std::string path = JoinPath(dir, "points.bin");
  std::string content = ReadFile(path).value_or("");
  ASSERT_TRUE(WriteFileAtomic(path, content + framed).ok());
}

// A point of the map form: the record every coordinator wrote before columns were spooled.
std::string PointRecord(int64_t step, double loss) {
  v1::MetricPoint p;
  p.set_step(step);
  p.set_time(1000.0 + static_cast<double>(step));
  (*p.mutable_values())["loss"] = loss;
  return p.SerializeAsString();
}

// Steps `first`..`first + n - 1` as columns of loss and lr, lr absent at the second point.
v1::MetricColumns Columns(int64_t first, int n) {
  v1::MetricColumns c;
  c.add_names("loss");
  c.add_names("lr");
  for (int i = 0; i < n; ++i) {
    c.add_steps(first + i);
    c.add_times(1000.0 + static_cast<double>(first + i));
    c.add_values(10.0 + i);
    c.add_values(0.5);
  }
  std::string absent((2 * n + 7) / 8, '\0');
  if (n > 1) absent[3 / 8] = static_cast<char>(1 << 3);  // point 1's lr
  c.set_absent(absent);
  return c;
}

std::vector<int64_t> Steps(const Points& points) {
  std::vector<int64_t> steps;
  for (const Points::Point& p : points.points) steps.push_back(p.step);
  return steps;
}

TEST(Spool, PointsOfBothRecordFormsReadBackInOrderFromAnyPointAcrossAReload) {
  testing::TempDir tmp;
  const std::string dir = tmp.Sub("spool");
  ASSERT_TRUE(Spool::Open(dir, Meta()).ok());
  // What an older coordinator left: two points, a record each.
  AppendRaw(dir, PointRecord(1, 3.0));
  AppendRaw(dir, PointRecord(2, 2.5));
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Load(dir);
  ASSERT_TRUE(spool.ok()) << spool.status();
  ASSERT_EQ((*spool)->size(), 2);

  // This coordinator's batch: a point of the map form, then four as columns.
  v1::MetricBatch batch;
  v1::MetricPoint* p = batch.add_points();
  p->set_step(3);
  (*p->mutable_values())["loss"] = 2.25;
  *batch.mutable_columns() = Columns(4, 4);
  ASSERT_TRUE((*spool)->Append(batch).ok());
  EXPECT_EQ((*spool)->size(), 7);
  EXPECT_EQ((*spool)->unacked_bytes(), static_cast<int64_t>(ReadFile(JoinPath(dir, "points.bin"))->size()));

  for (int reload = 0; reload < 2; ++reload) {
    SCOPED_TRACE(reload ? "after a reload" : "as appended");
    absl::StatusOr<Points> all = (*spool)->Read(0, 100);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(Steps(*all), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(all->ValuesOf(0).at("loss"), 3.0);
    EXPECT_EQ(all->ValuesOf(2).at("loss"), 2.25);
    EXPECT_EQ(all->points[3].time, 1004.0);
    EXPECT_EQ(all->names, (std::vector<std::string>{"loss", "lr"})) << "a name is kept once per read";
    EXPECT_EQ(all->ValuesOf(3), (std::map<std::string, double>{{"loss", 10.0}, {"lr", 0.5}}));
    EXPECT_EQ(all->ValuesOf(4), (std::map<std::string, double>{{"loss", 11.0}})) << "its lr is absent";
    // From inside the columns record, and up to a point inside it.
    absl::StatusOr<Points> middle = (*spool)->Read(4, 2);
    ASSERT_TRUE(middle.ok()) << middle.status();
    EXPECT_EQ(Steps(*middle), (std::vector<int64_t>{5, 6}));
    EXPECT_EQ(middle->ValuesOf(0), (std::map<std::string, double>{{"loss", 11.0}}));
    EXPECT_EQ(middle->ValuesOf(1), (std::map<std::string, double>{{"loss", 12.0}, {"lr", 0.5}}));
    absl::StatusOr<Points> across = (*spool)->Read(1, 4);
    ASSERT_TRUE(across.ok()) << across.status();
    EXPECT_EQ(Steps(*across), (std::vector<int64_t>{2, 3, 4, 5}));
    EXPECT_TRUE((*spool)->Read(7, 10)->empty());
    (*spool)->state().acked_points = 5;  // inside the columns record: it is all still unsent
    EXPECT_GT((*spool)->unacked_bytes(), 0);
    (*spool)->state().acked_points = 7;
    EXPECT_EQ((*spool)->unacked_bytes(), 0);
    ASSERT_TRUE((*spool)->SaveState().ok());
    spool->reset();
    spool = Spool::Load(dir);
    ASSERT_TRUE(spool.ok()) << spool.status();
    ASSERT_EQ((*spool)->size(), 7);
    EXPECT_EQ((*spool)->state().acked_points, 7);
    (*spool)->state().acked_points = 0;
  }
}

// Batches staged during one delivery pass are invisible until flushed, then read back as if each
// had been appended on its own, in order, after what was already there and before what follows;
// a reload finds the same points.
TEST(Spool, StagedBatchesAreWrittenAtFlushAsIfAppendedOneByOne) {
  testing::TempDir tmp;
  const std::string dir = tmp.Sub("spool");
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(dir, Meta());
  ASSERT_TRUE(spool.ok()) << spool.status();
  v1::MetricBatch first;
  *first.mutable_columns() = Columns(1, 2);
  ASSERT_TRUE((*spool)->Append(first).ok());
  const int64_t bytes_before = static_cast<int64_t>(ReadFile(JoinPath(dir, "points.bin"))->size());

  v1::MetricBatch second;
  *second.mutable_columns() = Columns(3, 3);
  v1::MetricBatch third;
  v1::MetricPoint* p = third.add_points();
  p->set_step(6);
  p->set_time(1006.0);
  (*p->mutable_values())["loss"] = 1.5;
  v1::MetricBatch fourth;
  *fourth.mutable_columns() = Columns(7, 2);
  (*spool)->Stage(second);
  (*spool)->Stage(third);
  (*spool)->Stage(fourth);
  EXPECT_EQ((*spool)->size(), 2) << "staged points are read before they are written";
  EXPECT_EQ((*spool)->staged_points(), 6);
  EXPECT_EQ(static_cast<int64_t>(ReadFile(JoinPath(dir, "points.bin"))->size()), bytes_before);
  ASSERT_TRUE((*spool)->Flush().ok());
  EXPECT_EQ((*spool)->staged_points(), 0);
  EXPECT_EQ((*spool)->size(), 8);
  v1::MetricBatch fifth;
  *fifth.mutable_columns() = Columns(9, 1);
  ASSERT_TRUE((*spool)->Append(fifth).ok());

  const std::vector<int64_t> all{1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (int64_t from = 0; from < 9; ++from) {
    absl::StatusOr<Points> read = (*spool)->Read(from, 100);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(Steps(*read), std::vector<int64_t>(all.begin() + from, all.end())) << "from point " << from;
  }
  absl::StatusOr<Points> read = (*spool)->Read(4, 3);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->ValuesOf(0), (std::map<std::string, double>{{"loss", 12.0}, {"lr", 0.5}}));  // step 5
  EXPECT_EQ(read->ValuesOf(1), (std::map<std::string, double>{{"loss", 1.5}}));                // step 6
  EXPECT_EQ(read->ValuesOf(2), (std::map<std::string, double>{{"loss", 10.0}, {"lr", 0.5}}));  // step 7
  spool->reset();
  absl::StatusOr<std::unique_ptr<Spool>> again = Spool::Load(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->size(), 9);
  EXPECT_EQ(Steps(*(*again)->Read(0, 100)), all);
}

// A pass whose write fails (the disk full; here the file-size limit) is cut off again: its points
// are refused with RESOURCE_EXHAUSTED naming the spool, the file ends where it did, and the next
// pass is written and read back after the points before it, also after a reload.
TEST(Spool, AFailedFlushLeavesTheFileAsItWasAndTheNextPassFollowsIt) {
  testing::TempDir tmp;
  const std::string dir = tmp.Sub("spool");
  const std::string points_bin = JoinPath(dir, "points.bin");
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(dir, Meta());
  ASSERT_TRUE(spool.ok()) << spool.status();
  v1::MetricBatch first;
  *first.mutable_columns() = Columns(1, 2);
  ASSERT_TRUE((*spool)->Append(first).ok());
  const size_t bytes_before = ReadFile(points_bin)->size();

  v1::MetricBatch lost;
  *lost.mutable_columns() = Columns(3, 200);
  (*spool)->Stage(lost);
  {
    // Past this size a write(2) stops short, then fails with EFBIG (SIGXFSZ ignored).
    struct rlimit old_limit = {};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
    struct sigaction ignore = {}, old_action = {};
    ignore.sa_handler = SIG_IGN;
    ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
    struct rlimit small = old_limit;
    small.rlim_cur = bytes_before + 100;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    absl::Status flushed = (*spool)->Flush();
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    ::sigaction(SIGXFSZ, &old_action, nullptr);
    EXPECT_EQ(flushed.code(), absl::StatusCode::kResourceExhausted) << flushed;
    EXPECT_NE(flushed.message().find(dir), std::string::npos) << flushed;
  }
  EXPECT_EQ(ReadFile(points_bin)->size(), bytes_before);
  EXPECT_EQ((*spool)->size(), 2);
  EXPECT_EQ((*spool)->staged_points(), 0);

  v1::MetricBatch next;
  *next.mutable_columns() = Columns(203, 2);
  ASSERT_TRUE((*spool)->Append(next).ok());
  EXPECT_EQ(Steps(*(*spool)->Read(0, 100)), (std::vector<int64_t>{1, 2, 203, 204}));
  EXPECT_EQ(Steps(*(*spool)->Read(2, 100)), (std::vector<int64_t>{203, 204}));
  spool->reset();
  absl::StatusOr<std::unique_ptr<Spool>> again = Spool::Load(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Steps(*(*again)->Read(0, 100)), (std::vector<int64_t>{1, 2, 203, 204}));
}

// A columns record whose arrays disagree (a damaged disk) is refused when read, naming the spool;
// the points before it still read.
TEST(Spool, AColumnsRecordWhoseArraysDisagreeIsDataLossWhenRead) {
  testing::TempDir tmp;
  const std::string dir = tmp.Sub("spool");
  ASSERT_TRUE(Spool::Open(dir, Meta()).ok());
  AppendRaw(dir, PointRecord(1, 3.0));
  v1::MetricSpoolRecord damaged;
  *damaged.mutable_columns() = Columns(2, 3);
  damaged.mutable_columns()->mutable_values()->RemoveLast();
  AppendRaw(dir, damaged.SerializeAsString());
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Load(dir);
  ASSERT_TRUE(spool.ok()) << spool.status();
  EXPECT_EQ((*spool)->size(), 4);
  EXPECT_EQ(Steps(*(*spool)->Read(0, 1)), (std::vector<int64_t>{1}));
  absl::StatusOr<Points> read = (*spool)->Read(0, 10);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_NE(read.status().message().find(dir), std::string::npos) << read.status();
}

}  // namespace
}  // namespace dt::wandb
