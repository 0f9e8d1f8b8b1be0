#include "client/dtctl/watch.h"
#include "common/run_state.h"

#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/dtctl/output.h"

namespace dt::ctl {
namespace {

std::string Compact(double v) {
  if (v >= 1e6) return absl::StrFormat("%.1fM", v / 1e6);
  if (v >= 1e3) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.0f", v);
}

class View {
 public:
  View(bool tty, std::ostream& out) : tty_(tty), out_(out) {}

  void Snapshot(const v1::Run& r) {
    bool changed = r.state() != run_.state() || r.generation() != run_.generation() || first_;
    if (r.generation() != run_.generation()) {
      // A smaller generation (an elastic run): the figures of ranks it does not have are stale.
      for (auto* per_rank : {&step_time_, &tokens_per_s_}) {
        per_rank->erase(per_rank->lower_bound(std::max(0, r.world_size())), per_rank->end());
      }
    }
    run_ = r;
    first_ = false;
    step_ = std::max(step_, r.step());
    if (changed && !tty_) {
      out_ << Stamp() << r.run_id() << " " << r.spec().experiment_name() << " " << StateName(r.state())
           << " generation " << r.generation() << " restarts " << r.restarts() << "/" << r.spec().max_restarts();
      if ((r.state() == v1::FAILED || r.state() == v1::RESTARTING || r.state() == v1::REQUEUED ||
           r.state() == v1::CANCELLED) &&
          r.has_reason()) {
        out_ << ": " << FailureLine(r.reason());
      }
      out_ << std::endl;
    }
    Draw(changed);
  }

  void Metric(const v1::MetricPointEvent& m) {
    auto value = [&](const char* k) -> std::optional<double> {
      auto it = m.values().find(k);
      if (it == m.values().end()) return std::nullopt;
      return it->second;
    };
    if (auto t = value("step_time_s")) step_time_[m.rank()] = *t;
    if (auto t = value("tokens_per_s")) tokens_per_s_[m.rank()] = *t;
    if (m.rank() == 0) {
      if (auto l = value("loss")) loss_ = *l;
      if (auto e = value("eval_loss")) eval_loss_ = *e;
    }
    if (m.step() > step_) {
      step_ = m.step();
      absl::Time now = absl::Now();
      if (rate_start_ == absl::InfinitePast()) {
        rate_start_ = now;
        rate_start_step_ = step_;
      }
      if (step_ > rate_start_step_) {
        steps_per_s_ = (step_ - rate_start_step_) / std::max(1e-9, absl::ToDoubleSeconds(now - rate_start_));
      }
    }
    if (!tty_ && m.rank() == 0 && value("loss") && m.step() > printed_step_) {
      printed_step_ = m.step();
      out_ << Stamp() << ProgressLine(false) << std::endl;
    }
    Draw(false);
  }

  void Finish() {
    if (tty_ && drawn_) out_ << std::endl;
    out_ << run_.run_id() << " " << StateName(run_.state());
    if (run_.state() != v1::SUCCEEDED && run_.has_reason()) out_ << ": " << FailureLine(run_.reason());
    out_ << std::endl;
  }

  const v1::Run& run() const { return run_; }

 private:
  static std::string Stamp() { return absl::FormatTime("%H:%M:%S ", absl::Now(), absl::LocalTimeZone()); }

  std::string ProgressLine(bool bar) const {
    int64_t total = run_.total_steps();
    std::string out;
    if (bar && total > 0) {
      constexpr int kWidth = 30;
      int filled = static_cast<int>(kWidth * std::min<double>(1.0, static_cast<double>(step_) / total));
      absl::StrAppend(&out, "[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "] ");
    }
    absl::StrAppend(&out, "step ", step_, total > 0 ? absl::StrCat("/", total) : "");
    if (total > 0) absl::StrAppend(&out, absl::StrFormat(" %3.0f%%", 100.0 * step_ / total));
    if (!std::isnan(loss_)) absl::StrAppend(&out, absl::StrFormat("  loss %.4f", loss_));
    if (!std::isnan(eval_loss_)) absl::StrAppend(&out, absl::StrFormat("  eval %.4f", eval_loss_));
    double tps = 0;
    for (const auto& [r, v] : tokens_per_s_) tps += v;
    if (tps > 0) absl::StrAppend(&out, "  ", Compact(tps), " tok/s");
    if (total > 0 && steps_per_s_ > 0) {
      absl::StrAppend(&out, "  ETA ", HumanSeconds((total - step_) / steps_per_s_));
    }
    return out;
  }

  std::string SpreadLine() const {
    if (step_time_.size() < 2) return "";
    auto [lo, hi] = std::minmax_element(step_time_.begin(), step_time_.end(),
                                        [](const auto& a, const auto& b) { return a.second < b.second; });
    return absl::StrFormat("step time per rank: fastest %.3fs (rank %d), slowest %.3fs (rank %d), spread %.2fx",
                           lo->second, lo->first, hi->second, hi->first, hi->second / std::max(1e-9, lo->second));
  }

  void Draw(bool force) {
    if (!tty_) return;
    absl::Time now = absl::Now();
    if (!force && now - last_draw_ < absl::Milliseconds(250)) return;
    last_draw_ = now;
    std::string header = absl::StrCat(run_.run_id(), " ", run_.spec().experiment_name(), "  ", StateName(run_.state()),
                                      "  generation ", run_.generation(), "  restarts ", run_.restarts(), "/",
                                      run_.spec().max_restarts(), "  ranks ", run_.world_size());
    if (drawn_) out_ << "\033[3A";
    out_ << "\r\033[K" << header << "\n\033[K" << ProgressLine(true) << "\n\033[K" << SpreadLine() << "\n"
         << std::flush;
    drawn_ = true;
  }

  bool tty_;
  std::ostream& out_;
  v1::Run run_;
  bool first_ = true;
  bool drawn_ = false;
  int64_t step_ = 0;
  int64_t printed_step_ = 0;
  double loss_ = std::nan("");
  double eval_loss_ = std::nan("");
  std::map<int, double> step_time_;
  std::map<int, double> tokens_per_s_;
  absl::Time rate_start_ = absl::InfinitePast();
  int64_t rate_start_step_ = 0;
  double steps_per_s_ = 0;
  absl::Time last_draw_ = absl::InfinitePast();
};

}  // namespace

int Watch(const std::shared_ptr<CoordinatorClient>& client, const std::string& run_id, bool tty, std::ostream& out) {
  View view(tty, out);
  absl::Time unreachable_since = absl::InfiniteFuture();
  while (true) {
    std::unique_ptr<grpc::ClientContext> ctx = client->Context(absl::InfiniteDuration());
    v1::WatchRunRequest req;
    req.set_run_id(run_id);
    req.set_include_metrics(true);
    std::unique_ptr<grpc::ClientReader<v1::RunEvent>> reader = client->runs().WatchRun(ctx.get(), req);
    v1::RunEvent event;
    bool got_any = false;
    while (reader->Read(&event)) {
      got_any = true;
      unreachable_since = absl::InfiniteFuture();
      if (event.has_snapshot()) view.Snapshot(event.snapshot());
      if (event.has_metric()) view.Metric(event.metric());
    }
    grpc::Status status = reader->Finish();
    if (status.ok() && IsTerminal(view.run().state())) {
      view.Finish();
      return view.run().state() == v1::SUCCEEDED ? 0 : 1;
    }
    absl::Status ended = FromCallStatus(status);
    if (absl::IsUnavailable(ended) || (status.ok() && got_any)) {
      // The coordinator restarted or is briefly away: keep watching for a minute.
      if (unreachable_since == absl::InfiniteFuture()) unreachable_since = absl::Now();
      if (absl::Now() - unreachable_since > absl::Minutes(1)) {
        std::cerr << "dtctl: lost the coordinator at " << client->address() << ": " << ended.message() << std::endl;
        return 3;
      }
      absl::SleepFor(absl::Milliseconds(500));
      continue;
    }
    std::cerr << "dtctl watch: " << status.error_message() << std::endl;
    return 1;
  }
}

}  // namespace dt::ctl
