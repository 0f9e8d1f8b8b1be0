// The checkpoint writer's one pass: what it writes is what it hashes, whatever the write sizes,
// and a failed write is reported by Finish with the cause instead of being thrown at the archive.
#include "client/hashing_file_writer.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "common/crypto.h"
#include "common/fs.h"
#include "tests/test_util.h"

namespace dt {
namespace {

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

TEST(HashingFileWriterTest, WritesAndHashesEveryByteInOrderWhateverTheWriteSizes) {
  testing::TempDir tmp;
  // Archive-like: small headers between records of every size around the hand-over threshold
  // (64 KiB) and the piece size (1 MiB), and one record of several pieces with a tail.
  std::vector<size_t> sizes = {30,      (64 << 10) - 1, 64 << 10, 1,         (1 << 20) - 7,
                               1 << 20, (1 << 20) + 1,  0,        3'500'017, 12};
  std::string expected;
  HashingFileWriter writer(JoinPath(tmp.path(), "model.pt"));
  uint32_t seed = 1;
  for (size_t n : sizes) {
    std::string part = RandomBytes(n, seed++);
    EXPECT_EQ(writer.Write(part.data(), part.size()), n);
    expected += part;
  }
  absl::StatusOr<v1::ManifestFile> f = writer.Finish("model.pt");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->name(), "model.pt");
  EXPECT_EQ(f->size(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ(f->sha256(), Sha256Hex(expected));
  absl::StatusOr<std::string> on_disk = ReadFile(JoinPath(tmp.path(), "model.pt"));
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_TRUE(*on_disk == expected) << "the file differs from what was written";
}

// Whether `dir`'s file system takes O_DIRECT writes of whole aligned blocks.
bool TakesDirectWrites(const std::string& dir) {
  std::string probe = JoinPath(dir, "direct-probe");
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  if (fd < 0) return false;
  void* block = nullptr;
  bool ok = ::posix_memalign(&block, 4096, 4096) == 0;
  if (ok) {
    std::memset(block, 0, 4096);
    ok = ::write(fd, block, 4096) == 4096;
    std::free(block);
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return ok;
}

// Several direct buffers' worth, in writes that never line up with them, and a tail that is not
// whole blocks: the file and the digest are exactly what was written, on every file system.
void ExpectExactFileAcrossBuffers(const std::string& dir, FileWriteMode mode) {
  std::string path = JoinPath(dir, "optimizer.pt");
  HashingFileWriter writer(path, mode);
  std::string expected;
  uint32_t seed = 11;
  for (size_t n : {size_t{64}, HashingFileWriter::kDirectBuffer - 64 + 1, size_t{3} << 20, size_t{5'000'003},
                   size_t{4096}, size_t{17}}) {
    std::string part = RandomBytes(n, seed++);
    EXPECT_EQ(writer.Write(part.data(), part.size()), n);
    expected += part;
  }
  // Whole buffers have been written by now (the tail waits for Finish): a file system that took
  // the open but refuses direct writes has been found out, as the probe finds it.
  EXPECT_EQ(writer.direct(), mode == FileWriteMode::kDirect && TakesDirectWrites(dir))
      << "around the page cache exactly where " << dir << " allows and it was asked for";
  absl::StatusOr<v1::ManifestFile> f = writer.Finish("optimizer.pt");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), static_cast<int64_t>(expected.size()));
  EXPECT_EQ(f->sha256(), Sha256Hex(expected));
  absl::StatusOr<std::string> on_disk = ReadFile(path);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_TRUE(*on_disk == expected) << "the file differs from what was written";
}

TEST(HashingFileWriterTest, WritesAroundThePageCacheWhereTheFileSystemAllowsWithTheSameBytes) {
  testing::TempDir tmp;  // a disk's file system here (ext4 takes O_DIRECT)
  ExpectExactFileAcrossBuffers(tmp.path(), FileWriteMode::kDirect);
}

TEST(HashingFileWriterTest, WritesBehindWithTheSameBytes) {
  testing::TempDir tmp;
  ExpectExactFileAcrossBuffers(tmp.path(), FileWriteMode::kWriteBehind);  // the default
}

TEST(HashingFileWriterTest, WritesThroughThePageCacheWhenAskedTo) {
  testing::TempDir tmp;
  ExpectExactFileAcrossBuffers(tmp.path(), FileWriteMode::kBuffered);  // --checkpoint-io buffered
}

// Bytes of `path` in the page cache (mincore over a mapping of the whole file).
int64_t ResidentBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  int64_t resident = 0;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
      std::vector<unsigned char> in_core((static_cast<size_t>(st.st_size) + page - 1) / page);
      if (::mincore(map, static_cast<size_t>(st.st_size), in_core.data()) == 0) {
        for (unsigned char c : in_core) resident += (c & 1) * static_cast<int64_t>(page);
      } else {
        resident = -1;
      }
      ::munmap(map, static_cast<size_t>(st.st_size));
    } else {
      resident = -1;
    }
  }
  ::close(fd);
  return resident;
}

// What write-behind is for: a checkpoint many times larger than its ranges in flight holds no
// more of the node's page cache than those ranges while it is written, and almost none once done.
TEST(HashingFileWriterTest, AFileWrittenBehindHoldsOnlyItsRangesInFlightInThePageCache) {
  testing::TempDir tmp;
  struct statfs fs {};
  ASSERT_EQ(::statfs(tmp.path().c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << tmp.path() << " is tmpfs: the page cache is the file";
  std::string path = JoinPath(tmp.path(), "model.pt");
  HashingFileWriter writer(path, FileWriteMode::kWriteBehind);
  const int64_t bound = HashingFileWriter::kWriteBehindRange * (HashingFileWriter::kWriteBehindRangesInFlight + 1);
  const std::string piece = RandomBytes(4 << 20, 3);
  int64_t most = 0;
  for (int i = 0; i < 24; ++i) {  // 96 MiB: four times the bound
    writer.Write(piece.data(), piece.size());
    int64_t resident = ResidentBytes(path);
    ASSERT_GE(resident, 0) << "mincore of " << path;
    most = std::max(most, resident);
  }
  EXPECT_TRUE(writer.writing_behind()) << "this file system gave no write-back to start";
  EXPECT_LE(most, bound) << "bytes of the file in the page cache while it was written (96 MiB)";
  absl::StatusOr<v1::ManifestFile> f = writer.Finish("model.pt");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 24 * static_cast<int64_t>(piece.size()));
  EXPECT_LE(ResidentBytes(path), HashingFileWriter::kWriteBehindRange) << "bytes left in the page cache once on disk";
}

TEST(HashingFileWriterTest, WritesThroughThePageCacheWhereTheFileSystemRefusesDirectWrites) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm (tmpfs) here";
  std::string dir = absl::StrCat("/dev/shm/dt-hfw-", ::getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  ExpectExactFileAcrossBuffers(dir, FileWriteMode::kDirect);  // tmpfs refuses O_DIRECT at open
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A file size limit of `limit` bytes, not a whole number of writes: a write comes up short, the next
// is refused (EFBIG; SIGXFSZ ignored, as the default would end the test).
void ExpectAWriteRefusedPartWayReportedWithThePath(const std::string& dir, FileWriteMode mode, size_t limit_bytes) {
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = limit_bytes;
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string path = JoinPath(dir, "model.pt");
  absl::StatusOr<v1::ManifestFile> f;
  {
    HashingFileWriter writer(path, mode);
    std::string big = RandomBytes(2 * limit_bytes, 5);
    EXPECT_EQ(writer.Write(big.data(), big.size()), big.size());  // never short towards the archive
    f = writer.Finish("model.pt");
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("cannot write " + path), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find(std::strerror(EFBIG)), std::string::npos) << f.status();
}

TEST(HashingFileWriterTest, ADirectWriteRefusedPartWayIsReportedWithThePath) {
  testing::TempDir tmp;
  if (!TakesDirectWrites(tmp.path())) GTEST_SKIP() << tmp.path() << " does not take direct writes";
  // Within the second direct buffer.
  ExpectAWriteRefusedPartWayReportedWithThePath(tmp.path(), FileWriteMode::kDirect,
                                                HashingFileWriter::kDirectBuffer * 3 / 2);
}

TEST(HashingFileWriterTest, AWriteRefusedPartWayWhileWritingBehindIsReportedWithThePath) {
  testing::TempDir tmp;
  // Past two ranges whose write-back was started, half a megabyte into a piece.
  ExpectAWriteRefusedPartWayReportedWithThePath(tmp.path(), FileWriteMode::kWriteBehind,
                                                2 * HashingFileWriter::kWriteBehindRange + (5 << 19));
}

TEST(HashingFileWriterTest, AFullDiskIsNamedWithThePathAndWhatToDo) {
  // /dev/full answers every write with ENOSPC.
  HashingFileWriter writer("/dev/full");
  std::string big = RandomBytes(3 << 20, 7);
  EXPECT_EQ(writer.Write(big.data(), big.size()), big.size());  // never short towards the archive
  EXPECT_EQ(writer.Write("tail", 4), 4u);
  absl::StatusOr<v1::ManifestFile> f = writer.Finish("optimizer.pt");
  ASSERT_EQ(f.status().code(), absl::StatusCode::kResourceExhausted) << f.status();
  EXPECT_NE(f.status().message().find("no space left on device writing /dev/full"), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("--keep-checkpoints"), std::string::npos) << f.status();
}

TEST(HashingFileWriterTest, AFileThatCannotBeCreatedIsNamed) {
  testing::TempDir tmp;
  std::string path = JoinPath(tmp.path(), "no-such-dir/model.pt");
  HashingFileWriter writer(path);
  EXPECT_EQ(writer.Write("abc", 3), 3u);
  absl::StatusOr<v1::ManifestFile> f = writer.Finish("model.pt");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound) << f.status();
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status();
}

}  // namespace
}  // namespace dt
