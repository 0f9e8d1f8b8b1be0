#include "client/dtslot/output_relay.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/log.h"

namespace dt::slot {

absl::StatusOr<std::unique_ptr<OutputRelay>> OutputRelay::Start(int out_fd, const std::string& times_path) {
  std::unique_ptr<OutputRelay> r(new OutputRelay());
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  r->read_fd_ = fds[0];
  r->write_fd_ = fds[1];
  r->out_fd_ = out_fd;
  r->times_fd_ = ::open(times_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (r->times_fd_ < 0) {
    // The output still goes to the log; only its order among ranks is lost.
    DT_LOG(Warning) << "cannot open " << times_path << ": " << std::strerror(errno)
                    << "; dtctl logs --all orders this rank's lines by their own timestamps only";
  }
  r->thread_ = std::thread([p = r.get()] { p->Copy(); });
  return r;
}

OutputRelay::~OutputRelay() {
  CloseWriteEnd();
  Join();
  if (read_fd_ >= 0) ::close(read_fd_);
  if (times_fd_ >= 0) ::close(times_fd_);
}

void OutputRelay::CloseWriteEnd() {
  if (write_fd_ >= 0) ::close(write_fd_);
  write_fd_ = -1;
}

void OutputRelay::Join() {
  if (thread_.joinable()) thread_.join();
}

void OutputRelay::Copy() {
  char buffer[64 << 10];
  while (true) {
    ssize_t n = ::read(read_fd_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // every writer closed the pipe
    int64_t micros = absl::ToUnixMicros(absl::Now());
    // A descriptor that refuses (a full disk) loses the bytes, as the program's own write would.
    if (WriteFully(out_fd_, buffer, static_cast<size_t>(n)) != 0) continue;
    off_t size = ::lseek(out_fd_, 0, SEEK_CUR);  // O_APPEND: the log's end after this chunk
    if (times_fd_ >= 0 && size >= 0) {
      std::string line = absl::StrCat(size, " ", micros, "\n");
      (void)WriteFully(times_fd_, line.data(), line.size());
    }
  }
}

}  // namespace dt::slot
