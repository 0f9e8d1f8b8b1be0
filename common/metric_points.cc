#include "common/metric_points.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace dt {
namespace {

bool Absent(const std::string& bitmap, size_t k) {
  return k / 8 < bitmap.size() && ((static_cast<unsigned char>(bitmap[k / 8]) >> (k % 8)) & 1) != 0;
}

absl::Status CheckStepAndTime(int64_t step, double time) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("metric step ", step, " is negative"));
  if (!std::isfinite(time)) return absl::InvalidArgumentError("metric time must be finite");
  return absl::OkStatus();
}

absl::Status ValidateColumns(const v1::MetricColumns& c) {
  std::vector<absl::string_view> names(c.names().begin(), c.names().end());
  for (absl::string_view name : names) {
    if (absl::Status s = ValidateMetricName(name); !s.ok()) return s;
  }
  std::sort(names.begin(), names.end());
  if (auto twice = std::adjacent_find(names.begin(), names.end()); twice != names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric columns name \"", *twice, "\" twice; each name is one column"));
  }
  if (c.times_size() != c.steps_size()) {
    return absl::InvalidArgumentError(absl::StrCat("metric columns have ", c.steps_size(), " steps and ",
                                                   c.times_size(), " times; give one time per step"));
  }
  const int64_t cells = int64_t{c.steps_size()} * c.names_size();
  if (c.values_size() != cells) {
    return absl::InvalidArgumentError(absl::StrCat("metric columns have ", c.values_size(), " values for ",
                                                   c.steps_size(), " steps x ", c.names_size(),
                                                   " names; give steps x names values, point by point"));
  }
  if (!c.absent().empty() && static_cast<int64_t>(c.absent().size()) != (cells + 7) / 8) {
    return absl::InvalidArgumentError(absl::StrCat("the metric columns' absent bitmap has ", c.absent().size(),
                                                   " bytes; ", cells, " values need ", (cells + 7) / 8,
                                                   " (one bit each), or none when all are present"));
  }
  for (int i = 0; i < c.steps_size(); ++i) {
    if (absl::Status s = CheckStepAndTime(c.steps(i), c.times(i)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

bool MetricValueAbsent(const v1::MetricColumns& columns, size_t cell) { return Absent(columns.absent(), cell); }

int64_t MetricPointCount(const v1::MetricBatch& batch) {
  return int64_t{batch.points_size()} + batch.columns().steps_size();
}

void ForEachMetricPoint(const v1::MetricBatch& batch, absl::FunctionRef<void(const MetricPointView&)> fn) {
  MetricPointView view;
  for (const v1::MetricPoint& p : batch.points()) {
    view.step = p.step();
    view.time = p.time();
    view.values.clear();
    for (const auto& [name, value] : p.values()) view.values.emplace_back(name, value);
    fn(view);
  }
  // Bounded by what the arrays hold, so a batch read back from a damaged database cannot index
  // past them; a batch ValidateMetricPoints accepted is read whole.
  const v1::MetricColumns& c = batch.columns();
  const size_t n = static_cast<size_t>(c.names_size());
  const size_t values = static_cast<size_t>(c.values_size());
  const int rows = std::min(c.steps_size(), c.times_size());
  for (int i = 0; i < rows; ++i) {
    view.step = c.steps(i);
    view.time = c.times(i);
    view.values.clear();
    for (size_t j = 0; j < n; ++j) {
      size_t k = static_cast<size_t>(i) * n + j;
      if (k >= values) break;
      if (!Absent(c.absent(), k)) view.values.emplace_back(c.names(static_cast<int>(j)), c.values(static_cast<int>(k)));
    }
    fn(view);
  }
}

absl::Status ValidateMetricPoints(const v1::MetricBatch& batch) {
  for (const v1::MetricPoint& p : batch.points()) {
    if (absl::Status s = CheckStepAndTime(p.step(), p.time()); !s.ok()) return s;
    for (const auto& [name, value] : p.values()) {
      if (absl::Status s = ValidateMetricName(name); !s.ok()) return s;
    }
  }
  for (const auto& [name, value] : batch.summary()) {
    if (absl::Status s = ValidateMetricName(name); !s.ok()) return s;
  }
  return ValidateColumns(batch.columns());
}

std::optional<v1::MetricColumns> ToMetricColumns(const std::vector<const v1::MetricPoint*>& points) {
  v1::MetricColumns c;
  std::map<std::string, int, std::less<>> column;
  size_t present = 0;
  for (const v1::MetricPoint* p : points) {
    for (const auto& [name, value] : p->values()) {
      if (column.emplace(name, c.names_size()).second) c.add_names(name);
      ++present;
    }
  }
  const size_t n = static_cast<size_t>(c.names_size());
  const size_t cells = points.size() * n;
  if (cells > 2 * present + 16) return std::nullopt;  // mostly absent: the map form is smaller
  c.mutable_values()->Resize(static_cast<int>(cells), 0.0);
  std::string absent((cells + 7) / 8, '\xff');
  for (size_t i = 0; i < points.size(); ++i) {
    c.add_steps(points[i]->step());
    c.add_times(points[i]->time());
    for (const auto& [name, value] : points[i]->values()) {
      size_t k = i * n + static_cast<size_t>(column.find(name)->second);
      c.set_values(static_cast<int>(k), value);
      absent[k / 8] = static_cast<char>(static_cast<unsigned char>(absent[k / 8]) & ~(1u << (k % 8)));
    }
  }
  // Bits past the last value stay set; they are never read.
  if (present < cells) *c.mutable_absent() = std::move(absent);
  return c;
}

}  // namespace dt
