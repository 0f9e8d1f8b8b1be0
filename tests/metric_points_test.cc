// A metric batch's two forms (a map per point, and columns) carry the same points; malformed
// columns are refused naming the fault.
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/metric_points.h"

namespace dt {
namespace {

struct Seen {
  int64_t step;
  double time;
  std::map<std::string, double> values;
  bool operator==(const Seen& o) const { return step == o.step && time == o.time && values == o.values; }
};

std::vector<Seen> PointsOf(const v1::MetricBatch& batch) {
  std::vector<Seen> out;
  ForEachMetricPoint(batch, [&](const MetricPointView& p) {
    Seen s{p.step, p.time, {}};
    for (const auto& [name, value] : p.values) s.values[std::string(name)] = value;
    out.push_back(std::move(s));
  });
  return out;
}

v1::MetricPoint Point(int64_t step, double time, const std::map<std::string, double>& values) {
  v1::MetricPoint p;
  p.set_step(step);
  p.set_time(time);
  p.mutable_values()->insert(values.begin(), values.end());
  return p;
}

TEST(MetricPoints, ColumnsCarryTheSamePointsAsTheMapsTheyWereMadeFrom) {
  // Step 3 has no lr and an eval loss only it has: absent values, a column mostly absent. NaN is a
  // value (a diverged loss), not an absence.
  v1::MetricBatch as_points;
  *as_points.add_points() = Point(1, 100.5, {{"loss", 3.25}, {"lr", 1e-3}});
  *as_points.add_points() = Point(2, 101.5, {{"loss", std::nan("")}, {"lr", 1e-3}});
  *as_points.add_points() = Point(3, 102.5, {{"loss", 2.5}, {"eval_loss", 2.75}});
  std::vector<const v1::MetricPoint*> points;
  for (const auto& p : as_points.points()) points.push_back(&p);
  std::optional<v1::MetricColumns> columns = ToMetricColumns(points);
  ASSERT_TRUE(columns.has_value());
  EXPECT_EQ(columns->names_size(), 3);
  EXPECT_FALSE(columns->absent().empty());
  v1::MetricBatch as_columns;
  *as_columns.mutable_columns() = *columns;
  ASSERT_TRUE(ValidateMetricPoints(as_columns).ok()) << ValidateMetricPoints(as_columns);
  EXPECT_EQ(MetricPointCount(as_columns), 3);

  std::vector<Seen> expected = PointsOf(as_points), got = PointsOf(as_columns);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step, expected[i].step);
    EXPECT_EQ(got[i].time, expected[i].time);
    ASSERT_EQ(got[i].values.size(), expected[i].values.size()) << "point " << i;
    for (const auto& [name, value] : expected[i].values) {
      ASSERT_EQ(got[i].values.count(name), 1u) << name;
      if (std::isnan(value)) {
        EXPECT_TRUE(std::isnan(got[i].values[name])) << name;
      } else {
        EXPECT_EQ(got[i].values[name], value) << name;
      }
    }
  }
  // Both forms in one batch: the points first, then the columns.
  v1::MetricBatch both = as_points;
  *both.mutable_columns() = *columns;
  EXPECT_EQ(MetricPointCount(both), 6);
  EXPECT_EQ(PointsOf(both)[3].step, 1);
}

TEST(MetricPoints, PointsWhoseNamesBarelyOverlapStayPoints) {
  std::vector<v1::MetricPoint> owned;
  for (int i = 0; i < 32; ++i) owned.push_back(Point(i, 1, {{"metric_" + std::to_string(i), 1.0}}));
  std::vector<const v1::MetricPoint*> points;
  for (const auto& p : owned) points.push_back(&p);
  EXPECT_FALSE(ToMetricColumns(points).has_value()) << "32 x 32 cells for 32 values";
}

TEST(MetricPoints, MalformedColumnsAreRefusedNamingTheFault) {
  auto good = [] {
    v1::MetricBatch b;
    v1::MetricColumns* c = b.mutable_columns();
    c->add_names("loss");
    c->add_names("lr");
    c->add_steps(1);
    c->add_times(10);
    c->add_values(2.5);
    c->add_values(0.1);
    return b;
  };
  ASSERT_TRUE(ValidateMetricPoints(good()).ok());
  struct Case {
    const char* what;
    std::function<void(v1::MetricColumns*)> spoil;
    const char* message;
  };
  std::vector<Case> cases = {
      {"a name twice", [](v1::MetricColumns* c) { c->set_names(1, "loss"); }, "\"loss\" twice"},
      {"a bad name", [](v1::MetricColumns* c) { c->set_names(1, "l r"); }, "l r"},
      {"a time missing", [](v1::MetricColumns* c) { c->clear_times(); }, "1 steps and 0 times"},
      {"a value missing", [](v1::MetricColumns* c) { c->mutable_values()->RemoveLast(); }, "1 values for 1 steps x 2"},
      {"a bitmap too long", [](v1::MetricColumns* c) { c->set_absent(std::string(2, '\0')); }, "absent bitmap has 2"},
      {"a negative step", [](v1::MetricColumns* c) { c->set_steps(0, -4); }, "step -4 is negative"},
      {"a time not finite", [](v1::MetricColumns* c) { c->set_times(0, std::numeric_limits<double>::infinity()); },
       "finite"},
  };
  for (const Case& k : cases) {
    v1::MetricBatch b = good();
    k.spoil(b.mutable_columns());
    absl::Status s = ValidateMetricPoints(b);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.what << ": " << s;
    EXPECT_NE(s.message().find(k.message), absl::string_view::npos) << k.what << ": " << s;
    // Read anyway (as from a damaged database): no more than the arrays hold, nothing past them.
    EXPECT_LE(PointsOf(b).size(), 1u) << k.what;
  }
}

}  // namespace
}  // namespace dt
