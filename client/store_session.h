// The client half of the pipelined store stream (StoreService.Session). Thread-safe: callers on
// many threads share one stream; each call writes its request and waits for the answer with its
// id. Whichever waiting caller is free reads the stream for everyone (no reader thread, so a
// lone caller pays no thread hand-off).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"

namespace dt {

// The status an answer on the store stream carries (StoreResponse.status; unset is OK).
absl::Status StatusOf(const v1::StoreResponse& r);

class StoreSession {
 public:
  // Opens the stream for the run's generation. `rank` only labels messages (-1 for tools).
  static absl::StatusOr<std::unique_ptr<StoreSession>> Open(std::shared_ptr<CoordinatorClient> client,
                                                            const std::string& run_id, int64_t generation, int rank);
  ~StoreSession();

  absl::Status Set(const std::string& key, std::string value);
  // Sends a set without waiting for it (as c10d::TCPStore's set does): the server answers only a
  // failure, which the next call on this session returns. The stream keeps the order, so a later
  // get sees the value.
  absl::Status SetNoWait(const std::string& key, std::string value);
  // Blocks until the key exists (DEADLINE_EXCEEDED after `timeout`; zero: the run's default).
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  absl::StatusOr<std::string> CompareSet(const std::string& key, std::string expected, std::string desired);
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<bool> DeleteKey(const std::string& key);
  absl::StatusOr<int64_t> NumKeys();
  // The session's rank arrives at barrier `name` (its `sequence`-th arrival there; see
  // BarrierRequest) and waits for the release. Returns the released sequence.
  absl::StatusOr<uint64_t> Barrier(const std::string& name, uint64_t sequence, absl::Duration timeout);

  // The same arrival for a node relay member (client/node_relay.h): sent without waiting, and the
  // coordinator never answers it; the rank learns the outcome from its node's relay. `carried`:
  // the held-back arrivals of other ranks of the node that this one sends with its own.
  absl::Status ArriveAsRelayMember(const std::string& name, uint64_t sequence, absl::Duration timeout,
                                   const std::vector<int32_t>& carried = {});

  // Sends a request and returns its answer (the id is assigned here).
  absl::StatusOr<v1::StoreResponse> Call(v1::StoreRequest request);
  // The same for a request carrying other ranks' operations (client/store_combiner.h): a failure
  // of an earlier set of this session is not theirs, so it stays for this session's next call.
  absl::StatusOr<v1::StoreResponse> CallCarrying(v1::StoreRequest request) { return Send(std::move(request), false); }

  // Requests written to the stream so far (`open` included): what a caller's operations cost in
  // messages, for tests and benchmarks.
  uint64_t RequestsWritten() const ABSL_LOCKS_EXCLUDED(write_mu_);

  // What the coordinator's store sessions accept (its answer to `open`).
  const v1::StoreSessionFeatures& features() const { return features_; }

  // No set sent without waiting is unanswered, and no failure of one is unreported: an operation
  // sent on another stream now cannot overtake anything this session sent.
  bool Quiescent() const ABSL_LOCKS_EXCLUDED(mu_);

  // Unanswered sets after which a set waits for the server to catch up (bounds what a failing
  // stream of sets can queue on the server).
  static constexpr int kMaxUnanswered = 1024;
  // Set in the ids of relay member arrivals, which nobody waits for: the answer to one (a refused
  // carry) is logged, not taken for a failed set that the next call would report.
  static constexpr uint64_t kUnwaitedArrival = uint64_t{1} << 63;

 private:
  StoreSession() = default;
  void Break(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Call, reporting a failed earlier set first when `report_unwaited_error`.
  absl::StatusOr<v1::StoreResponse> Send(v1::StoreRequest request, bool report_unwaited_error);
  // Sends `request`; a failed write breaks the session, and its status is returned.
  // `position`, when given: where on the stream it went (1, 2, ...: the server handles requests in
  // this order).
  absl::Status Write(const v1::StoreRequest& request, uint64_t* position = nullptr) ABSL_LOCKS_EXCLUDED(write_mu_, mu_);
  static v1::StoreRequest BarrierRequest(const std::string& name, uint64_t sequence, absl::Duration timeout);

  std::shared_ptr<CoordinatorClient> client_;
  v1::StoreSessionFeatures features_;  // set once, at Open
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StoreRequest, v1::StoreResponse>> stream_;
  mutable absl::Mutex write_mu_;
  mutable absl::Mutex mu_;
  absl::CondVar answered_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish() was called on the stream
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  // Sets sent without waiting since the last answered call, and the first failure among them
  // (kept for the next call).
  int unwaited_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status unwaited_error_ ABSL_GUARDED_BY(mu_);
  uint64_t writes_ ABSL_GUARDED_BY(write_mu_) = 0;
  // For Quiescent: the stream position of the last set sent without waiting, of the last answered
  // call (every request before it was handled), and sets between counting and writing.
  uint64_t last_unwaited_position_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t answered_through_ ABSL_GUARDED_BY(mu_) = 0;
  int sets_being_written_ ABSL_GUARDED_BY(mu_) = 0;
  // id → answer, present once it arrived.
  absl::flat_hash_map<uint64_t, std::optional<v1::StoreResponse>> answers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dt
