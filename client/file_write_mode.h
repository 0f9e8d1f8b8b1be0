// How a checkpoint file reaches the disk: its own header, so configuration structs name it
// without the writer's dependencies.
#pragma once

namespace dt {

// How a checkpoint file reaches the disk.
enum class FileWriteMode {
  // Through the page cache, each 8 MiB range's write-back started as soon as it is filled
  // (sync_file_range) and its pages dropped once on disk (POSIX_FADV_DONTNEED), two ranges
  // behind the writer: the disk gets a deep queue, as `dd`'s write-back gives it, and a file
  // holds at most about 24 MiB of the node's page cache however large it is. Measured here
  // (bench/findings.md): sharded rounds of 256 MB from 2 and 4 writers at 0.85-1.68x `dd
  // conv=fsync`, against 0.46-0.83x direct. The copy into the cache costs CPU: where training
  // keeps the cores busy, direct writes faster.
  kWriteBehind,
  // Around the page cache (O_DIRECT) from an aligned buffer: the least CPU (no copy into the
  // cache), but one write in flight per file.
  kDirect,
  // Through the page cache, left there for the kernel's write-back until fsync.
  kBuffered,
};

// Every mode, in the order dttrainer's --checkpoint-io lists them.
inline constexpr FileWriteMode kFileWriteModes[] = {FileWriteMode::kWriteBehind, FileWriteMode::kDirect,
                                                    FileWriteMode::kBuffered};

// "write-behind", "direct", "buffered": the names dttrainer's --checkpoint-io takes.
const char* FileWriteModeName(FileWriteMode mode);

}  // namespace dt
