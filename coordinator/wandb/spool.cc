#include "coordinator/wandb/spool.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/metric_points.h"
#include "dt/v1/metrics.pb.h"

namespace dt::wandb {
namespace {

nlohmann::json MetaJson(const SpoolMeta& m) {
  return {{"entity", m.run.entity},  {"project", m.run.project},
          {"run_id", m.run.run_id},  {"display_name", m.run.display_name},
          {"group", m.run.group},    {"job_type", m.run.job_type},
          {"tags", m.run.tags},      {"config_json", m.run.config_json},
          {"host", m.run.host},      {"program", m.run.program},
          {"base_url", m.base_url},  {"mode", m.mode},
          {"dt_run_id", m.dt_run_id}};
}

// A spool's JSON files are the coordinator's own, but a disk error or a hand edit can leave any
// content: every field is checked for its type, and a wrong one is DATA_LOSS naming the file and
// the field (nlohmann's value() would throw).
class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, std::string file) : j_(j), file_(std::move(file)) {}
  absl::Status status() const { return status_; }
  std::string String(const char* key, const char* fallback) { return Get<std::string>(key, fallback, "a string"); }
  int64_t Int(const char* key, int64_t fallback) { return Get<int64_t>(key, fallback, "an integer"); }
  double Number(const char* key, double fallback) { return Get<double>(key, fallback, "a number"); }
  bool Bool(const char* key, bool fallback) { return Get<bool>(key, fallback, "true or false"); }
  std::vector<std::string> Strings(const char* key) {
    std::vector<std::string> out;
    if (!j_.contains(key)) return out;
    const nlohmann::json& v = j_[key];
    bool ok = v.is_array();
    for (size_t i = 0; ok && i < v.size(); ++i) ok = v[i].is_string();
    if (!ok) return Wrong<std::vector<std::string>>(key, "a list of strings", {});
    for (const auto& e : v) out.push_back(e.get<std::string>());
    return out;
  }

 private:
  template <typename T>
  T Get(const char* key, T fallback, const char* want) {
    if (!j_.contains(key)) return fallback;
    const nlohmann::json& v = j_[key];
    bool ok;
    if constexpr (std::is_same_v<T, std::string>) {
      ok = v.is_string();
    } else if constexpr (std::is_same_v<T, bool>) {
      ok = v.is_boolean();
    } else if constexpr (std::is_same_v<T, int64_t>) {
      ok = v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() <= INT64_MAX : true);
    } else {
      ok = v.is_number();
    }
    if (!ok) return Wrong<T>(key, want, fallback);
    return v.get<T>();
  }
  template <typename T>
  T Wrong(const char* key, const char* want, T fallback) {
    if (status_.ok()) status_ = absl::DataLossError(absl::StrCat(file_, ": \"", key, "\" is not ", want));
    return fallback;
  }

  const nlohmann::json& j_;
  std::string file_;
  absl::Status status_;
};

absl::StatusOr<SpoolMeta> MetaFrom(const nlohmann::json& j, const std::string& file) {
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(file, " is not a JSON object"));
  JsonFields f(j, file);
  SpoolMeta m;
  m.run.entity = f.String("entity", "");
  m.run.project = f.String("project", "");
  m.run.run_id = f.String("run_id", "");
  m.run.display_name = f.String("display_name", "");
  m.run.group = f.String("group", "");
  m.run.job_type = f.String("job_type", "train");
  m.run.tags = f.Strings("tags");
  m.run.config_json = f.String("config_json", "{}");
  m.run.host = f.String("host", "");
  m.run.program = f.String("program", "dttrainer");
  m.base_url = f.String("base_url", "");
  m.mode = f.String("mode", "online");
  m.dt_run_id = f.String("dt_run_id", "");
  if (!f.status().ok()) return f.status();
  return m;
}

absl::StatusOr<SpoolState> StateFrom(const nlohmann::json& s, const std::string& file) {
  if (!s.is_object()) return absl::DataLossError(absl::StrCat(file, " is not a JSON object"));
  JsonFields f(s, file);
  SpoolState st;
  st.acked_points = f.Int("acked_points", 0);
  st.acked_lines = f.Int("acked_lines", 0);
  st.last_step = f.Int("last_step", -1);
  st.runtime_base = f.Number("runtime_base", 0.0);
  st.start_time = f.Number("start_time", 0.0);
  st.finished = f.Bool("finished", false);
  if (s.contains("exitcode") && !s["exitcode"].is_null()) {
    int64_t code = f.Int("exitcode", 0);
    if (code < INT32_MIN || code > INT32_MAX) return absl::DataLossError(absl::StrCat(file, ": exitcode out of range"));
    st.exitcode = static_cast<int>(code);
  }
  if (!f.status().ok()) return f.status();
  if (st.acked_points < 0 || st.acked_lines < 0 || st.last_step < -1 || !std::isfinite(st.runtime_base) ||
      !std::isfinite(st.start_time)) {
    return absl::DataLossError(absl::StrCat(file, ": a count is negative or a time is not finite"));
  }
  if (s.contains("summary") && s["summary"].is_object()) {
    for (auto it = s["summary"].begin(); it != s["summary"].end(); ++it) {
      if (it.value().is_number()) st.summary[it.key()] = it.value().get<double>();
    }
  }
  return st;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Spool>> Spool::Open(const std::string& dir, const SpoolMeta& meta) {
  if (::access(JoinPath(dir, "meta.json").c_str(), R_OK) == 0) return Load(dir);
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  std::unique_ptr<Spool> spool(new Spool());
  spool->dir_ = dir;
  spool->meta_ = meta;
  if (absl::Status s = WriteFileAtomic(JoinPath(dir, "meta.json"), MetaJson(meta).dump(2) + "\n"); !s.ok()) return s;
  if (absl::Status s = spool->SaveState(); !s.ok()) return s;
  if (absl::Status s = spool->OpenFiles(); !s.ok()) return s;
  return spool;
}

absl::StatusOr<std::unique_ptr<Spool>> Spool::Load(const std::string& dir) {
  absl::StatusOr<std::string> meta = ReadFile(JoinPath(dir, "meta.json"));
  if (!meta.ok()) return meta.status();
  nlohmann::json mj = nlohmann::json::parse(*meta, nullptr, false);
  if (mj.is_discarded()) return absl::DataLossError(absl::StrCat(dir, "/meta.json is corrupt"));
  absl::StatusOr<SpoolMeta> parsed_meta = MetaFrom(mj, JoinPath(dir, "meta.json"));
  if (!parsed_meta.ok()) return parsed_meta.status();
  std::unique_ptr<Spool> spool(new Spool());
  spool->dir_ = dir;
  spool->meta_ = std::move(*parsed_meta);
  // A missing or corrupt state.json starts from nothing acknowledged: W&B's resume answer then
  // says where the run stands.
  absl::StatusOr<std::string> state = ReadFile(JoinPath(dir, "state.json"));
  if (state.ok()) {
    nlohmann::json s = nlohmann::json::parse(*state, nullptr, false);
    if (!s.is_discarded()) {
      absl::StatusOr<SpoolState> st = StateFrom(s, JoinPath(dir, "state.json"));
      if (!st.ok()) return st.status();
      spool->state_ = std::move(*st);
    }
  }
  if (absl::Status s = spool->OpenFiles(); !s.ok()) return s;
  return spool;
}

absl::Status Spool::OpenFiles() {
  std::string path = JoinPath(dir_, "points.bin");
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  // Index the complete records; a torn last record (a crash mid-write) is cut off. A record that
  // does not parse counts as one point, which Read refuses (DATA_LOSS) when it comes to it.
  absl::StatusOr<std::string> content = ReadFile(path);
  if (!content.ok()) return content.status();
  absl::MutexLock lock(&index_mu_);
  size_t pos = 0;
  v1::MetricSpoolRecord record;
  while (pos + sizeof(uint32_t) <= content->size()) {
    uint32_t len = 0;
    std::memcpy(&len, content->data() + pos, sizeof(len));
    if (len > content->size() - pos - sizeof(len)) break;
    records_.push_back(Record{static_cast<int64_t>(pos), points_});
    bool parsed = record.ParseFromArray(content->data() + pos + sizeof(len), static_cast<int>(len));
    points_ += parsed && record.has_columns() ? record.columns().steps_size() : 1;
    pos += sizeof(len) + len;
  }
  if (pos != content->size() && ::ftruncate(fd_, static_cast<off_t>(pos)) != 0) {
    return absl::InternalError("cannot truncate a torn spool record");
  }
  file_bytes_ = static_cast<int64_t>(pos);
  if (state_.acked_points > points_) state_.acked_points = points_;
  return absl::OkStatus();
}

size_t Spool::RecordOf(int64_t point) const {
  auto after = std::upper_bound(records_.begin(), records_.end(), point,
                                [](int64_t p, const Record& r) { return p < r.first_point; });
  return static_cast<size_t>(after - records_.begin()) - 1;
}

Spool::~Spool() {
  if (fd_ >= 0) {
    Sync(/*force=*/true);
    ::close(fd_);
  }
}

int64_t Spool::size() const {
  absl::MutexLock lock(&index_mu_);
  return points_;
}

int64_t Spool::unacked_bytes() const {
  absl::MutexLock lock(&index_mu_);
  int64_t acked = std::clamp<int64_t>(state_.acked_points, 0, points_);
  return acked == points_ ? 0 : file_bytes_ - records_[RecordOf(acked)].offset;
}

namespace {

// Appends one record: its length, then `write` of the record's bytes.
template <typename Write>
void AppendRecord(std::string* buf, Write write) {
  const size_t at = buf->size();
  buf->append(sizeof(uint32_t), '\0');  // the record's length, known once it is written
  write();
  const uint32_t len = static_cast<uint32_t>(buf->size() - at - sizeof(uint32_t));
  std::memcpy(buf->data() + at, &len, sizeof(len));
}

}  // namespace

void Spool::Stage(const v1::MetricBatch& batch) {
  if (unaligned_) {
    staged_points_ += MetricPointCount(batch);  // Flush refuses them (DATA_LOSS); its caller counts them dropped
    return;
  }
  if (staged_.empty()) {
    // The caller's lock makes this the only appender: these change only in Flush.
    absl::MutexLock lock(&index_mu_);
    staged_from_bytes_ = file_bytes_;
    staged_from_points_ = points_;
    staged_points_ = 0;
  }
  auto next_record = [&] {
    return Record{staged_from_bytes_ + static_cast<int64_t>(staged_.size()), staged_from_points_ + staged_points_};
  };
  for (const v1::MetricPoint& p : batch.points()) {
    staged_records_.push_back(next_record());
    ++staged_points_;
    AppendRecord(&staged_, [&] { p.AppendToString(&staged_); });  // MetricSpoolRecord's fields 1-3
  }
  if (batch.columns().steps_size() > 0) {
    staged_records_.push_back(next_record());
    staged_points_ += batch.columns().steps_size();
    AppendRecord(&staged_, [&] {
      using google::protobuf::internal::WireFormatLite;
      const v1::MetricColumns& columns = batch.columns();
      google::protobuf::io::StringOutputStream stream(&staged_);
      google::protobuf::io::CodedOutputStream coded(&stream);
      WireFormatLite::WriteTag(v1::MetricSpoolRecord::kColumnsFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED,
                               &coded);
      coded.WriteVarint32(static_cast<uint32_t>(columns.ByteSizeLong()));
      columns.SerializeWithCachedSizes(&coded);
    });
  }
}

absl::Status Spool::Flush() {
  if (staged_.empty() && !unaligned_) return absl::OkStatus();
  std::string buf = std::move(staged_);
  std::vector<Record> added = std::move(staged_records_);
  staged_.clear();
  staged_records_.clear();
  const int64_t points = staged_from_points_ + staged_points_;
  staged_points_ = 0;
  if (unaligned_) {
    return absl::DataLossError(absl::StrCat("the W&B spool in ", dir_,
                                            " has a torn record that could not be cut off; it takes no more points "
                                            "until the coordinator restarts and reopens it"));
  }
  if (int err = WriteFully(fd_, buf.data(), buf.size()); err != 0) {
    // Cut off what was written: the next record must start where the index says. Where even
    // that fails, the file no longer ends where the index does, and appending stops.
    unaligned_ = ::ftruncate(fd_, static_cast<off_t>(staged_from_bytes_)) != 0;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot append to the W&B spool in ", dir_, ": ", std::strerror(err)));
  }
  absl::MutexLock lock(&index_mu_);
  file_bytes_ += static_cast<int64_t>(buf.size());
  records_.insert(records_.end(), added.begin(), added.end());
  points_ = points;
  dirty_ = true;
  return absl::OkStatus();
}

absl::Status Spool::Append(const v1::MetricBatch& batch) {
  Stage(batch);
  return Flush();
}

std::map<std::string, double> Points::ValuesOf(size_t i) const {
  std::map<std::string, double> out;
  for (size_t k = points[i].begin; k < points[i].end; ++k) out[names[values[k].name]] = values[k].value;
  return out;
}

namespace {

// Builds a read's Points: each name entered in the table once.
class PointsBuilder {
 public:
  explicit PointsBuilder(Points* out) : out_(out) {}
  uint32_t NameIndex(const std::string& name) {
    auto [it, added] = index_.try_emplace(name, static_cast<uint32_t>(out_->names.size()));
    if (added) out_->names.push_back(name);
    return it->second;
  }
  // A new point; its values follow with AddValue.
  void StartPoint(int64_t step, double time) {
    out_->points.push_back(Points::Point{step, time, out_->values.size(), out_->values.size()});
  }
  void AddValue(uint32_t name, double value) {
    out_->values.push_back(NamedValue{name, value});
    out_->points.back().end = out_->values.size();
  }

 private:
  Points* out_;
  absl::flat_hash_map<std::string, uint32_t> index_;
};

}  // namespace

absl::StatusOr<Points> Spool::Read(int64_t from, size_t max_points) const {
  Points out;
  if (from < 0) return absl::InvalidArgumentError(absl::StrCat("spool read from point ", from));
  if (max_points == 0) return out;
  int64_t to, begin, end, point;
  {
    // Records already indexed are whole on disk and never change: read them unlocked.
    absl::MutexLock lock(&index_mu_);
    if (from >= points_) return out;
    to = std::min<int64_t>(points_, from + static_cast<int64_t>(max_points));
    const size_t first = RecordOf(from), last = RecordOf(to - 1);
    begin = records_[first].offset;
    end = last + 1 < records_.size() ? records_[last + 1].offset : file_bytes_;
    point = records_[first].first_point;
  }
  std::string buf(static_cast<size_t>(end - begin), '\0');
  ssize_t n = ::pread(fd_, buf.data(), buf.size(), begin);
  if (n != static_cast<ssize_t>(buf.size()))
    return absl::DataLossError(absl::StrCat("short read of the W&B spool in ", dir_));
  auto corrupt = [this] { return absl::DataLossError(absl::StrCat("corrupt record in the W&B spool in ", dir_)); };
  v1::MetricSpoolRecord record;
  v1::MetricBatch batch;  // a columns record, checked as a batch's columns are
  PointsBuilder builder(&out);
  std::vector<uint32_t> column_names;
  out.points.reserve(static_cast<size_t>(to - from));
  // Every value read takes at least a double's 8 bytes of the records: room for that many once,
  // so the values are never copied as they grow (growing them cost page faults on every post),
  // and never more than twice the bytes read, however wide a record is.
  out.values.reserve(buf.size() / sizeof(double));
  for (size_t pos = 0; pos < buf.size() && point < to;) {
    uint32_t len = 0;
    std::memcpy(&len, buf.data() + pos, sizeof(len));
    pos += sizeof(len);
    if (len > buf.size() - pos || !record.ParseFromArray(buf.data() + pos, static_cast<int>(len))) return corrupt();
    pos += len;
    if (!record.has_columns()) {
      if (point++ < from) continue;
      builder.StartPoint(record.step(), record.time());
      for (const auto& [name, value] : record.values()) builder.AddValue(builder.NameIndex(name), value);
      continue;
    }
    batch.mutable_columns()->Swap(record.mutable_columns());
    if (!ValidateMetricPoints(batch).ok()) return corrupt();
    // Validated: the arrays agree and no name is there twice. The cells are read here rather than
    // through ForEachMetricPoint, whose views name each value by string: a column's name is looked
    // up in the table once per record, not once per value.
    const v1::MetricColumns& columns = batch.columns();
    const size_t width = static_cast<size_t>(columns.names_size());
    column_names.clear();
    for (const std::string& name : columns.names()) column_names.push_back(builder.NameIndex(name));
    for (int i = 0; i < columns.steps_size() && point < to; ++i, ++point) {
      if (point < from) continue;
      builder.StartPoint(columns.steps(i), columns.times(i));
      for (size_t j = 0; j < width; ++j) {
        const size_t cell = static_cast<size_t>(i) * width + j;
        if (!MetricValueAbsent(columns, cell))
          builder.AddValue(column_names[j], columns.values(static_cast<int>(cell)));
      }
    }
  }
  return out;
}

void Spool::StateChanged() {
  nlohmann::json summary = nlohmann::json::object();
  for (const auto& [k, v] : state_.summary) summary[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  nlohmann::json s = {{"acked_points", state_.acked_points},
                      {"acked_lines", state_.acked_lines},
                      {"last_step", state_.last_step},
                      {"runtime_base", state_.runtime_base},
                      {"start_time", state_.start_time},
                      {"finished", state_.finished},
                      {"exitcode", state_.exitcode ? nlohmann::json(*state_.exitcode) : nlohmann::json(nullptr)},
                      {"summary", summary}};
  std::string content = s.dump() + "\n";
  absl::MutexLock lock(&taken_mu_);
  taken_state_ = std::move(content);
  ++taken_number_;
}

absl::Status Spool::FlushState() {
  absl::MutexLock saving(&save_mu_);
  std::string content;
  uint64_t number;
  {
    absl::MutexLock lock(&taken_mu_);
    if (taken_number_ == written_state_) return absl::OkStatus();
    content = taken_state_;
    number = taken_number_;
  }
  if (absl::Status s = WriteFileAtomic(JoinPath(dir_, "state.json"), content, 0600); !s.ok()) return s;
  written_state_ = number;
  return absl::OkStatus();
}

absl::Status Spool::SaveState() {
  StateChanged();
  return FlushState();
}

absl::Status Spool::Rebind(const std::string& dt_run_id) {
  meta_.dt_run_id = dt_run_id;
  state_.finished = false;
  state_.exitcode.reset();
  if (absl::Status s = WriteFileAtomic(JoinPath(dir_, "meta.json"), MetaJson(meta_).dump(2) + "\n"); !s.ok()) return s;
  return SaveState();
}

void Spool::Sync(bool force) {
  {
    absl::MutexLock lock(&index_mu_);
    if (!dirty_ || fd_ < 0) return;
    int64_t now = absl::GetCurrentTimeNanos();
    if (!force && now - last_sync_ns_ < 1'000'000'000) return;
    dirty_ = false;  // what is appended from now on waits for the next sync
    last_sync_ns_ = now;
  }
  ::fdatasync(fd_);
}

}  // namespace dt::wandb
