#include "coordinator/console/console_api.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/limits.h"
#include "common/log_lines.h"
#include "common/names.h"
#include "common/run_json.h"
#include "common/run_state.h"
#include "common/utf8.h"
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/experiment_dir.h"
#include "coordinator/metric_pipeline.h"

namespace dt {
namespace {

constexpr absl::string_view kApiPrefix = "/api/v1/";
// A series request reads at most this many metric records; the rest comes with the next request
// (`next_from_step`), so one request never holds the database for long.
constexpr int64_t kSeriesRecordBudget = 400'000;
constexpr int64_t kDefaultSeriesPoints = 2'000;
constexpr int64_t kMaxSeriesPoints = 20'000;
constexpr int64_t kDefaultLogBytes = 64 << 10;
constexpr int64_t kMaxLogBytes = 1 << 20;
// The rank table's step times cost a query per rank: beyond this many ranks they are left out.
constexpr int kMaxRanksWithStepTime = 1024;

// INVALID_ARGUMENT naming a parameter the endpoint does not take.
absl::Status CheckParams(const ConsoleRequest& request, std::initializer_list<absl::string_view> allowed) {
  for (const auto& [key, value] : request.params) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown parameter ", Quote(key), " (", request.path, " takes ",
                                                     allowed.size() == 0 ? "none" : absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// The integer parameter `key` within [min, max]; `fallback` when absent.
absl::StatusOr<int64_t> IntParam(const ConsoleRequest& request, const std::string& key, int64_t min, int64_t max,
                                 int64_t fallback) {
  auto it = request.params.find(key);
  if (it == request.params.end() || it->second.empty()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", key, " must be an integer in ", min, "..", max, ", got ", Quote(it->second)));
  }
  return value;
}

std::string Param(const ConsoleRequest& request, const std::string& key) {
  auto it = request.params.find(key);
  return it == request.params.end() ? "" : it->second;
}

absl::StatusOr<std::vector<v1::RunState>> ParseStates(const std::string& text) {
  std::vector<v1::RunState> states;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    v1::RunState state;
    if (!v1::RunState_Parse(std::string(name), &state) || state == v1::RUN_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("state ", Quote(name),
                                                     " is not a run state (PENDING, RENDEZVOUS, RUNNING, RESTARTING, "
                                                     "REQUEUED, SUCCEEDED, FAILED, CANCELLED)"));
    }
    states.push_back(state);
  }
  return states;
}

// At most `max_points` of `points` (in step order): for each of max_points/2 equal slices, its
// lowest and highest value in step order, so spikes survive; the last point always stays.
nlohmann::json Downsample(const std::vector<std::pair<int64_t, double>>& points, int64_t max_points) {
  nlohmann::json out = nlohmann::json::array();
  int64_t n = static_cast<int64_t>(points.size());
  if (n <= max_points) {
    for (const auto& [step, value] : points) out.push_back({step, value});
    return out;
  }
  int64_t slices = std::max<int64_t>(1, max_points / 2);
  for (int64_t s = 0; s < slices; ++s) {
    int64_t begin = s * n / slices, end = (s + 1) * n / slices;
    if (begin >= end) continue;
    int64_t lo = begin, hi = begin;
    for (int64_t i = begin; i < end; ++i) {
      if (points[i].second < points[lo].second) lo = i;
      if (points[i].second > points[hi].second) hi = i;
    }
    for (int64_t i : {std::min(lo, hi), std::max(lo, hi)}) {
      if (!out.empty() && out.back()[0] == points[i].first) continue;
      out.push_back({points[i].first, points[i].second});
    }
  }
  if (out.back()[0] != points.back().first) out.push_back({points.back().first, points.back().second});
  return out;
}

}  // namespace

ConsoleApi::ConsoleApi(Coordinator* coordinator, WandbRunsOf wandb_runs)
    : coordinator_(coordinator), wandb_runs_(std::move(wandb_runs)) {}

int ConsoleApi::HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnimplemented:
      return 405;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

ConsoleResponse ConsoleApi::Error(const absl::Status& status) {
  ConsoleResponse r;
  r.status = HttpStatus(status.code());
  nlohmann::json body = {{"error", ValidUtf8(status.message())}, {"code", absl::StatusCodeToString(status.code())}};
  r.body = body.dump();
  return r;
}

std::string ConsoleApi::WandbRunUrl(const wandb::WandbRunInfo& run) {
  if (run.entity.empty() || run.project.empty() || run.run_id.empty()) return "";
  std::string base(absl::StripSuffix(run.base_url.empty() ? "https://api.wandb.ai" : run.base_url, "/"));
  // Only web addresses: the page makes a link of it (a javascript: URL would run in the console).
  if (!absl::StartsWith(base, "https://") && !absl::StartsWith(base, "http://")) return "";
  // W&B's cloud serves its API at api.wandb.ai and its pages at wandb.ai; a self-hosted server
  // serves both from one address.
  if (base == "https://api.wandb.ai" || base == "http://api.wandb.ai") base = "https://wandb.ai";
  return absl::StrCat(base, "/", run.entity, "/", run.project, "/runs/", run.run_id);
}

ConsoleResponse ConsoleApi::Handle(const Principal& who, const ConsoleRequest& request) const {
  absl::StatusOr<nlohmann::json> body = Route(who, request);
  if (!body.ok()) return Error(body.status());
  ConsoleResponse r;
  // Everything shown comes from runs' own processes: replace what is not UTF-8 rather than fail.
  r.body = body->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

absl::StatusOr<nlohmann::json> ConsoleApi::Route(const Principal& who, const ConsoleRequest& request) const {
  if (!absl::StartsWith(request.path, kApiPrefix)) {
    return absl::NotFoundError(absl::StrCat("no API at ", Quote(request.path), " (the API is under /api/v1/)"));
  }
  if (request.method != "GET") {
    return absl::UnimplementedError(
        absl::StrCat(request.method, " ", request.path, ": the console is read-only (GET)"));
  }
  std::vector<std::string> parts = absl::StrSplit(request.path.substr(kApiPrefix.size()), '/');
  if (parts.size() == 1 && parts[0] == "whoami") {
    if (absl::Status s = CheckParams(request, {}); !s.ok()) return s;
    return nlohmann::json{{"admin", who.admin}, {"run_id", who.run_id}};
  }
  if (parts[0] != "runs") return absl::NotFoundError(absl::StrCat("no API at ", Quote(request.path)));
  if (parts.size() == 1) return Runs(who, request);
  const std::string& run_id = parts[1];
  if (absl::Status s = ValidateRunId(run_id); !s.ok()) return s;
  if (absl::Status s = Coordinator::Authorize(who, run_id); !s.ok()) return s;
  if (parts.size() == 2) {
    if (absl::Status s = CheckParams(request, {}); !s.ok()) return s;
    return Run(run_id);
  }
  if (parts.size() == 3 && parts[2] == "checkpoints") {
    if (absl::Status s = CheckParams(request, {}); !s.ok()) return s;
    return Checkpoints(run_id);
  }
  if (parts.size() == 3 && parts[2] == "metrics") return Metrics(run_id, request);
  if (parts.size() == 3 && parts[2] == "series") return Series(run_id, request);
  if (parts.size() == 4 && parts[2] == "logs") return LogTail(run_id, parts[3], request);
  return absl::NotFoundError(absl::StrCat("no API at ", Quote(request.path)));
}

absl::StatusOr<nlohmann::json> ConsoleApi::Runs(const Principal& who, const ConsoleRequest& request) const {
  if (absl::Status s = CheckParams(request, {"state", "limit"}); !s.ok()) return s;
  absl::StatusOr<std::vector<v1::RunState>> states = ParseStates(Param(request, "state"));
  if (!states.ok()) return states.status();
  absl::StatusOr<int64_t> limit = IntParam(request, "limit", 0, 100'000, 0);
  if (!limit.ok()) return limit.status();
  std::vector<v1::Run> runs;
  if (who.admin) {
    // The first page (4 MiB of runs at most): what a page of the console shows.
    absl::StatusOr<Coordinator::RunPage> all = coordinator_->ListRuns(static_cast<int>(*limit), *states);
    if (!all.ok()) return all.status();
    runs = std::move(all->runs);
  } else {
    // A run token sees its own run, the one GetRun would give it.
    absl::StatusOr<v1::Run> own = coordinator_->GetRun(who.run_id);
    if (!own.ok()) return own.status();
    if (states->empty() || std::find(states->begin(), states->end(), own->state()) != states->end()) {
      own->clear_ranks();
      runs.push_back(std::move(*own));
    }
  }
  nlohmann::json list = nlohmann::json::array();
  for (const auto& r : runs) list.push_back(RunJson(r));
  return nlohmann::json{{"runs", std::move(list)}};
}

absl::StatusOr<nlohmann::json> ConsoleApi::Run(const std::string& run_id) const {
  absl::StatusOr<v1::Run> run = coordinator_->GetRun(run_id);
  if (!run.ok()) return run.status();
  nlohmann::json j = RunJson(*run);
  nlohmann::json links = nlohmann::json::array();
  if (wandb_runs_) {
    for (const wandb::WandbRunInfo& w : wandb_runs_(run_id)) {
      links.push_back({{"entity", w.entity},
                       {"project", w.project},
                       {"run_id", w.run_id},
                       {"name", w.display_name},
                       {"mode", w.mode},
                       {"spooled", w.spooled},
                       {"accepted", w.accepted},
                       {"finished", w.finished},
                       {"url", w.mode == "offline" ? "" : WandbRunUrl(w)}});
    }
  }
  j["wandb"] = std::move(links);
  j["rank_step_time"] = RankStepTimes(*run);
  return j;
}

nlohmann::json ConsoleApi::RankStepTimes(const v1::Run& run) const {
  nlohmann::json out = nlohmann::json::object();
  if (run.ranks_size() > kMaxRanksWithStepTime) return out;
  for (const auto& rank : run.ranks()) {
    // A rank's metrics trail its heartbeated step by a batch: a few steps back finds the newest.
    v1::QueryMetricsRequest q;
    q.set_run_id(run.run_id());
    q.set_name("step_time_s");
    q.set_rank(rank.rank());
    q.set_from_step(std::max<int64_t>(0, rank.step() - 20));
    std::optional<v1::MetricRecord> newest;
    for (int page = 0; page < 4; ++page) {
      absl::StatusOr<v1::QueryMetricsResponse> r = coordinator_->metrics().Query(q);
      if (!r.ok() || r->records_size() == 0) break;
      newest = r->records(r->records_size() - 1);
      if (!r->has_next()) break;
      *q.mutable_after() = r->next();
    }
    if (newest) out[std::to_string(rank.rank())] = {{"step", newest->step()}, {"seconds", newest->value()}};
  }
  return out;
}

absl::StatusOr<nlohmann::json> ConsoleApi::Checkpoints(const std::string& run_id) const {
  absl::StatusOr<std::vector<v1::CheckpointInfo>> list = coordinator_->checkpoints().List(run_id);
  if (!list.ok()) return list.status();
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : *list) out.push_back(CheckpointJson(c));
  return nlohmann::json{{"checkpoints", std::move(out)}};
}

absl::StatusOr<nlohmann::json> ConsoleApi::Metrics(const std::string& run_id, const ConsoleRequest& request) const {
  if (absl::Status s =
          CheckParams(request, {"name", "rank", "from_step", "limit", "after_step", "after_rank", "after_name"});
      !s.ok()) {
    return s;
  }
  v1::QueryMetricsRequest q;
  q.set_run_id(run_id);
  q.set_name(Param(request, "name"));
  absl::StatusOr<int64_t> rank = IntParam(request, "rank", 0, kMaxWorldSize - 1, -1);
  absl::StatusOr<int64_t> from = IntParam(request, "from_step", 0, INT64_MAX, 0);
  absl::StatusOr<int64_t> limit = IntParam(request, "limit", 0, kMaxMetricRecordsPerQuery, 0);
  absl::StatusOr<int64_t> after_step = IntParam(request, "after_step", 0, INT64_MAX, -1);
  absl::StatusOr<int64_t> after_rank = IntParam(request, "after_rank", 0, kMaxWorldSize - 1, 0);
  for (const auto* v : {&rank, &from, &limit, &after_step, &after_rank}) {
    if (!v->ok()) return v->status();
  }
  if (*rank >= 0) q.set_rank(static_cast<int32_t>(*rank));
  q.set_from_step(*from);
  q.set_limit(static_cast<int32_t>(*limit));
  if (*after_step >= 0) {
    q.mutable_after()->set_step(*after_step);
    q.mutable_after()->set_rank(static_cast<int32_t>(*after_rank));
    q.mutable_after()->set_name(Param(request, "after_name"));
  }
  absl::StatusOr<v1::QueryMetricsResponse> page = coordinator_->metrics().Query(q);
  if (!page.ok()) return page.status();
  nlohmann::json records = nlohmann::json::array();
  for (const auto& r : page->records()) records.push_back(MetricJson(r));
  nlohmann::json next = nullptr;
  if (page->has_next()) {
    next = {{"step", page->next().step()}, {"rank", page->next().rank()}, {"name", page->next().name()}};
  }
  return nlohmann::json{{"records", std::move(records)}, {"next", std::move(next)}};
}

absl::StatusOr<nlohmann::json> ConsoleApi::Series(const std::string& run_id, const ConsoleRequest& request) const {
  if (absl::Status s = CheckParams(request, {"from_step", "max_points"}); !s.ok()) return s;
  absl::StatusOr<int64_t> from = IntParam(request, "from_step", 0, INT64_MAX, 0);
  if (!from.ok()) return from.status();
  absl::StatusOr<int64_t> max_points = IntParam(request, "max_points", 10, kMaxSeriesPoints, kDefaultSeriesPoints);
  if (!max_points.ok()) return max_points.status();

  std::vector<v1::MetricRecord> records;
  v1::QueryMetricsRequest q;
  q.set_run_id(run_id);
  q.set_from_step(*from);
  bool complete = false;
  while (static_cast<int64_t>(records.size()) < kSeriesRecordBudget) {
    q.set_limit(static_cast<int32_t>(
        std::min<int64_t>(kMaxMetricRecordsPerQuery, kSeriesRecordBudget - static_cast<int64_t>(records.size()))));
    absl::StatusOr<v1::QueryMetricsResponse> page = coordinator_->metrics().Query(q);
    if (!page.ok()) return page.status();
    for (auto& r : *page->mutable_records()) records.push_back(std::move(r));
    if (!page->has_next()) {
      complete = true;
      break;
    }
    *q.mutable_after() = page->next();
  }
  int64_t next_from = *from;
  if (!complete && !records.empty()) {
    // Cut at a step boundary: the last step read may be partial, so it comes with the next request.
    next_from = records.back().step();
    if (next_from > records.front().step()) {
      while (!records.empty() && records.back().step() == next_from) records.pop_back();
    } else {
      next_from += 1;  // one step holds more than the budget: move on past it
    }
  }
  std::map<std::string, std::map<int, std::vector<std::pair<int64_t, double>>>> grouped;
  for (const auto& r : records) grouped[r.name()][r.rank()].emplace_back(r.step(), r.value());
  nlohmann::json series = nlohmann::json::object();
  for (const auto& [name, ranks] : grouped) {
    nlohmann::json by_rank = nlohmann::json::object();
    for (const auto& [rank, points] : ranks) by_rank[std::to_string(rank)] = Downsample(points, *max_points);
    series[name] = std::move(by_rank);
  }
  nlohmann::json out = {{"series", std::move(series)}, {"complete", complete}};
  if (!complete) out["next_from_step"] = next_from;
  return out;
}

namespace {

// Every rank's lines merged, at most this many ranks (the console's tabs show as many).
constexpr int kMaxMergedRanks = 64;

struct RankTail {
  std::string text;    // whole lines (the cut may fall inside one)
  int64_t offset = 0;  // where `text` starts in the file
  int64_t file_size = 0;
  bool truncated = false;
};

// The last `bytes` of a log in `logs` (through the held directory, never a planted link),
// starting at a line. NOT_FOUND when the rank has written nothing yet.
absl::StatusOr<RankTail> ReadRankTail(const DirFd& logs, const std::string& file, size_t bytes) {
  absl::StatusOr<DirFd::Tail> tail = logs.ReadTail(file, bytes);
  if (!tail.ok()) return tail.status();
  RankTail t;
  t.file_size = tail->file_size;
  t.truncated = tail->file_size > static_cast<int64_t>(tail->bytes.size());
  t.offset = tail->file_size - static_cast<int64_t>(tail->bytes.size());
  absl::string_view text = tail->bytes;
  if (t.truncated) {
    // Start at a line: the cut may fall inside one (and inside a UTF-8 character).
    size_t newline = text.find('\n');
    size_t skip = newline == absl::string_view::npos ? text.size() : newline + 1;
    text.remove_prefix(skip);
    t.offset += static_cast<int64_t>(skip);
  }
  t.text = std::string(text);
  return t;
}

// One rank's tail, timed (common/log_lines.h), appended to `out`. NOT_FOUND when it has no log
// yet; a log that is a planted link is refused as a single rank's is.
absl::Status TimedTail(const DirFd& logs, int rank, size_t bytes, std::vector<TimedLine>* out, int64_t* size,
                       bool* truncated) {
  std::string file = absl::StrCat("rank-", rank, ".log");
  absl::StatusOr<RankTail> tail = ReadRankTail(logs, file, bytes);
  if (!tail.ok()) return tail.status();
  *size += tail->file_size;
  *truncated = *truncated || tail->truncated;
  // The chunk records of about as many lines (a record is ~25 bytes and covers a line or more).
  ChunkTimes times;
  if (absl::StatusOr<RankTail> records = ReadRankTail(logs, file + ".times", bytes * 2); records.ok()) {
    times = ParseLogTimes(records->text);
  }
  int64_t last = 0;
  TimingOptions options;
  options.include_partial = true;
  TimeLines(rank, tail->text, tail->offset, times, options, &last, out);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<nlohmann::json> ConsoleApi::LogTail(const std::string& run_id, const std::string& rank_text,
                                                   const ConsoleRequest& request) const {
  if (absl::Status s = CheckParams(request, {"bytes", "fold"}); !s.ok()) return s;
  absl::StatusOr<int64_t> bytes = IntParam(request, "bytes", 1, kMaxLogBytes, kDefaultLogBytes);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<int64_t> fold = IntParam(request, "fold", 0, 1, 0);
  if (!fold.ok()) return fold.status();
  absl::StatusOr<v1::Run> run = coordinator_->GetRun(run_id);
  if (!run.ok()) return run.status();
  int rank = -1;
  bool all = rank_text == "all";
  const int ranks = MostRanks(*run);  // an elastic run's lost ranks keep their logs
  if (!all && (!absl::SimpleAtoi(rank_text, &rank) || rank < 0 || rank >= std::max(1, ranks))) {
    return absl::NotFoundError(
        absl::StrCat("run ", run_id, " has no rank ", Quote(rank_text), " (ranks 0..", ranks - 1, ", or all)"));
  }
  if (*fold == 1 && !all) return absl::InvalidArgumentError("fold=1 applies to logs/all, one stream of every rank");
  // Through the held experiment directory, never through a link planted in it.
  absl::StatusOr<DirFd> exp = OpenExperimentDir(run->exp_dir(), run->exp_dir_identity());
  if (!exp.ok()) return exp.status();
  absl::StatusOr<DirFd> logs = exp->Sub("logs");
  if (!logs.ok()) return logs.status();
  if (all) return AllLogsTail(*run, *logs, static_cast<size_t>(*bytes), *fold == 1);
  std::string file = absl::StrCat("rank-", rank, ".log");
  nlohmann::json out = {{"rank", rank}, {"file", absl::StrCat(run->exp_dir(), "/logs/", file)}};
  absl::StatusOr<RankTail> tail = ReadRankTail(*logs, file, static_cast<size_t>(*bytes));
  if (absl::IsNotFound(tail.status())) {
    out.update({{"size", 0}, {"truncated", false}, {"text", ""}});
    return out;
  }
  if (!tail.ok()) return tail.status();
  out.update({{"size", tail->file_size}, {"truncated", tail->truncated}, {"text", ValidUtf8(tail->text)}});
  return out;
}

absl::StatusOr<nlohmann::json> ConsoleApi::AllLogsTail(const v1::Run& run, const DirFd& logs, size_t bytes,
                                                       bool fold) const {
  int ranks = std::min(std::max(1, MostRanks(run)), kMaxMergedRanks);
  size_t per_rank = std::max<size_t>(4096, bytes / static_cast<size_t>(ranks));
  std::vector<std::vector<TimedLine>> per;
  int64_t size = 0;
  bool truncated = false;
  int64_t covered_from = 0;  // the latest first line among cut tails: all ranks are shown from then
  for (int r = 0; r < ranks; ++r) {
    std::vector<TimedLine> lines;
    bool cut = false;
    absl::Status read = TimedTail(logs, r, per_rank, &lines, &size, &cut);
    if (absl::IsNotFound(read)) continue;  // nothing written yet
    if (!read.ok()) return read;
    if (cut && !lines.empty()) covered_from = std::max(covered_from, lines.front().micros);
    truncated = truncated || cut;
    per.push_back(std::move(lines));
  }
  std::vector<TimedLine> merged = MergeByTime(std::move(per));
  merged.erase(
      std::remove_if(merged.begin(), merged.end(), [&](const TimedLine& l) { return l.micros < covered_from; }),
      merged.end());
  std::string text;
  if (fold) {
    for (const PrintedLine& p : FoldRepeated(merged, ranks)) absl::StrAppend(&text, FormatPrinted(p), "\n");
  } else {
    for (const TimedLine& l : merged) absl::StrAppend(&text, FormatPrinted({{l.rank}, l.text}), "\n");
  }
  return nlohmann::json{{"rank", "all"},          {"file", absl::StrCat(run.exp_dir(), "/logs")},
                        {"ranks", ranks},         {"size", size},
                        {"truncated", truncated}, {"text", ValidUtf8(text)}};
}

}  // namespace dt
