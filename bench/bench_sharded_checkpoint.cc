// Sharded checkpoint rounds: W ranks (threads of this process, each with its own Agent and
// connection to an embedded dtcoord) each write 1/W of the state into one round, hashing as they
// write (HashingFileWriter, as dttrainer's writer does), fsync, and commit their manifests; the
// coordinator checks the sizes and publishes. Measured from the first Begin to the last commit's
// reply, against `dd conv=fsync` of the same bytes on the same disk, run beside each round: with
// dttrainer's default writes (write-behind), then around the page cache (--checkpoint-io direct)
// and through it (--checkpoint-io buffered).
#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "client/agent.h"
#include "client/hashing_file_writer.h"
#include "common/fs.h"
#include "coordinator/embedded.h"

namespace dt::bench {
namespace {
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point from) { return std::chrono::duration<double>(Clock::now() - from).count(); }

// One rank's part of a round: `bytes` of a pattern written and hashed in 4 MiB pieces.
absl::Status WriteShard(Agent& agent, int64_t step, int64_t bytes, FileWriteMode mode) {
  absl::StatusOr<v1::BeginCheckpointResponse> round = agent.BeginCheckpoint(step, absl::Minutes(5), true);
  if (!round.ok()) return round.status();
  std::string name = absl::StrCat("shard-", agent.rank(), ".bin");
  HashingFileWriter writer(JoinPath(round->partial_dir(), name), mode);
  std::string piece(4 << 20, static_cast<char>('a' + agent.rank()));
  for (int64_t left = bytes; left > 0; left -= static_cast<int64_t>(piece.size())) {
    writer.Write(piece.data(), static_cast<size_t>(std::min<int64_t>(left, piece.size())));
  }
  absl::StatusOr<v1::ManifestFile> file = writer.Finish(name);
  if (!file.ok()) return file.status();
  v1::Manifest manifest;
  *manifest.add_files() = *file;
  return agent.CommitCheckpoint(round->round_id(), &manifest).status();
}

// The rows' names after the writers' count: the default's bare, the others' named.
std::string ModeSuffix(FileWriteMode mode) {
  if (mode == FileWriteMode::kWriteBehind) return "";
  return mode == FileWriteMode::kDirect ? " around the page cache" : " through the page cache";
}

// `mode`: how the writers' files reach the disk (dttrainer's --checkpoint-io).
absl::Status MeasureWriters(EmbeddedCoordinator& coord, int writers, FileWriteMode mode, int64_t bytes, int repeats) {
  std::string save_dir = TempDir(absl::StrCat("sharded-runs-", writers));
  auto admin = coord.AdminClient();
  v1::SubmitRunRequest req;
  req.mutable_spec()->set_experiment_name(absl::StrCat("sharded-", writers));
  req.mutable_spec()->set_save_dir(save_dir);
  req.mutable_spec()->set_nodes(1);
  req.mutable_spec()->set_procs_per_node(writers);
  req.mutable_spec()->set_keep_checkpoints(1);
  auto run = Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(30));
  if (!run.ok()) return run.status();
  std::vector<std::unique_ptr<Agent>> agents;
  for (int slot = 0; slot < writers; ++slot) {
    AgentOptions id;
    id.run_id = run->run_id();
    id.node = "bench";
    id.host = "bench";
    id.local_slot = slot;
    agents.push_back(std::make_unique<Agent>(coord.Client(run->run_token()), id));
  }
  std::vector<absl::Status> results(writers);
  std::vector<std::thread> threads;
  for (int i = 0; i < writers; ++i) {
    threads.emplace_back([&, i] { results[i] = agents[i]->Register(absl::Minutes(1)).status(); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  std::vector<double> round_seconds, dd_seconds;
  const std::string dd_target = JoinPath(save_dir, "dd.bin");
  const int64_t dd_blocks = bytes / (4 << 20);
  for (int r = 1; r <= repeats; ++r) {
    if (DdGoesFirst(r)) {
      if (absl::Status s = TimeDd(dd_target, dd_blocks, dd_seconds); !s.ok()) return s;
    }
    threads.clear();
    auto t0 = Clock::now();
    for (int i = 0; i < writers; ++i) {
      threads.emplace_back([&, i] { results[i] = WriteShard(*agents[i], r, bytes / writers, mode); });
    }
    for (auto& t : threads) t.join();
    round_seconds.push_back(SecondsSince(t0));
    for (const absl::Status& s : results) {
      if (!s.ok()) return s;
    }
    if (!DdGoesFirst(r)) {
      if (absl::Status s = TimeDd(dd_target, dd_blocks, dd_seconds); !s.ok()) return s;
    }
    std::cout << writers << " writers, " << FileWriteModeName(mode) << ", round " << r << " (" << bytes / 1e6
              << " MB): " << round_seconds.back() << " s; dd " << dd_seconds.back() << " s\n";
  }
  Summary round = Summarize(round_seconds), dd = Summarize(dd_seconds);
  // The goal is the default's; the other rows show what --checkpoint-io direct and buffered give on this disk.
  const bool goal = mode == FileWriteMode::kWriteBehind;
  Report({absl::StrCat("sharded checkpoint round, ", writers, " writers", ModeSuffix(mode), " (",
                       static_cast<int>(bytes / 1e6), " MB: write+sha256+fsync each, commit, publish)"),
          bytes / round.p50 / 1e6, "MB/s", "dd conv=fsync of the same bytes", bytes / dd.p50 / 1e6,
          goal ? ">= 0.9x" : "", true, goal ? 0.9 : 0});
  return absl::OkStatus();
}

}  // namespace
}  // namespace dt::bench

int main() {
  using namespace dt;
  using namespace dt::bench;
  std::cout << "== sharded checkpoint rounds vs dd conv=fsync (same disk: " << std::filesystem::temp_directory_path()
            << ")\n";
  EmbeddedOptions opts;
  opts.timeouts.heartbeat_timeout = absl::Hours(1);
  opts.timeouts.hang_timeout = absl::Hours(2);
  EmbeddedCoordinator coord(TempDir("sharded-coord"), opts);
  const int64_t bytes = int64_t{Quick() ? 256 : 1024} << 20;
  for (FileWriteMode mode : kFileWriteModes) {
    for (int writers : {2, 4}) {
      if (absl::Status s = MeasureWriters(coord, writers, mode, bytes, Quick() ? 6 : 8); !s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
    }
  }
  return 0;
}
