// The checkpoint writer's one pass: what it writes is what it hashes, whatever the write sizes,
// and a failed write is reported by Finish with the cause instead of being thrown at the archive.
#include "client/hashing_file_writer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

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
