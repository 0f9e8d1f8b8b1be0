#include "client/node_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/fs.h"

namespace dt {

struct NodeSegment::Header {
  std::atomic<uint64_t> magic;     // set last by the creator: the rest is initialised
  std::atomic<uint32_t> attached;  // processes that opened it
  int32_t ranks_on_node;           // set by the creator
};

namespace {

constexpr uint64_t kMagic = 0x746e656d6765732d;  // "-segment"
// The caller's data starts a cache line after the header.
constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(NodeSegment::Header) <= kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

std::string Sanitized(const std::string& s) {
  std::string out;
  for (char c : s) out.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_');
  return out.substr(0, 64);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string SegmentPrefix(const std::string& kind, int layout_version, const std::string& run_id) {
  return absl::StrCat("dt-", kind, layout_version, "-", Sanitized(run_id), "-g");
}

std::string NodeSuffix(const std::string& node) { return absl::StrCat("-", absl::Hex(Fnv1a(node), absl::kZeroPad16)); }

// Segments of this kind and run from earlier generations on this node: their ranks are gone.
void RemoveEarlierGenerations(const std::string& prefix, const std::string& suffix, int64_t generation) {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (dirent* e = ::readdir(dir)) {
    absl::string_view name = e->d_name;
    if (!absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, suffix)) continue;
    int64_t g;
    if (absl::SimpleAtoi(name, &g) && g < generation) ::shm_unlink(absl::StrCat("/", e->d_name).c_str());
  }
  ::closedir(dir);
}

// Waits up to 2 s for `done()`: another opener creating the segment is that far behind at most.
bool AwaitCreator(const std::function<bool()>& done) {
  absl::Time give_up = absl::Now() + absl::Seconds(2);
  while (!done() && absl::Now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

}  // namespace

absl::StatusOr<std::unique_ptr<NodeSegment>> NodeSegment::Open(const std::string& kind, int layout_version,
                                                               const std::string& run_id, int64_t generation,
                                                               const std::string& node, size_t bytes, int ranks_on_node,
                                                               const std::function<void(void*)>& initialise) {
  std::unique_ptr<NodeSegment> segment(new NodeSegment());
  std::string prefix = SegmentPrefix(kind, layout_version, run_id);
  segment->name_ = absl::StrCat(prefix, generation, NodeSuffix(node));
  std::string path = "/" + segment->name_;
  size_t size = kHeaderBytes + bytes;
  bool creator = true;
  int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    creator = false;
    fd = ::shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) return ErrnoStatus("open shared memory", path, errno);
  if (creator) {
    RemoveEarlierGenerations(prefix, NodeSuffix(node), generation);
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      absl::Status s = ErrnoStatus("size shared memory", path, errno);
      ::close(fd);
      ::shm_unlink(path.c_str());
      return s;
    }
  } else {
    // The creator sizes it right after creating it.
    bool sized = AwaitCreator([fd, size] {
      struct stat st {};
      return ::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(size);
    });
    if (!sized) {
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("shared memory ", path, " was never sized by its creator"));
    }
  }
  void* mem = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (mem == MAP_FAILED) return ErrnoStatus("map shared memory", path, map_errno);
  segment->mapped_ = size;
  segment->header_ = static_cast<Header*>(mem);
  segment->data_ = static_cast<char*>(mem) + kHeaderBytes;
  Header* header = segment->header_;
  if (creator) {
    initialise(segment->data_);
    header->ranks_on_node = ranks_on_node;
    header->magic.store(kMagic, std::memory_order_release);
  } else if (!AwaitCreator([header] { return header->magic.load(std::memory_order_acquire) == kMagic; })) {
    return absl::UnavailableError(absl::StrCat("shared memory ", path, " was never initialised by its creator"));
  }
  // Every rank of the node has it mapped: the name is no longer needed.
  if (static_cast<int>(header->attached.fetch_add(1, std::memory_order_acq_rel)) + 1 >= ranks_on_node) {
    segment->Unlink();
  }
  return segment;
}

NodeSegment::~NodeSegment() {
  if (header_ != nullptr) ::munmap(header_, mapped_);
}

int NodeSegment::ranks_on_node() const { return header_->ranks_on_node; }

int NodeSegment::attached() const { return static_cast<int>(header_->attached.load(std::memory_order_acquire)); }

void NodeSegment::Unlink() { ::shm_unlink(("/" + name_).c_str()); }

void InitSharedRobustMutex(pthread_mutex_t* mu) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(mu, &attr);
  pthread_mutexattr_destroy(&attr);
}

void FutexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(timeout);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace dt
