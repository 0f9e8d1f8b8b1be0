// The points of a metric batch in either of its forms: `points` (a map per point, what every client
// sent first) and `columns` (names once, packed arrays; far cheaper at every hop). Readers see one
// stream of points; writers pick the form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dt/v1/metrics.pb.h"

namespace dt {

// One point. The names point into the batch: valid while the batch is.
struct MetricPointView {
  int64_t step = 0;
  double time = 0;
  std::vector<std::pair<absl::string_view, double>> values;
};

// Points in the batch: `points`, then `columns`.
int64_t MetricPointCount(const v1::MetricBatch& batch);

// Whether value `cell` (point i's value of names[j] is cell i * names_size + j) is absent.
bool MetricValueAbsent(const v1::MetricColumns& columns, size_t cell);

// Calls `fn` for every point, `points` first, then `columns` (in their order). The view is reused
// between calls. Safe on any batch: columns whose arrays disagree (refused by ValidateMetricPoints,
// but possible in a damaged database) are read only as far as they go.
void ForEachMetricPoint(const v1::MetricBatch& batch, absl::FunctionRef<void(const MetricPointView&)> fn);

// INVALID_ARGUMENT naming the first fault: a bad metric name (also in the summary), a name twice in
// `columns`, column arrays whose sizes disagree, a negative step, a time that is not finite.
absl::Status ValidateMetricPoints(const v1::MetricBatch& batch);

// `points` as columns, when that is smaller: nullopt for points whose names barely overlap (the
// columns would be mostly absent values). Names keep their first-seen order.
std::optional<v1::MetricColumns> ToMetricColumns(const std::vector<const v1::MetricPoint*>& points);

}  // namespace dt
