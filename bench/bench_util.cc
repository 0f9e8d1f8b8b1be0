#include "bench/bench_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/subprocess.h"

namespace dt::bench {

Summary Summarize(std::vector<double> s) {
  Summary out;
  if (s.empty()) return out;
  std::sort(s.begin(), s.end());
  auto q = [&](double p) { return s[std::min(s.size() - 1, static_cast<size_t>(p * (s.size() - 1) + 0.5))]; };
  out.n = s.size();
  out.min = s.front();
  out.max = s.back();
  out.p50 = q(0.5);
  out.p90 = q(0.9);
  out.p99 = q(0.99);
  double sum = 0;
  for (double v : s) sum += v;
  out.mean = sum / s.size();
  return out;
}

absl::Status TimeDd(const std::string& path, int64_t blocks, std::vector<double>& seconds) {
  auto t0 = std::chrono::steady_clock::now();
  auto result = RunCommand(
      {"dd", "if=/dev/zero", "of=" + path, "bs=4M", absl::StrCat("count=", blocks), "conv=fsync", "status=none"},
      absl::Minutes(5));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::unlink(path.c_str());
  if (!result.ok()) return result.status();
  if (result->exit_code != 0) return absl::InternalError(absl::StrCat("dd exited with ", result->exit_code));
  seconds.push_back(took);
  return absl::OkStatus();
}

bool DdGoesFirst(int round) { return round % 2 == 0; }

bool Quick() {
  const char* q = std::getenv("DT_BENCH_QUICK");
  return q != nullptr && std::string(q) == "1";
}

void Report(const Result& r, std::optional<bool> absolute_met) {
  double ratio = r.anchor_value != 0 ? r.value / r.anchor_value : 0;
  nlohmann::json met = nullptr;
  if (r.goal_ratio > 0 && r.anchor_value != 0) met = r.higher_is_better ? ratio >= r.goal_ratio : ratio <= r.goal_ratio;
  if (absolute_met) met = *absolute_met;
  std::cout << absl::StrFormat("%-58s %12.4g %-8s | %-22s %12.4g | ratio %7.3f | goal %-14s %s\n", r.name, r.value,
                               r.unit, r.anchor, r.anchor_value, ratio, r.goal,
                               met.is_null() ? "" : (met.get<bool>() ? "met" : "MISSED"));
  const char* out = std::getenv("DT_BENCH_OUT");
  if (out == nullptr || *out == '\0') return;
  nlohmann::json j = {
      {"name", r.name}, {"value", r.value}, {"unit", r.unit}, {"anchor", r.anchor}, {"anchor_value", r.anchor_value},
      {"ratio", ratio}, {"goal", r.goal},   {"met", met}};
  std::ofstream(out, std::ios::app) << j.dump() << "\n";
}

std::string ReadLine(const std::string& path) {
  return std::string(absl::StripTrailingAsciiWhitespace(ReadFile(path).value_or("")));
}

namespace {
// The directories TempDir made, removed at exit unless kept.
std::vector<std::string>& TempDirs() {
  static std::vector<std::string>* dirs = [] {
    auto* v = new std::vector<std::string>();
    std::atexit([] {
      std::error_code ec;
      for (const auto& d : TempDirs()) std::filesystem::remove_all(d, ec);
    });
    return v;
  }();
  return *dirs;
}
}  // namespace

std::string TempDir(const std::string& tag) {
  std::string dir = (std::filesystem::temp_directory_path() / ("dt-bench-" + tag + "-" + RandomHex(4))).string();
  std::filesystem::create_directories(dir);
  TempDirs().push_back(dir);
  return dir;
}

void KeepTempDir(const std::string& dir) {
  std::vector<std::string>& dirs = TempDirs();
  dirs.erase(std::remove(dirs.begin(), dirs.end(), dir), dirs.end());
}

double PipeRoundTripMicros(bool two_processes, int round_trips) {
  int there[2], back[2];
  if (::pipe(there) != 0 || ::pipe(back) != 0) throw std::runtime_error("pipe");
  pid_t child = -1;
  if (two_processes) {
    child = ::fork();
    if (child < 0) throw std::runtime_error("fork");
    if (child == 0) {
      ::close(there[1]);  // the parent's ends: the echo loop ends when the parent closes its own
      ::close(back[0]);
      char c;
      while (::read(there[0], &c, 1) == 1 && ::write(back[1], &c, 1) == 1) {
      }
      ::_exit(0);
    }
  }
  int echo_from = two_processes ? back[0] : there[0];
  std::vector<double> us;
  for (int i = 0; i < round_trips; ++i) {
    char c = 'x';
    auto t0 = std::chrono::steady_clock::now();
    if (::write(there[1], &c, 1) != 1 || ::read(echo_from, &c, 1) != 1) throw std::runtime_error("pipe round trip");
    if (!two_processes && (::write(back[1], &c, 1) != 1 || ::read(back[0], &c, 1) != 1)) {
      throw std::runtime_error("pipe round trip");
    }
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  for (int fd : {there[0], there[1], back[0], back[1]}) ::close(fd);  // the child reads end-of-file
  if (child > 0) ::waitpid(child, nullptr, 0);
  return Summarize(us).p50;
}

}  // namespace dt::bench
