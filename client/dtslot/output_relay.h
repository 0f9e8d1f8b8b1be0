// The rank's output, timed: dtslot gives the program a pipe for stdout and stderr and copies what
// comes through it, unchanged, to its own stdout (the rank's log). For each chunk it records the
// log's size after the chunk and the time it arrived, one "<bytes> <unix microseconds>" line each,
// in a times file beside the log (rank-<R>.log.times). `dtctl logs --all` orders every rank's
// lines by these times; the log itself stays what the program wrote.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace dt::slot {

class OutputRelay {
 public:
  // The pipe, and a thread that copies from it to `out_fd` until every writer closed it. Its
  // times go to `times_path` (appended; created 0644).
  static absl::StatusOr<std::unique_ptr<OutputRelay>> Start(int out_fd, const std::string& times_path);
  ~OutputRelay();

  // The pipe's write end, for the program's stdout and stderr (close-on-exec here: only the
  // program's dup2 copies survive its exec).
  int write_fd() const { return write_fd_; }
  // dtslot's own copy of the write end: closed once the program started, so the pipe ends when
  // the last process of the tree closed it.
  void CloseWriteEnd();
  // Waits until every byte was copied (the tree has ended).
  void Join();

 private:
  OutputRelay() = default;
  void Copy();

  int read_fd_ = -1;
  int write_fd_ = -1;
  int out_fd_ = -1;
  int times_fd_ = -1;
  std::thread thread_;
};

}  // namespace dt::slot
