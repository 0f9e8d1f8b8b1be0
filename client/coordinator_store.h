// A c10d::Store backed by the coordinator's key-value store (one pipelined StoreSession), so Gloo
// and NCCL process groups initialise through dtcoord: no MASTER_ADDR/MASTER_PORT.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "client/store_combiner.h"
#include "client/store_session.h"

namespace dt {

class CoordinatorStore : public c10d::Store {
 public:
  CoordinatorStore(std::unique_ptr<StoreSession> session, std::chrono::milliseconds timeout);
  // Delivers a set still left for the node's carrier (waiting for it at most kSettleAtExit).
  ~CoordinatorStore() override;
  static constexpr absl::Duration kSettleAtExit = absl::Seconds(10);

  // From now on, adds go out with the other ranks' of this node (client/store_combiner.h), and so
  // do sets and gets while the node's next batch is gathering, except when this store has sets still
  // unanswered (the operation then goes behind them on its own stream). A get whose key is not
  // there yet waits for it on its own stream, and so does every get when the coordinator is one
  // whose batches do not take gets (StoreSessionFeatures). A wait for one key first looks for it
  // in the node's next batch (and waits on its own stream only when it is not there), and the get
  // right after it goes in a batch too: Gloo's address exchange. A set through the combiner does not
  // wait for its answer (TCPStore's set has none): the rank's next operation reads it first and
  // fails with its error. An operation a carrier took waits
  // for it up to this store's timeout (DEADLINE_EXCEEDED after, for a write; a read goes alone);
  // after a late write, writes fail until it is answered (StoreCombiner::WritesAllowed).
  void CombineWith(std::unique_ptr<StoreCombiner> combiner) {
    SettleSet("CombineWith");  // a set left in the combiner it replaces
    combiner_ = std::move(combiner);
  }

  // While one is held, a wait for one key also fetches the key's value, and a get of that key by
  // the same thread, as the store's next operation, returns it: one round trip per key where a
  // wait and a get take two (Gloo's address exchange waits for each peer's address, then gets it;
  // on two cores the exchange's round trips are its critical path). The get then sees the value
  // as the wait found it, not one set in between, so hold it only around code whose keys are each
  // written once: dttrainer holds it while it builds its process group (every key under the
  // group's own prefix). Scopes nest; any thread may open one.
  class AddressExchange {
   public:
    explicit AddressExchange(CoordinatorStore& store) : store_(store) { store_.exchanges_.fetch_add(1); }
    ~AddressExchange() { store_.exchanges_.fetch_sub(1); }
    AddressExchange(const AddressExchange&) = delete;
    AddressExchange& operator=(const AddressExchange&) = delete;

   private:
    CoordinatorStore& store_;
  };

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
#if TORCH_VERSION_MAJOR >= 2
  // LibTorch 2.x's Store has clone() pure virtual (a copy for another thread; ProcessGroup's group
  // splits call it). dt neither splits nor clones its groups: this one throws. Not marked override:
  // the earliest 2.x releases do not declare it, and there it is a member of this class alone.
  c10::intrusive_ptr<c10d::Store> clone();
#endif

 private:
  // What carries a batch of the node when this rank is its carrier: its own session.
  StoreCombiner::SendBatch Carrier();
  // Reads the answer to this rank's set left for the node's carrier (see CombineWith), before `op`
  // goes out: its failure is c10d's error of `op`, as a TCPStore set's is the next call's.
  void SettleSet(const char* op);
  // A set that must go again goes on this rank's own stream.
  StoreCombiner::Resend Resend();
  // A set or get goes through the combiner now (see CombineWith).
  bool Combining() const;
  // A get or a wait's look may go through the combiner: the coordinator's batches take them and
  // this rank has no set unanswered.
  bool ReadsMayCombine() const;
  // How long an operation waits for the node's carrier: the store's timeout (c10d's zero, no
  // timeout, waits without end).
  absl::Duration CarrierTimeout() const;

  // Begins operation `op` (any but get): the value a wait fetched is forgotten (see
  // AddressExchange), then SettleSet.
  void Begin(const char* op);
  // The value fetched by the wait for `key` just before, when this thread's get of it is the
  // store's next operation (see AddressExchange); forgets it either way.
  std::optional<std::string> TakeFetched(const std::string& key);

  // With a combiner: c10d's error while a late write of this rank may still be applied.
  void CheckWritesAllowed(const char* op);
  // A get of the key this store's last wait was for (Gloo's pattern: wait for a peer's address,
  // then get it) finds it there: it goes through the combiner even when nothing is gathering.
  bool JustWaitedFor(const std::string& key);

  std::unique_ptr<StoreSession> session_;
  std::unique_ptr<StoreCombiner> combiner_;
  absl::Mutex waited_mu_;
  std::string last_waited_ ABSL_GUARDED_BY(waited_mu_);
  std::atomic<int> exchanges_{0};  // AddressExchange scopes held
  // The value a wait fetched in an AddressExchange, for the get after it.
  struct Fetched {
    std::string key;
    std::string value;
    std::thread::id thread;
  };
  std::optional<Fetched> fetched_ ABSL_GUARDED_BY(waited_mu_);
};

}  // namespace dt
