// A W&B spool directory of any content (meta.json, state.json, points.bin), as a crash, a disk
// error or a hand edit can leave it: Spool::Load opens it or refuses it with DATA_LOSS naming the
// file, never a crash or an uncaught exception. An opened spool is consistent: what W&B
// acknowledged lies within the points, a torn last record is cut off, the acknowledged position
// reads back, and a point appended after the load is kept by the next load.
//
// Input: two little-endian 16-bit lengths (meta.json's, state.json's), the two files, then
// points.bin. An empty state.json section means no state.json.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "common/log.h"
#include "coordinator/wandb/spool.h"
#include "fuzz/fuzz_check.h"

namespace dt::fuzz {
namespace {

const std::string& Dir() {
  static const std::string* dir = [] {
    SetMinLogLevel(LogLevel::kError);
    return new std::string(MakeScratchDir("spool"));
  }();
  return *dir;
}

// A plain write: what is fuzzed is the load, and an fsync per file made each input take ms.
void Write(const std::string& name, const std::string& content) {
  std::string path = JoinPath(Dir(), name);
  ::unlink(path.c_str());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool written = fd >= 0 && WriteFully(fd, content.data(), content.size()) == 0;
  if (fd >= 0) ::close(fd);
  if (!written) Fail("cannot write " + path);
}

// What the forwarder indexes without checks: each point's values lie in the array, one after the
// other; each names a table entry, at most once a point; the table holds each name once.
void CheckLayout(const wandb::Points& read) {
  Check(std::set<std::string>(read.names.begin(), read.names.end()).size() == read.names.size(),
        "a name is twice in a read's table");
  size_t next = 0;
  for (const wandb::Points::Point& p : read.points) {
    Check(p.begin == next && p.begin <= p.end && p.end <= read.values.size(), "a point's values are out of place");
    std::set<uint32_t> names;
    for (size_t k = p.begin; k < p.end; ++k) {
      Check(read.values[k].name < read.names.size(), "a value names no table entry");
      Check(names.insert(read.values[k].name).second, "a point has a name twice");
    }
    next = p.end;
  }
  Check(next == read.values.size(), "values that belong to no point");
}

void CheckOpened(wandb::Spool& spool, int64_t file_bytes) {
  const wandb::SpoolState& st = spool.state();
  Check(st.acked_points >= 0 && st.acked_points <= spool.size(),
        absl::StrCat("acknowledged points ", st.acked_points, " outside 0..", spool.size()));
  struct stat sb {};
  Check(::stat(JoinPath(Dir(), "points.bin").c_str(), &sb) == 0, "points.bin is gone");
  Check(sb.st_size <= file_bytes, "points.bin grew on load");
  absl::StatusOr<wandb::Points> next = spool.Read(st.acked_points, 1000);
  CheckRefusal(next.status(), "Spool::Read");
  if (next.ok()) {
    Check(static_cast<int64_t>(next->size()) <= spool.size() - st.acked_points, "read more points than there are");
    CheckLayout(*next);
  } else {
    Check(next.status().code() == absl::StatusCode::kDataLoss, "a read failed with " + next.status().ToString());
  }
}

}  // namespace
}  // namespace dt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dt;
  using namespace dt::fuzz;
  if (size < 4 || size > 256 * 1024) return 0;
  uint16_t meta_len = 0, state_len = 0;
  std::memcpy(&meta_len, data, 2);
  std::memcpy(&state_len, data + 2, 2);
  std::string rest(reinterpret_cast<const char*>(data) + 4, size - 4);
  if (meta_len + state_len > rest.size()) return 0;
  Write("meta.json", rest.substr(0, meta_len));
  if (state_len > 0) {
    Write("state.json", rest.substr(meta_len, state_len));
  } else {
    ::unlink(JoinPath(Dir(), "state.json").c_str());
  }
  std::string points = rest.substr(meta_len + state_len);
  Write("points.bin", points);

  absl::StatusOr<std::unique_ptr<wandb::Spool>> spool = wandb::Spool::Load(Dir());
  if (!spool.ok()) {
    CheckRefusal(spool.status(), "Spool::Load");
    Check(spool.status().code() == absl::StatusCode::kDataLoss, "a load failed with " + spool.status().ToString());
    return 0;
  }
  CheckOpened(**spool, static_cast<int64_t>(points.size()));
  int64_t before = (*spool)->size();
  v1::MetricBatch appended;
  v1::MetricPoint* p = appended.add_points();
  p->set_step(1);
  (*p->mutable_values())["loss"] = 1.5;
  Check((*spool)->Append(appended).ok(), "cannot append to a loaded spool");
  Check((*spool)->SaveState().ok(), "cannot save a loaded spool's state");
  spool->reset();
  absl::StatusOr<std::unique_ptr<wandb::Spool>> again = wandb::Spool::Load(Dir());
  Check(again.ok(), "a spool this code saved does not load: " + again.status().ToString());
  Check((*again)->size() == before + 1,
        absl::StrCat("the appended point was lost: ", (*again)->size(), " points, ", before + 1, " expected"));
  absl::StatusOr<wandb::Points> last = (*again)->Read(before, 1);
  Check(last.ok() && last->size() == 1 && last->ValuesOf(0) == std::map<std::string, double>{{"loss", 1.5}},
        "the appended point reads back wrong");
  return 0;
}
