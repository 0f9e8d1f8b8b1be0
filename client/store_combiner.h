// The ranks of one node send their store adds (and, under load, their sets and gets) to the
// coordinator together. Each rank's process owns a slot in a node-wide shared-memory segment
// (client/node_segment.h); an operation is written to the slot, and a rank that finds the node's
// carrier lock free (a "lane"; see kLanes) becomes a carrier: it takes every pending operation of
// the node, sends them as one StoreBatchRequest on its own store session, writes each answer back
// to its slot and wakes its owner (a futex). Operations that arrive while every lane is in flight
// wait for the next batch, so under load one message carries many ranks' operations and the
// coordinator handles nodes, not ranks (flat combining across processes). A lone add pays one
// uncontended lock and goes out at once; a set or get goes through a slot only while the node's
// next batch is gathering (Gathering), since alone it is cheaper on the rank's own stream (a set
// there needs no answer, a get waits there for its key). The caller decides that
// (CoordinatorStore): it also sends a wait's look for its key (Exists) and the get right after a
// wait through a slot every time.
//
// Deadlines: an operation still pending (no carrier took it) after go_alone_after (kGoAloneAfter),
// or its `timeout` if shorter, goes alone: the node's lane is held by a carrier that is slow or
// does not come back (a stopped process, a debugger), and an operation nobody took is safe to send
// elsewhere. Once a lane has been held that long, later operations go alone at once (the segment
// records when each lane was taken), so a stopped carrier costs its node one go_alone_after, not
// one per operation. One that a carrier took and did not answer within `timeout` (the store's
// timeout, as c10d's TCPStore applies to every operation): a read (get, check) goes alone, since
// reading again changes nothing; a write (set, add) fails with DEADLINE_EXCEEDED, naming the
// carrier's pid: it may or may not have been applied, as on a broken stream. Its slot stays the carrier's until
// answered; meanwhile the process's reads go alone and its writes fail (FAILED_PRECONDITION): the
// late write may still be applied, and must not land after a later one. The carrier's own
// operation in its batch has no deadline of its own: its stream's.
//
// Safety: a rank whose session has sets still unanswered sends its operation itself (the caller
// checks StoreSession::Quiescent), so nothing of its own is overtaken; an operation through a slot
// is answered before the call returns (or, late, blocks the process's later writes until it is),
// so nothing sent later overtakes it either. A set is the exception, as TCPStore's set is: it is
// left in the slot and its caller reads the answer before its next operation (SettleSet), so it
// is still ordered before everything the rank sends later.
//
// Left sets: a set left in a slot has nobody waiting for it, so it is left only when a carrier is
// bound to take it. The writer stores it pending, then tries the lane: free (or left by a carrier
// that died), it carries the set itself; busy, it looks at the lane's flag. A carrier in flight
// looks at the slots again after it lets the lane go (the flag and the slot's state are
// sequentially consistent on both sides, so one of the two sees the other) and carries the left
// sets it finds in one more batch, flagged final: it looks no further after that one, so no
// carrier works for the others without end. A writer that finds only a final batch in flight
// waits for the lane and carries its set itself (going alone after go_alone_after). Each carrier
// lock is a robust process-shared mutex: a carrier that dies mid-batch is found by the next taker
// of its lock, which answers the operations it held with UNAVAILABLE (they may or may not have
// been applied, as for a broken stream); their owners find the lock free on their next look
// (every 50 ms). A slot-holder that dies leaves its slot unused until the generation ends (an
// operation it left pending is still carried: it may be applied after its rank died). The
// segment's name is removed once every rank of the node opened it, or when any opener closes it:
// a rank opening later then gets a segment of its own, which costs combining, not correctness.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dt/v1/store.pb.h"

namespace dt {

class NodeSegment;

class StoreCombiner {
 public:
  // Opens (creating when needed) the combiner of `run_id`'s `generation` on `node`, and takes a
  // slot in it. Fails when shared memory cannot be used or every slot is taken: the caller then
  // sends its operations itself.
  static absl::StatusOr<std::unique_ptr<StoreCombiner>> Open(const std::string& run_id, int64_t generation,
                                                             const std::string& node, int ranks_on_node);
  ~StoreCombiner();
  StoreCombiner(const StoreCombiner&) = delete;
  StoreCombiner& operator=(const StoreCombiner&) = delete;

  // Sends a StoreBatchRequest on this process's store session (open on the same run and
  // generation) and returns its answer: StoreSession::CallCarrying, or a test's stand-in.
  using SendBatch = std::function<absl::StatusOr<v1::StoreResponse>(v1::StoreRequest)>;

  // Adds `delta` to `key` with the node's other pending operations; `send` carries them when this
  // process is the carrier. The store's answer, as StoreSession::Add gives it. A key longer than
  // the store's limit, a second thread of this process while the first's operation is in flight,
  // and an add no carrier took in time (see Deadlines above), go out alone through `send`.
  // DEADLINE_EXCEEDED when a carrier took it and did not answer within `timeout`
  // (absl::InfiniteDuration(): no deadline); FAILED_PRECONDITION while an earlier write of this
  // process is late.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta, const SendBatch& send, absl::Duration timeout);

  // Sets `key` with the node's other pending operations, without waiting for the answer (as
  // TCPStore's set has none): the set is left in this process's slot, and returns once a carrier
  // is bound to take it (one in flight, which looks again after its batch, or this process when a
  // lane is free). Its answer is read by the next SettleSet, which the caller makes before its next
  // operation on the store. OK: left to be carried; nullopt when it was not (a key or value over
  // what a slot holds, a second thread of this process, the slot still held by a late write, every
  // lane unrecoverable, no lane to be had within go_alone_after or `timeout`): the caller sends it
  // on its own stream. FAILED_PRECONDITION while an earlier write of this process is late.
  std::optional<absl::Status> Set(const std::string& key, const std::string& value, const SendBatch& send,
                                  absl::Duration timeout);

  // The answer to this process's set left in its slot (nothing to do when none is): waits for it,
  // carrying when a lane is free. OK when it was applied; the store's refusal of it; a set no
  // carrier took in time or its carrier could not deliver goes again through `resend` (the rank's
  // own stream; setting a value twice is setting it once); DEADLINE_EXCEEDED (and later writes
  // refused, as for Add) when a carrier took it and did not answer within `timeout`.
  using Resend = std::function<absl::Status(const std::string& key, std::string value)>;
  absl::Status SettleSet(const SendBatch& send, absl::Duration timeout, const Resend& resend);
  // A set of this process is left in its slot, unanswered or its answer unread.
  bool SetUnsettled() const { return set_unsettled_.load(); }

  // The value of `key` if it is in the store now, with the node's other pending operations.
  // nullopt when the key is not there yet, its value is larger than a slot holds (the coordinator
  // leaves it out of the batch's answer), or the get was not carried, not delivered or late (as
  // for Set, and a carrier that took it and did not answer within `timeout`): the caller then gets
  // it on its own stream, which waits for the key.
  std::optional<absl::StatusOr<std::string>> GetIfPresent(const std::string& key, const SendBatch& send,
                                                          absl::Duration timeout);

  // Whether `key` is in the store now (a check), with the node's other pending operations.
  // nullopt when the check was not carried, not delivered or late (as for GetIfPresent): the
  // caller then asks on its own stream.
  std::optional<absl::StatusOr<bool>> Exists(const std::string& key, const SendBatch& send, absl::Duration timeout);

  // A batch of the node is in flight and another operation already waits for the next: one written
  // to a slot now shares that message. Measured with bench_store (2 cores, the set/get/add loop):
  // sets and gets joining whenever a batch is in flight put 64-client throughput at 1.9-2.0x
  // TCPStore but 8-client at 0.71-0.75x (sets then wait for an answer they need not); joining only
  // a gathering batch, 1.9x and 0.82x (0.85x before sets and gets were combined); waiting for 2, 3
  // or 6 pending, 1.1x, 1.4x and 1.0x at 64 clients.
  bool Gathering() const;

  // What this process carried for the node: batches sent and the operations in them (its own and
  // others'). Benchmarks report operations per message from it; tests check every one was carried.
  struct Carried {
    int64_t batches = 0;
    int64_t ops = 0;
  };
  Carried carried() const {
    return Carried{batches_carried_.load(std::memory_order_relaxed), ops_carried_.load(std::memory_order_relaxed)};
  }

  // Operations of the node written to their slots and not yet taken by a carrier.
  int pending() const;

  // Batches that may be in flight at once on a node, each with its carrier lock ("lane"). Measured
  // with bench_store on 2 cores: with two lanes an add that comes while a batch is in flight need
  // not wait for its round trip, but batches halve (3.0 adds per message at 8 clients instead of
  // 5.7) and add p50 at 8 clients rose from 0.93-1.05x TCPStore to 1.35-2.1x; adds in a mixed
  // set/get/add loop gained about as much. One lane: waiting is what gathers the next batch.
  static constexpr int kLanes = 1;
  // Slots per node (processes that can combine; later openers go without).
  static constexpr int kSlots = 256;
  // The largest value a slot holds (a set's, or a get's answer); larger ones go on the rank's own
  // stream. Gloo's address blob holds an address per rank of the group, so it grows with the
  // group; 16 KiB per slot makes a node's segment about 4.3 MB.
  static constexpr size_t kSlotValueBytes = 16 << 10;
  // How long an operation waits for a carrier to take it before it goes alone. A batch's round
  // trip takes milliseconds; a lane held this long is held by a carrier that is stopped or stuck
  // (or a coordinator far behind: going alone is then only less combining).
  static constexpr absl::Duration kGoAloneAfter = absl::Seconds(2);
  // Tests that hold a lane on purpose, for longer than a loaded machine might, make it longer.
  void set_go_alone_after(absl::Duration d) { go_alone_after_ = d; }

  // FAILED_PRECONDITION, naming the carrier, while a write of this process that went late (see
  // Deadlines) may still be applied: a write sent now, here or on the rank's own stream, could
  // land before it. OK otherwise.
  absl::Status WritesAllowed();

  struct Shared;

 private:
  StoreCombiner() = default;
  // Carries a batch when a carrier lock ("lane") is free (one whose carrier died included).
  enum class Carry { kCarried, kBusy, kUnrecoverable };
  // TakeLaneAndCarry, then HandOnPending: the sets left in slots meanwhile are carried here in one
  // final batch, and a waiting owner is nudged to carry the next.
  Carry TryCarry(const SendBatch& send);
  // `final`: the batch is the carrier's last look for left sets (see "Left sets").
  Carry TakeLaneAndCarry(const SendBatch& send, bool final);
  // A lane's batch is in flight and its carrier looks for sets left in slots after it.
  bool AnyLaneLooksAfter() const;
  // A set left in a slot (see Set) is pending.
  bool LeftSetPending() const;
  // After a batch: the left sets pending are carried here in one final batch, and a waiting owner
  // is nudged to carry what comes after.
  void HandOnPending(const SendBatch& send);
  // This process carries on `lane`: takes every pending operation of the node, sends them in one
  // batch through `send` and answers each. Holds the lane's lock.
  void CarryPending(int lane, const SendBatch& send);
  // An operation and its answer, as they travel through this process's slot.
  struct SlotOp;
  struct SlotAnswer;
  // `op` through this process's slot: carried by whichever rank carries next (this one when a
  // lane is free). nullopt when it must go alone (every lane is unrecoverable, no carrier took it
  // in time, or the slot is still held by a carrier this process stopped waiting for).
  std::optional<SlotAnswer> ThroughSlot(const SlotOp& op, const SendBatch& send, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(local_mu_);
  // ThroughSlot under this process's slot lock; nullopt without trying when another thread of
  // this process holds it.
  std::optional<SlotAnswer> TryThroughSlot(const SlotOp& op, const SendBatch& send, absl::Duration timeout);
  // Set's work under this process's slot lock.
  std::optional<absl::Status> LeaveSet(const SlotOp& op, const SendBatch& send, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(local_mu_);
  // Makes this process's slot ready for an operation: false while a left set is unsettled or an
  // operation this process stopped waiting for is still its carrier's.
  bool TakeSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(local_mu_);
  void WriteSlot(const SlotOp& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(local_mu_);
  // DEADLINE_EXCEEDED for a write a carrier (whose slot state is `state`) held past `timeout`.
  absl::Status LateWriteError(absl::Duration timeout, uint32_t state) const;
  // Waits for the answer to this process's operation, pending in its slot, carrying when a lane
  // is free: answered, withdrawn to go alone, or still held by its carrier at `timeout`.
  enum class Awaited { kAnswered, kGoAlone, kLate };
  Awaited AwaitAnswer(const SendBatch& send, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(local_mu_);
  // One add sent by itself, as a batch of one.
  static absl::StatusOr<int64_t> AddAlone(const std::string& key, int64_t delta, const SendBatch& send);
  // Every lane has been held by its carrier for go_alone_after_ or longer (see Deadlines).
  bool LanesStuck() const;
  // The pid of the carrier whose batch holds a slot in `state` (0: none).
  int32_t CarrierOf(uint32_t state) const;
  // Ends, as UNAVAILABLE, the operations that a carrier which died on `lane` was holding. Holds its
  // lock.
  void FailOrphans(int lane);
  // A pending operation whose owner waits for it (not a left set) is nudged to carry the next batch.
  void NudgeOnePending();

  std::unique_ptr<NodeSegment> segment_;
  Shared* shared_ = nullptr;  // in segment_
  int slot_ = -1;
  absl::Mutex local_mu_;  // this process's slot holds one operation at a time
  // A write of this process that a carrier still held at its deadline (see Deadlines); cleared
  // once its answer is in the slot.
  std::atomic<bool> late_write_{false};
  // A set left in this process's slot (Set) whose answer SettleSet has not read.
  std::atomic<bool> set_unsettled_{false};
  absl::Duration go_alone_after_ = kGoAloneAfter;
  std::atomic<int64_t> batches_carried_{0};
  std::atomic<int64_t> ops_carried_{0};
};

}  // namespace dt
