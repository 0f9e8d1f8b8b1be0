#include "client/hashing_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crypto.h"
#include "common/fs.h"

namespace dt {

// SHA-256 of a sequence of pieces, each hashed on a thread of its own while the caller does
// something else with it (writes it). One piece at a time: the hash stays in order.
class BackgroundSha256 {
 public:
  BackgroundSha256() : worker_([this] { Work(); }) {}
  ~BackgroundSha256() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    worker_.join();
  }
  BackgroundSha256(const BackgroundSha256&) = delete;
  BackgroundSha256& operator=(const BackgroundSha256&) = delete;

  // Starts hashing [data, data + n); the bytes must stay valid until AwaitPiece returns.
  void StartPiece(const void* data, size_t n) {
    absl::MutexLock lock(&mu_);
    piece_ = data;
    piece_size_ = n;
  }
  void AwaitPiece() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](const void** piece) { return *piece == nullptr; }, &piece_));
  }
  // Hashes on the caller's thread (small pieces, where a hand-over costs more than the hash);
  // only between pieces.
  void Update(const void* data, size_t n) { hash_.Update(data, n); }
  std::string HexDigest() { return hash_.HexDigest(); }

 private:
  void Work() {
    for (;;) {
      const void* piece;
      size_t size;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &BackgroundSha256::HasWork));
        if (piece_ == nullptr) return;  // stopping
        piece = piece_;
        size = piece_size_;
      }
      hash_.Update(piece, size);  // the mutex hands `hash_` over: only one side touches it at a time
      absl::MutexLock lock(&mu_);
      piece_ = nullptr;
    }
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return piece_ != nullptr || stopping_; }

  Sha256 hash_;
  absl::Mutex mu_;
  const void* piece_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t piece_size_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;  // last: starts once the fields above exist
};

namespace {
// Pieces small enough that the hash and the write of one share it in the CPU's cache, large
// enough that handing each over (two wake-ups) costs well under 1% of hashing it.
constexpr size_t kPiece = 1 << 20;
// Below this, the caller hashes itself: archive headers and small records.
constexpr size_t kHandOverAtLeast = 64 << 10;
// O_DIRECT's alignment of memory, file offsets and sizes: a page covers every device's block.
constexpr size_t kAlignment = 4096;
}  // namespace

void HashingFileWriter::FreeBuffer::operator()(char* p) const { std::free(p); }

const char* FileWriteModeName(FileWriteMode mode) {
  switch (mode) {
    case FileWriteMode::kWriteBehind:
      return "write-behind";
    case FileWriteMode::kDirect:
      return "direct";
    case FileWriteMode::kBuffered:
      return "buffered";
  }
  return "unknown";
}

HashingFileWriter::HashingFileWriter(std::string path, FileWriteMode mode)
    : path_(std::move(path)), hash_(std::make_unique<BackgroundSha256>()) {
  const bool direct = mode == FileWriteMode::kDirect;
  write_behind_ = mode == FileWriteMode::kWriteBehind;
  fd_ = direct ? ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644) : -1;
  if (fd_ >= 0) {
    void* buffer = nullptr;
    if (::posix_memalign(&buffer, kAlignment, kDirectBuffer) == 0) {
      buffer_.reset(static_cast<char*>(buffer));
      direct_ = true;
    } else {
      StopDirect();
    }
    return;
  }
  if (direct && errno != EINVAL) {  // EINVAL: the file system does not do O_DIRECT (tmpfs)
    error_ = ErrnoStatus("create", path_, errno);
    return;
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) error_ = ErrnoStatus("create", path_, errno);
}

HashingFileWriter::~HashingFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

size_t HashingFileWriter::Write(const void* data, size_t n) {
  const auto* bytes = static_cast<const char*>(data);
  for (size_t done = 0; done < n && error_.ok();) {
    if (!direct_) {
      size_t piece = std::min(kPiece, n - done);
      if (int err = HashAndWrite(bytes + done, piece); err != 0) {
        Fail(err);
        break;
      }
      done += piece;
      continue;
    }
    size_t take = std::min(kDirectBuffer - buffered_, n - done);
    std::memcpy(buffer_.get() + buffered_, bytes + done, take);
    buffered_ += take;
    done += take;
    if (buffered_ == kDirectBuffer) {
      buffered_ = 0;
      if (int err = HashAndWrite(buffer_.get(), kDirectBuffer); err != 0) Fail(err);
    }
  }
  return n;
}

int HashingFileWriter::HashAndWrite(const char* data, size_t n) {
  bool hand_over = n >= kHandOverAtLeast;
  if (hand_over) {
    hash_->StartPiece(data, n);
  } else {
    hash_->Update(data, n);
  }
  int err = WriteAll(data, n);
  if (hand_over) hash_->AwaitPiece();
  if (err == 0) bytes_ += static_cast<int64_t>(n);
  if (err == 0 && write_behind_) err = WriteBehind();
  return err;
}

int HashingFileWriter::WriteBehind() {
  for (; bytes_ - started_ >= kWriteBehindRange; started_ += kWriteBehindRange) {
    if (::sync_file_range(fd_, started_, kWriteBehindRange, SYNC_FILE_RANGE_WRITE) != 0) {
      if (errno == EIO || errno == ENOSPC || errno == EDQUOT) return errno;
      write_behind_ = false;  // no write-back to start here (EINVAL, ESPIPE): fsync does it all
      return 0;
    }
  }
  for (; started_ - dropped_ > kWriteBehindRange * kWriteBehindRangesInFlight; dropped_ += kWriteBehindRange) {
    constexpr unsigned kWait = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
    if (::sync_file_range(fd_, dropped_, kWriteBehindRange, kWait) != 0) return errno;
    // Advice: pages the kernel keeps (still referenced) cost memory, not correctness.
    ::posix_fadvise(fd_, dropped_, kWriteBehindRange, POSIX_FADV_DONTNEED);
  }
  return 0;
}

int HashingFileWriter::WriteAll(const char* data, size_t n) {
  for (size_t done = 0; done < n;) {
    ssize_t w = ::write(fd_, data + done, n - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_) {  // accepted at open, refused at the write
        StopDirect();
        continue;
      }
      return errno;
    }
    done += static_cast<size_t>(w);
  }
  return 0;
}

void HashingFileWriter::StopDirect() {
  int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT);
  direct_ = false;
}

absl::StatusOr<v1::ManifestFile> HashingFileWriter::Finish(const std::string& name) {
  if (error_.ok() && buffered_ > 0) {
    // The tail: whole blocks could still go direct, but the file's last partial block cannot,
    // and one buffered write of at most kDirectBuffer bytes costs little.
    size_t tail = std::exchange(buffered_, 0);
    StopDirect();
    if (int err = HashAndWrite(buffer_.get(), tail); err != 0) Fail(err);
  }
  if (error_.ok() && ::fsync(fd_) != 0) Fail(errno);
  if (!error_.ok()) return error_;
  if (write_behind_) ::posix_fadvise(fd_, dropped_, 0, POSIX_FADV_DONTNEED);  // the last ranges, now on disk
  v1::ManifestFile f;
  f.set_name(name);
  f.set_size(bytes_);
  f.set_sha256(hash_->HexDigest());
  return f;
}

void HashingFileWriter::Fail(int err) {
  if (err == ENOSPC || err == EDQUOT) {
    error_ = absl::ResourceExhaustedError(
        absl::StrCat("no space left on device writing ", path_, " (", bytes_,
                     " bytes written): free space there, or keep fewer checkpoints (--keep-checkpoints)"));
  } else {
    error_ = ErrnoStatus("write", path_, err);
  }
}

absl::StatusOr<v1::ManifestFile> WriteHashed(const std::string& dir, const std::string& name, const std::string& data) {
  HashingFileWriter writer(JoinPath(dir, name));
  writer.Write(data.data(), data.size());
  return writer.Finish(name);
}

}  // namespace dt
