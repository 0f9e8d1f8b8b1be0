#include "client/node_relay.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/fs.h"
#include "common/utf8.h"

namespace dt {
namespace {

constexpr uint64_t kMagic = 0x796c616c65722d74;  // "t-relay"; the layout's version is in the name
constexpr int kSlots = 64;
constexpr size_t kMessageBytes = 1024;
// Members whose arrival a slot holds back for the node's last arrival to carry.
constexpr int kMaxHeldBack = 64;
// A published outcome nobody read for this long is abandoned (its readers gave up): reusable.
constexpr int64_t kAbandonedAfterSeconds = 600;

}  // namespace

struct Slot {
  uint64_t key;                     // 0: free; else the barrier instance's. Under the segment's mutex,
  std::atomic<uint32_t> published;  // but this futex word: 1 once the outcome is in place
  int32_t arrived;                  // ranks of the node that took this slot (holder + members)
  int32_t readers_left;             // from publication: members that have not read the outcome
  int32_t code;
  uint64_t sequence;
  int64_t published_at_s;
  uint32_t message_len;
  char message[kMessageBytes];
  int32_t held_back_count;  // members whose arrival is not yet sent (the last arrival carries them)
  int32_t held_back[kMaxHeldBack];
};

struct NodeRelay::Segment {
  std::atomic<uint64_t> magic;     // set last by the creator: the rest is initialised
  std::atomic<uint32_t> epoch;     // bumped by InterruptWaiters
  std::atomic<uint32_t> attached;  // processes (agents) that opened it
  int32_t ranks_on_node;           // set by the creator
  pthread_mutex_t mu;              // process-shared and robust: a rank killed while holding it does not block the node
  Slot slots[kSlots];
};

namespace {

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

class SegmentLock {
 public:
  explicit SegmentLock(pthread_mutex_t* mu) : mu_(mu) {
    if (pthread_mutex_lock(mu_) == EOWNERDEAD) pthread_mutex_consistent(mu_);
  }
  ~SegmentLock() { pthread_mutex_unlock(mu_); }

 private:
  pthread_mutex_t* mu_;
};

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

// In the name, so that builds with another segment layout never map this one (a user's program
// linked against an older client library on the same node goes without a relay instead).
constexpr int kLayoutVersion = 2;

std::string SegmentPrefix(const std::string& run_id) {
  return absl::StrCat("dt-relay", kLayoutVersion, "-", Sanitized(run_id), "-g");
}

std::string NodeSuffix(const std::string& node) { return absl::StrCat("-", absl::Hex(Fnv1a(node), absl::kZeroPad16)); }

std::string SegmentName(const std::string& run_id, int64_t generation, const std::string& node) {
  return absl::StrCat(SegmentPrefix(run_id), generation, NodeSuffix(node));
}

// Segments of this run's earlier generations on this node: their ranks are gone.
void RemoveEarlierGenerations(const std::string& run_id, int64_t generation, const std::string& node) {
  std::string prefix = SegmentPrefix(run_id);
  std::string suffix = NodeSuffix(node);
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

void FreeSlot(Slot& slot) {
  slot.key = 0;
  slot.published.store(0, std::memory_order_relaxed);
}

void FutexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(timeout);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<NodeRelay>> NodeRelay::Open(const std::string& run_id, int64_t generation,
                                                           const std::string& node, int ranks_on_node) {
  std::unique_ptr<NodeRelay> relay(new NodeRelay());
  relay->name_ = SegmentName(run_id, generation, node);
  std::string path = "/" + relay->name_;
  bool creator = true;
  int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    creator = false;
    fd = ::shm_open(path.c_str(), O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) return ErrnoStatus("open shared memory", path, errno);
  if (creator) {
    RemoveEarlierGenerations(run_id, generation, node);
    if (::ftruncate(fd, sizeof(Segment)) != 0) {
      absl::Status s = ErrnoStatus("size shared memory", path, errno);
      ::close(fd);
      ::shm_unlink(path.c_str());
      return s;
    }
  } else {
    // The creator sizes it right after creating it.
    bool sized = AwaitCreator([fd] {
      struct stat st {};
      return ::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(Segment));
    });
    if (!sized) {
      ::close(fd);
      return absl::UnavailableError(absl::StrCat("shared memory ", path, " was never sized by its creator"));
    }
  }
  void* mem = ::mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (mem == MAP_FAILED) return ErrnoStatus("map shared memory", path, map_errno);
  relay->segment_ = static_cast<Segment*>(mem);
  Segment* seg = relay->segment_;
  if (creator) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&seg->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    seg->ranks_on_node = ranks_on_node;
    seg->magic.store(kMagic, std::memory_order_release);
  } else if (!AwaitCreator([seg] { return seg->magic.load(std::memory_order_acquire) == kMagic; })) {
    return absl::UnavailableError(absl::StrCat("shared memory ", path, " was never initialised by its creator"));
  }
  // Every rank of the node has it mapped: the name is no longer needed.
  if (static_cast<int>(seg->attached.fetch_add(1, std::memory_order_acq_rel)) + 1 >= ranks_on_node) relay->Unlink();
  return relay;
}

NodeRelay::~NodeRelay() {
  if (segment_ != nullptr) ::munmap(segment_, sizeof(Segment));
}

void NodeRelay::InterruptWaiters() {
  segment_->epoch.fetch_add(1, std::memory_order_acq_rel);
  for (Slot& slot : segment_->slots) FutexWake(&slot.published);
}

void NodeRelay::Unlink() { ::shm_unlink(("/" + name_).c_str()); }

namespace {
uint64_t SlotKey(const std::string& name, uint64_t sequence) { return Fnv1a(absl::StrCat(name, "#", sequence)) | 1; }
}  // namespace

int NodeRelay::ArrivedAt(const std::string& name, uint64_t sequence) const {
  uint64_t key = SlotKey(name, sequence);
  SegmentLock lock(&segment_->mu);
  for (const Slot& slot : segment_->slots) {
    if (slot.key == key) return slot.arrived;
  }
  return 0;
}

NodeRelay::Ticket NodeRelay::Arrive(const std::string& name, uint64_t sequence, int rank) {
  uint64_t key = SlotKey(name, sequence);
  int64_t now_s = absl::ToUnixSeconds(absl::Now());
  SegmentLock lock(&segment_->mu);
  int free_slot = -1;
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = segment_->slots[i];
    if (slot.key == key) {
      ++slot.arrived;
      Ticket member{Role::kMember, i};
      if (slot.published.load(std::memory_order_relaxed) == 1) {
        // Came after the publication (a failed instance): one more reader before the slot is free.
        ++slot.readers_left;
        return member;
      }
      // Every rank of the node uses this relay: hold the arrival back for the node's last arrival,
      // which then sends all of them in one message.
      bool whole_node = static_cast<int>(segment_->attached.load(std::memory_order_acquire)) >= segment_->ranks_on_node;
      if (whole_node && slot.arrived == segment_->ranks_on_node) {
        member.carry.assign(slot.held_back, slot.held_back + slot.held_back_count);
        slot.held_back_count = 0;
      } else if (whole_node && slot.held_back_count < kMaxHeldBack) {
        slot.held_back[slot.held_back_count++] = rank;
        member.held_back = true;
      }
      return member;
    }
    bool abandoned = slot.key != 0 && slot.published.load(std::memory_order_relaxed) == 1 &&
                     now_s - slot.published_at_s > kAbandonedAfterSeconds;
    if (free_slot < 0 && (slot.key == 0 || abandoned)) free_slot = i;
  }
  if (free_slot < 0) return Ticket{Role::kDirect, -1};
  Slot& slot = segment_->slots[free_slot];
  slot.key = key;
  slot.published.store(0, std::memory_order_relaxed);
  slot.arrived = 1;
  slot.readers_left = 0;
  slot.code = 0;
  slot.sequence = 0;
  slot.message_len = 0;
  slot.held_back_count = 0;
  return Ticket{Role::kHolder, free_slot};
}

bool NodeRelay::SendHeldBack(const Ticket& ticket, int rank) {
  if (!ticket.held_back) return false;
  Slot& slot = segment_->slots[ticket.slot];
  SegmentLock lock(&segment_->mu);
  int32_t* end = slot.held_back + slot.held_back_count;
  int32_t* it = std::find(slot.held_back, end, rank);
  if (it == end) return false;  // the node's last arrival carried it
  *it = end[-1];
  --slot.held_back_count;
  return true;
}

void NodeRelay::Publish(const Ticket& ticket, const RelayOutcome& outcome) {
  Slot& slot = segment_->slots[ticket.slot];
  {
    SegmentLock lock(&segment_->mu);
    slot.code = static_cast<int32_t>(outcome.status.code());
    std::string message = TruncateUtf8(outcome.status.message(), kMessageBytes);
    slot.message_len = static_cast<uint32_t>(message.size());
    std::memcpy(slot.message, message.data(), message.size());
    slot.sequence = outcome.sequence;
    slot.published_at_s = absl::ToUnixSeconds(absl::Now());
    slot.readers_left = slot.arrived - 1;
    if (slot.readers_left <= 0) {
      FreeSlot(slot);
      return;
    }
    slot.published.store(1, std::memory_order_release);
  }
  FutexWake(&slot.published);
}

absl::StatusOr<RelayOutcome> NodeRelay::Wait(const Ticket& ticket, absl::Time deadline, const std::string& what,
                                             const std::function<absl::Status()>& interrupted, absl::Duration poll) {
  Slot& slot = segment_->slots[ticket.slot];
  uint32_t epoch = segment_->epoch.load(std::memory_order_acquire);
  while (true) {
    if (slot.published.load(std::memory_order_acquire) == 1) {
      RelayOutcome out;
      SegmentLock lock(&segment_->mu);
      out.sequence = slot.sequence;
      if (slot.code != 0) {
        out.status =
            absl::Status(static_cast<absl::StatusCode>(slot.code), std::string(slot.message, slot.message_len));
      }
      if (--slot.readers_left <= 0) FreeSlot(slot);
      return out;
    }
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what,
          ": the first rank of this node to arrive (which hears from the coordinator) published no outcome in "
          "time; did it die?"));
    }
    if (segment_->epoch.load(std::memory_order_acquire) != epoch) {
      return absl::UnavailableError(
          absl::StrCat(what, ": a rank of this node lost its store session to the coordinator; arriving again"));
    }
    if (absl::Status s = interrupted(); !s.ok()) return s;
    FutexWait(&slot.published, 0, std::min(poll, deadline - now));
  }
}

}  // namespace dt
