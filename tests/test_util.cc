#include "tests/test_util.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/blas_core.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/process_tree.h"

namespace dt::testing {

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  path_ = JoinPath(base, absl::StrCat("dt-test-", RandomHex(6)));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  if (std::getenv("DT_KEEP_TEST_DIRS") == nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

std::string TempDir::Sub(const std::string& name) const {
  std::string p = JoinPath(path_, name);
  std::filesystem::create_directories(p);
  return p;
}

std::string BinaryPath(const std::string& name) { return JoinPath(DT_BINARY_DIR, name); }

std::string DataDir() { return JoinPath(DT_SOURCE_DIR, "data"); }

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string ReadToEnd(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

uint64_t SignalMask(const std::string& proc_status, absl::string_view field) {
  for (absl::string_view line : absl::StrSplit(proc_status, '\n')) {
    if (absl::ConsumePrefix(&line, field))
      return std::stoull(std::string(absl::StripLeadingAsciiWhitespace(line)), nullptr, 16);
  }
  ADD_FAILURE() << "no " << field << " in " << proc_status;
  return 0;
}

bool MaskHas(uint64_t mask, int sig) { return (mask & (uint64_t{1} << (sig - 1))) != 0; }

pid_t NodeAgentOf(pid_t pid) {
  for (int hops = 0; pid > 1 && hops < 8; ++hops) {
    std::optional<ProcessInfo> p = ReadProcess(pid);
    if (!p) return 0;
    if (p->comm == "dtrun") return pid;
    pid = p->ppid;
  }
  return 0;
}

pid_t WorkersStoreOf(pid_t agent) {
  for (const ProcessInfo& p : AllProcesses()) {
    if (p.ppid == agent && p.comm == "dtrun-store") return p.pid;
  }
  return 0;
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

void Stall::Arm(const std::string& part, absl::Duration max_wait) {
  absl::MutexLock lock(&mu_);
  part_ = part;
  max_wait_ = max_wait;
}

void Stall::Pass(const std::string& path) {
  absl::Duration max_wait;
  {
    absl::MutexLock lock(&mu_);
    if (part_.empty() || path.find(part_) == std::string::npos) return;
    ++stalled_;
    ++waiting_;
    max_wait = max_wait_;
  }
  released_.WaitForNotificationWithTimeout(max_wait);
  absl::MutexLock lock(&mu_);
  --waiting_;
}

int Stall::stalled() {
  absl::MutexLock lock(&mu_);
  return stalled_;
}

int Stall::waiting() {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

void Stall::Release() {
  if (!released_.HasBeenNotified()) released_.Notify();
}

void HeldMetricObserver::OnMetrics(const v1::Run&, const v1::MetricBatch&) {
  absl::MutexLock lock(&mu_);
  ++delivered_;
  mu_.Await(absl::Condition(&released_));
}

void HeldMetricObserver::Release() {
  absl::MutexLock lock(&mu_);
  released_ = true;
}

int HeldMetricObserver::delivered() {
  absl::MutexLock lock(&mu_);
  return delivered_;
}

StateDbWriteLock::StateDbWriteLock(const std::string& state_dir) {
  if (sqlite3_open(JoinPath(state_dir, "dtcoord.db").c_str(), &db_) != SQLITE_OK) return;
  sqlite3_busy_timeout(db_, 10'000);  // the coordinator may be mid-write
  held_ = sqlite3_exec(db_, "BEGIN EXCLUSIVE;", nullptr, nullptr, nullptr) == SQLITE_OK;
}

StateDbWriteLock::~StateDbWriteLock() { Release(); }

void StateDbWriteLock::Release() {
  if (held_) sqlite3_exec(db_, "COMMIT;", nullptr, nullptr, nullptr);  // an empty transaction
  held_ = false;
  sqlite3_close(db_);  // also after a failed open
  db_ = nullptr;
}

CoordinatorProcess::CoordinatorProcess(const std::string& dir, std::vector<std::string> extra_args,
                                       std::map<std::string, std::string> env)
    : extra_args_(std::move(extra_args)), env_(std::move(env)) {
  state_dir_ = JoinPath(dir, "coord-state");
  log_ = JoinPath(dir, "dtcoord.log");
  Launch("127.0.0.1:0");
}

void CoordinatorProcess::StopAndRestart(int signal, absl::Duration away) {
  process_->Signal(signal);
  if (process_->Wait(absl::Seconds(20)) == -1) throw std::runtime_error("dtcoord did not stop: " + Slurp(log_));
  absl::SleepFor(away);
  ::unlink(JoinPath(state_dir_, "dtcoord.addr").c_str());
  Launch(address_);
}

std::string CoordinatorProcess::metrics_address() const {
  std::string a = Slurp(JoinPath(state_dir_, "metrics.addr"));
  a.erase(a.find_last_not_of("\n") + 1);
  return a;
}

void CoordinatorProcess::Launch(const std::string& listen) {
  std::vector<std::string> argv = {BinaryPath("dtcoord"), "--listen", listen, "--state-dir", state_dir_};
  bool metrics = false;
  for (const auto& a : extra_args_) metrics = metrics || a == "--metrics-listen";
  if (!metrics) argv.insert(argv.end(), {"--metrics-listen", "off"});
  argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
  process_ = std::make_unique<Subprocess>(argv, env_, log_);
  std::string addr_file = JoinPath(state_dir_, "dtcoord.addr");
  if (!WaitFor([&] { return !Slurp(addr_file).empty() || !process_->running(); }, absl::Seconds(20)) ||
      Slurp(addr_file).empty()) {
    throw std::runtime_error("dtcoord did not start: " + Slurp(log_));
  }
  address_ = Slurp(addr_file);
  address_.erase(address_.find_last_not_of("\n") + 1);
  admin_token_ = Slurp(JoinPath(state_dir_, "admin.token"));
  admin_token_.erase(admin_token_.find_last_not_of("\n") + 1);
}

CoordinatorProcess::~CoordinatorProcess() {
  process_->Signal(SIGTERM);
  if (process_->Wait(absl::Seconds(10)) == -1) process_->Signal(SIGKILL);
}

std::shared_ptr<CoordinatorClient> CoordinatorProcess::Client(const std::string& token) const {
  ClientOptions o;
  o.address = address_;
  o.token = token;
  return *CoordinatorClient::Connect(o);
}

v1::SubmitRunResponse CoordinatorProcess::Submit(const v1::RunSpec& spec) const {
  auto admin = AdminClient();
  v1::SubmitRunRequest req;
  *req.mutable_spec() = spec;
  auto r = Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  return *r;
}

v1::Run CoordinatorProcess::GetRun(const std::string& run_id) const {
  auto admin = AdminClient();
  v1::GetRunRequest req;
  req.set_run_id(run_id);
  auto r = Call(*admin, &v1::RunService::Stub::GetRun, admin->runs(), req, absl::Seconds(30));
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  return *r;
}

std::vector<v1::MetricRecord> CoordinatorProcess::Metrics(const std::string& run_id, const std::string& metric,
                                                          std::optional<int> rank) const {
  auto admin = AdminClient();
  v1::QueryMetricsRequest req;
  req.set_run_id(run_id);
  req.set_name(metric);
  if (rank) req.set_rank(*rank);
  auto r = QueryAllMetrics(*admin, req, absl::Seconds(30));
  if (!r.ok()) throw std::runtime_error(r.status().ToString());
  return *r;
}

std::string TrainerLog(const std::string& log_dir, const v1::SubmitRunResponse& run, int index) {
  return JoinPath(log_dir, absl::StrCat(run.run_id(), "-rank", index, ".log"));
}

std::string ExpectedOpenBlasKernels() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  std::string better = OpenBlasCoreToSet();
  return absl::StrCat("(OpenBLAS ", better.empty() ? OpenBlasPickedCore() : better, " kernels)");
}

std::vector<std::string> TinyModelArgs() {
  return {"--dataset",       JoinPath(DataDir(), "alpaca_sample.json"),
          "--tokenizer-dir", JoinPath(DataDir(), "gpt2"),
          "--model",         "tiny",
          "--seq-len",       "64",
          "--log-freq",      "1"};
}

std::vector<std::unique_ptr<Subprocess>> StartTrainers(const CoordinatorProcess& coord,
                                                       const v1::SubmitRunResponse& run, int nodes, int procs,
                                                       const std::vector<std::string>& args,
                                                       const std::string& log_dir) {
  std::vector<std::unique_ptr<Subprocess>> out;
  for (int n = 0; n < nodes; ++n) {
    for (int i = 0; i < procs; ++i) {
      std::vector<std::string> argv = {BinaryPath("dttrainer")};
      for (std::string& a : TinyModelArgs()) argv.push_back(std::move(a));
      argv.insert(argv.end(), {"--node", absl::StrCat("n", n + 1), "--local-rank", std::to_string(i)});
      argv.insert(argv.end(), args.begin(), args.end());
      out.push_back(std::make_unique<Subprocess>(argv,
                                                 std::map<std::string, std::string>{{"DT_COORDINATOR", coord.address()},
                                                                                    {"DT_RUN_ID", run.run_id()},
                                                                                    {"DT_RUN_TOKEN", run.run_token()},
                                                                                    {"OMP_NUM_THREADS", "1"}},
                                                 TrainerLog(log_dir, run, n * procs + i)));
    }
  }
  return out;
}

v1::RunSpec MakeSpec(const std::string& name, const std::string& save_dir, int nodes, int procs_per_node,
                     int max_restarts) {
  v1::RunSpec spec;
  spec.set_experiment_name(name);
  spec.set_save_dir(save_dir);
  spec.set_nodes(nodes);
  spec.set_procs_per_node(procs_per_node);
  spec.set_max_restarts(max_restarts);
  return spec;
}

std::vector<std::unique_ptr<Agent>> RegisterAgents(const std::shared_ptr<CoordinatorClient>& client,
                                                   const std::string& run_id, const std::string& node, int count) {
  std::vector<std::unique_ptr<Agent>> agents;
  for (int slot = 0; slot < count; ++slot) {
    AgentOptions o;
    o.run_id = run_id;
    o.node = node;
    o.local_slot = slot;
    o.host = "host";
    o.pid = 100 + slot;
    agents.push_back(std::make_unique<Agent>(client, o));
  }
  std::vector<std::thread> registering;
  for (auto& a : agents) registering.emplace_back([&a] { EXPECT_TRUE(a->Register(absl::Seconds(10)).ok()); });
  for (auto& t : registering) t.join();
  std::sort(agents.begin(), agents.end(), [](const auto& x, const auto& y) { return x->rank() < y->rank(); });
  return agents;
}

CommandResult RunBinary(const std::string& name, const std::vector<std::string>& args,
                        const std::map<std::string, std::string>& env, absl::Duration timeout) {
  std::vector<std::string> argv = {BinaryPath(name)};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<CommandResult> r = RunCommand(argv, timeout, env);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : CommandResult{};
}

CommandResult RunDtctl(const CoordinatorProcess& coord, const std::vector<std::string>& args,
                       std::map<std::string, std::string> env) {
  env.try_emplace("DT_COORDINATOR", coord.address());
  env.try_emplace("DT_TOKEN", coord.admin_token());
  return RunBinary("dtctl", args, env);
}

double CheckpointMaxAbsDiff(const std::string& save_dir, const std::string& a, const std::string& b, int step) {
  std::string dir_a = JoinPath(save_dir, absl::StrCat(a, "/checkpoints/step-", step));
  std::string dir_b = JoinPath(save_dir, absl::StrCat(b, "/checkpoints/step-", step));
  absl::StatusOr<CommandResult> diff =
      RunCommand({BinaryPath("dttrainer"), "ckpt-diff", dir_a, dir_b}, absl::Minutes(1));
  if (!diff.ok() || diff->exit_code != 0) {
    ADD_FAILURE() << "ckpt-diff " << dir_a << " " << dir_b << ": "
                  << (diff.ok() ? diff->output : diff.status().ToString());
    return 1e9;
  }
  nlohmann::json j = DtctlJson(*diff);  // the JSON after any notes on stderr
  if (j.is_discarded()) {
    ADD_FAILURE() << "ckpt-diff printed no JSON: " << diff->output;
    return 1e9;
  }
  return j.value("max_abs_diff", 1e9);
}

void ExpectResumedLossesMatch(const CoordinatorProcess& coord, const std::string& straight_run,
                              const std::string& resumed_run, int from, int to) {
  std::vector<v1::MetricRecord> want = coord.Metrics(straight_run, "loss", 0);
  std::vector<v1::MetricRecord> got = coord.Metrics(resumed_run, "loss", 0);
  ASSERT_EQ(want.size(), static_cast<size_t>(to));
  ASSERT_EQ(got.size(), static_cast<size_t>(to - from));
  for (int i = 0; i < to - from; ++i) {
    EXPECT_EQ(got[i].step(), from + 1 + i);
    EXPECT_EQ(got[i].value(), want[from + i].value()) << "step " << from + 1 + i;  // bit for bit
  }
}

void ExpectResumeAfterACrashIsExact(const CoordinatorProcess& coord, const std::string& save_dir,
                                    const std::string& log_dir, const std::string& name,
                                    const std::vector<std::string>& args, int crash_step, int steps,
                                    const TrainRun& train) {
  const std::string straight_name = name + "-straight", crashed_name = name + "-crashed";
  v1::SubmitRunResponse straight = train(straight_name, args, 0);
  if (::testing::Test::HasFatalFailure()) return;
  std::vector<std::string> crash_args = args;
  crash_args.insert(crash_args.end(), {"--exit-after-step", std::to_string(crash_step)});
  v1::SubmitRunResponse crashed = train(crashed_name, crash_args, 137);
  if (::testing::Test::HasFatalFailure()) return;
  // The coordinator notices the vanished ranks; the run (no restarts allowed) fails.
  ASSERT_TRUE(WaitFor([&] { return coord.GetRun(crashed.run_id()).state() == v1::FAILED; }, absl::Seconds(30)));
  v1::SubmitRunResponse resumed = train(crashed_name, args, 0);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(resumed.resume_step(), crash_step);
  EXPECT_NE(Slurp(TrainerLog(log_dir, resumed, 0)).find("resumed from"), std::string::npos);
  ASSERT_NO_FATAL_FAILURE(ExpectResumedLossesMatch(coord, straight.run_id(), resumed.run_id(), crash_step, steps));
  EXPECT_EQ(CheckpointMaxAbsDiff(save_dir, straight_name, crashed_name, steps), 0.0);
  EXPECT_EQ(CheckpointMaxAbsDiff(save_dir, straight_name, crashed_name, crash_step), 0.0);
}

double ExpectLossesClose(const CoordinatorProcess& coord, const std::string& reference, const std::string& run,
                         double relative, size_t points) {
  std::vector<v1::MetricRecord> want = coord.Metrics(reference, "loss", 0);
  std::vector<v1::MetricRecord> got = coord.Metrics(run, "loss", 0);
  EXPECT_EQ(want.size(), points);
  EXPECT_EQ(got.size(), points);
  double worst = 0;
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
    EXPECT_EQ(got[i].step(), want[i].step());
    EXPECT_NEAR(got[i].value(), want[i].value(), relative * want[i].value()) << "step " << want[i].step();
    worst = std::max(worst, std::abs(got[i].value() - want[i].value()) / want[i].value());
  }
  return worst;
}

nlohmann::json DtctlJson(const CommandResult& r) {
  size_t start = r.output.find_first_of("[{");
  return nlohmann::json::parse(start == std::string::npos ? "" : r.output.substr(start), nullptr, false);
}

double MetricValue(const std::string& exposition, const std::string& series) {
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 && line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return 0;
}

}  // namespace dt::testing
