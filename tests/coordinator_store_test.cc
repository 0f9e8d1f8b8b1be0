// CoordinatorStore, the c10d::Store that LibTorch's process groups use, with its node's store
// combiner, against a real coordinator over gRPC: a wait and the get after it go through the
// node's batches and see the store as it is; in an address exchange the wait fetches the value and
// the get takes it; a wait for a key that never comes times out as a wait should; a Gloo process
// group forms on four ranks' stores and reduces. The same client against a
// coordinator serving as one before StoreSessionFeatures (whose batches refuse gets): it sends
// such a coordinator no get in a batch, and Gloo still forms on it.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "client/coordinator_store.h"
#include "client/store_combiner.h"
#include "client/store_session.h"
#include "coordinator/embedded.h"
#include "tests/test_util.h"

namespace dt {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

class CoordinatorStoreTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 4;

  CoordinatorStoreTest() : CoordinatorStoreTest(EmbeddedOptions{}) {}
  explicit CoordinatorStoreTest(EmbeddedOptions options) : coord_(tmp_.Sub("state"), options) {}

  void SetUp() override {
    v1::SubmitRunRequest req;
    *req.mutable_spec() = testing::MakeSpec("store", tmp_.Sub("runs"), 1, kRanks);
    auto r = Call(*admin_, &v1::RunService::Stub::SubmitRun, admin_->runs(), req, absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    run_ = *r;
  }

  // Rank `rank`'s store on node-a, combining with the node's other ranks; `carried` (when given)
  // reads what its combiner carried, `session_out` (when given) the store's own stream.
  c10::intrusive_ptr<CoordinatorStore> RankStore(int rank, std::chrono::milliseconds timeout,
                                                 const StoreCombiner** carried = nullptr,
                                                 StoreSession** session_out = nullptr) {
    auto session = StoreSession::Open(coord_.Client(run_.run_token()), run_.run_id(), 0, rank);
    auto combiner = StoreCombiner::Open(run_.run_id(), 0, "node-a", kRanks);
    if (!session.ok() || !combiner.ok()) {
      ADD_FAILURE() << session.status() << " / " << combiner.status();
      return c10::intrusive_ptr<CoordinatorStore>();
    }
    if (session_out != nullptr) *session_out = session->get();
    auto store = c10::make_intrusive<CoordinatorStore>(std::move(*session), timeout);
    if (carried != nullptr) *carried = combiner->get();
    store->CombineWith(std::move(*combiner));
    return store;
  }

  // A wait for "never-set" fails as a wait, naming the key, after at least `timeout` (measured on
  // the monotonic clock, as the deadline is kept: the wall clock may be slewed).
  static void ExpectAWaitForANeverSetKeyTimesOut(CoordinatorStore& store, std::chrono::milliseconds timeout) {
    auto start = std::chrono::steady_clock::now();
    try {
      store.wait({"never-set"});
      FAIL() << "the wait returned for a key nobody set";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("coordinator store wait failed"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("never-set"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("DEADLINE_EXCEEDED"), std::string::npos) << e.what();
    }
    EXPECT_GE(std::chrono::steady_clock::now() - start, timeout);
  }

  // Four ranks of node-a form a Gloo group on their stores and allreduce their rank + 1: each
  // rank's sum; `carried`, when given, what each rank's combiner carried.
  // `exchange`: each rank builds its group in a CoordinatorStore::AddressExchange, as dttrainer does.
  std::vector<float> GlooGroupSums(std::vector<const StoreCombiner*>* carried = nullptr, bool exchange = false) {
    std::vector<const StoreCombiner*> carriers(kRanks);
    std::vector<c10::intrusive_ptr<CoordinatorStore>> stores;
    for (int r = 0; r < kRanks; ++r) {
      stores.push_back(RankStore(r, std::chrono::seconds(60), &carriers[r]));
      if (!stores.back()) return {};
    }
    std::vector<float> sums(kRanks, 0);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kRanks; ++r) {
      ranks.emplace_back([&, r] {
        auto store = c10::make_intrusive<c10d::PrefixStore>("pg", stores[r]);
        auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        std::optional<CoordinatorStore::AddressExchange> scope;
        if (exchange) scope.emplace(*stores[r]);
        c10d::ProcessGroupGloo group(store, r, kRanks, options);
        scope.reset();
        std::vector<at::Tensor> tensors{torch::full({2}, static_cast<float>(r + 1))};
        group.allreduce(tensors)->wait();
        sums[r] = tensors[0][1].item<float>();
      });
    }
    for (std::thread& t : ranks) t.join();
    if (carried != nullptr) *carried = carriers;
    return sums;
  }

  testing::TempDir tmp_;
  EmbeddedCoordinator coord_;
  std::shared_ptr<CoordinatorClient> admin_ = coord_.AdminClient();
  v1::SubmitRunResponse run_;
};

// Gloo's pattern (wait for a peer's address, then get it): the wait's look and the get go out in
// the node's batches, and each sees the store as it is now.
TEST_F(CoordinatorStoreTest, AWaitAndTheGetAfterItGoThroughTheNodesBatches) {
  const StoreCombiner* carried = nullptr;
  auto waiter = RankStore(0, std::chrono::seconds(30), &carried);
  auto setter = RankStore(1, std::chrono::seconds(30));
  ASSERT_TRUE(waiter && setter);
  std::vector<uint8_t> got;
  std::thread peer([&] {
    waiter->wait({"addr/1"});
    got = waiter->get("addr/1");
  });
  setter->set("addr/1", Bytes("first"));
  peer.join();
  EXPECT_EQ(got, Bytes("first"));
  // The key is there now: the wait's look and the get are both carried, and the get sees the
  // value set since.
  setter->set("addr/1", Bytes("second"));
  setter->wait({"addr/1"});  // the set was applied (the stream keeps its order)
  StoreCombiner::Carried before = carried->carried();
  waiter->wait({"addr/1"});
  EXPECT_EQ(waiter->get("addr/1"), Bytes("second"));
  EXPECT_EQ(carried->carried().ops - before.ops, 2);
  // A get that no wait came before, with nothing gathering, goes on the rank's own stream (where
  // it would wait for its key).
  EXPECT_EQ(waiter->get("addr/1"), Bytes("second"));
  EXPECT_EQ(carried->carried().ops - before.ops, 2);
}

// A set goes out without waiting for its answer (as c10d's does); until a later answer on the
// rank's own stream shows it applied, the rank's next operation goes behind it on that stream
// instead of in the node's batch, which another rank's stream carries and which could reach the
// coordinator first.
TEST_F(CoordinatorStoreTest, AnAddAfterAnUnansweredSetGoesBehindItOnTheRanksOwnStream) {
  const StoreCombiner* carried = nullptr;
  auto store = RankStore(0, std::chrono::seconds(30), &carried);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->add("counter", 1), 1);
  EXPECT_EQ(carried->carried().ops, 1) << "with nothing unanswered, an add goes in the node's batch";
  store->set("addr/0", Bytes("a"));
  EXPECT_EQ(store->add("counter", 1), 2);
  EXPECT_EQ(carried->carried().ops, 1) << "the add after the set was carried: it could overtake the set";
  // Its answer came after the set's place on the stream: the set is applied, the node's batches
  // are open again.
  EXPECT_EQ(store->add("counter", 1), 3);
  EXPECT_EQ(carried->carried().ops, 2);
}

// A set the coordinator refused is reported by the rank's next operation (as c10d's TCPStore
// reports it), which therefore goes on the rank's own stream, not in a batch that would succeed
// past it; after the report the rank combines again.
TEST_F(CoordinatorStoreTest, ARefusedSetIsReportedByTheNextAddInsteadOfBeingCarriedPastIt) {
  const StoreCombiner* carried = nullptr;
  StoreSession* session = nullptr;
  auto store = RankStore(0, std::chrono::seconds(30), &carried, &session);
  ASSERT_TRUE(store);
  const std::string too_long(600, 'k');  // the coordinator refuses keys over 512 bytes
  store->set(too_long, Bytes("v"));
  // An answer behind the refusal, read without reporting it (as a carrier reads its batch's): the
  // refusal has arrived and waits for the rank's next operation.
  v1::StoreRequest num_keys;
  num_keys.mutable_num_keys();
  ASSERT_TRUE(session->CallCarrying(num_keys).ok());
  ASSERT_FALSE(session->Quiescent());
  try {
    store->add("counter", 1);
    FAIL() << "the add succeeded past the refused set, which was never reported";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("an earlier set failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("INVALID_ARGUMENT"), std::string::npos) << e.what();
  }
  EXPECT_EQ(carried->carried().ops, 0);
  EXPECT_EQ(store->add("counter", 1), 1) << "the reporting add was not applied";
  EXPECT_EQ(carried->carried().ops, 1);
}

// A key that is not there sends the wait on the rank's own stream after the look: it waits, and
// times out with the store's timeout, naming the key.
TEST_F(CoordinatorStoreTest, AWaitForAKeyThatNeverComesTimesOutNamingIt) {
  auto store = RankStore(0, std::chrono::milliseconds(300));
  ASSERT_TRUE(store);
  ExpectAWaitForANeverSetKeyTimesOut(*store, std::chrono::milliseconds(300));
}

// Four ranks' stores on one node: the Gloo group forms through them (its address exchange carried
// in the node's batches) and an allreduce adds every rank's tensor.
TEST_F(CoordinatorStoreTest, AGlooProcessGroupFormsOnTheNodesStoresAndReduces) {
  std::vector<const StoreCombiner*> carried;
  std::vector<float> sums = GlooGroupSums(&carried);
  ASSERT_EQ(sums.size(), kRanks);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(sums[r], 1 + 2 + 3 + 4) << "rank " << r;
  // Each rank waited for its 3 peers' addresses and got each: every get went in a batch (12), and
  // so did every wait's look but perhaps the first, which follows the rank's own unanswered set and
  // goes on its stream (at least 8).
  int64_t ops = 0;
  for (const StoreCombiner* c : carried) ops += c->carried().ops;
  EXPECT_GE(ops, kRanks * (kRanks - 1) + kRanks * (kRanks - 2));
}

// In an address exchange (as dttrainer builds its group), a wait for a key fetches its value and
// the get right after it takes that value: one message on the rank's own stream, none carried.
// The get sees the value as the wait found it; any other operation in between, or a get on another
// thread, forgets it, and once the scope ends a get after a wait asks the coordinator again.
TEST_F(CoordinatorStoreTest, InAnAddressExchangeTheGetAfterAWaitTakesTheValueTheWaitFetched) {
  const StoreCombiner* carried = nullptr;
  StoreSession* session = nullptr;
  auto waiter = RankStore(0, std::chrono::seconds(30), &carried, &session);
  auto setter = RankStore(1, std::chrono::seconds(30));
  ASSERT_TRUE(waiter && setter);
  auto set_and_confirm = [&](const std::string& value) {
    setter->set("addr/1", Bytes(value));
    EXPECT_EQ(setter->get("addr/1"), Bytes(value));  // applied: the setter's stream keeps its order
  };
  {
    CoordinatorStore::AddressExchange exchange(*waiter);
    // The key comes while the wait waits.
    std::vector<uint8_t> got;
    uint64_t before = session->RequestsWritten();
    std::thread peer([&] {
      waiter->wait({"addr/1"});
      got = waiter->get("addr/1");
    });
    set_and_confirm("first");
    peer.join();
    EXPECT_EQ(got, Bytes("first"));
    EXPECT_EQ(session->RequestsWritten() - before, 1) << "the wait and the get took more than one message";
    EXPECT_EQ(carried->carried().ops, 0) << "a read went through the node's batches";

    // The get after the wait sees the value as the wait found it.
    waiter->wait({"addr/1"});
    set_and_confirm("second");
    EXPECT_EQ(waiter->get("addr/1"), Bytes("first"));
    // A get no wait came just before asks the coordinator.
    EXPECT_EQ(waiter->get("addr/1"), Bytes("second"));

    // Another operation in between: the fetched value is forgotten.
    waiter->wait({"addr/1"});
    set_and_confirm("third");
    EXPECT_TRUE(waiter->check({"addr/1"}));
    EXPECT_EQ(waiter->get("addr/1"), Bytes("third"));

    // A get on another thread does not take it, and is the store's next operation.
    waiter->wait({"addr/1"});
    set_and_confirm("fourth");
    std::thread other([&] { EXPECT_EQ(waiter->get("addr/1"), Bytes("fourth")); });
    other.join();
    EXPECT_EQ(waiter->get("addr/1"), Bytes("fourth"));
  }
  // Outside the scope the wait fetches nothing: the get after it sees the value set in between.
  waiter->wait({"addr/1"});
  set_and_confirm("fifth");
  EXPECT_EQ(waiter->get("addr/1"), Bytes("fifth"));
}

// A wait in an address exchange for a key that never comes times out with the store's timeout,
// as a wait, naming the key.
TEST_F(CoordinatorStoreTest, InAnAddressExchangeAWaitForAKeyThatNeverComesTimesOutNamingIt) {
  auto store = RankStore(0, std::chrono::milliseconds(300));
  ASSERT_TRUE(store);
  CoordinatorStore::AddressExchange exchange(*store);
  ExpectAWaitForANeverSetKeyTimesOut(*store, std::chrono::milliseconds(300));
}

// The group forms and reduces when every rank builds it in an address exchange, as dttrainer's do.
TEST_F(CoordinatorStoreTest, AGlooProcessGroupFormsInAnAddressExchangeAndReduces) {
  std::vector<float> sums = GlooGroupSums(nullptr, /*exchange=*/true);
  ASSERT_EQ(sums.size(), kRanks);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(sums[r], 1 + 2 + 3 + 4) << "rank " << r;
}

// A coordinator serving as one from before StoreSessionFeatures: its answer to `open` offers
// nothing, and its batches refuse gets.
class CoordinatorStoreOnAnOlderCoordinatorTest : public CoordinatorStoreTest {
 protected:
  CoordinatorStoreOnAnOlderCoordinatorTest() : CoordinatorStoreTest(OlderCoordinator()) {}
  static EmbeddedOptions OlderCoordinator() {
    EmbeddedOptions o;
    o.store_features = v1::StoreSessionFeatures();
    return o;
  }
};

// What the newer client must not send it: a batch holding a get is refused whole, the other
// ranks' add in it included (nothing of it is applied).
TEST_F(CoordinatorStoreOnAnOlderCoordinatorTest, ItsBatchesRefuseAGetWholeAsAnOlderCoordinatorDid) {
  auto session = StoreSession::Open(coord_.Client(run_.run_token()), run_.run_id(), 0, 0);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_FALSE((*session)->features().batch_get_if_present());
  v1::StoreRequest batch;
  v1::StoreRequest* add = batch.mutable_batch()->add_ops();
  add->set_id(1);
  add->mutable_add()->set_key("counter");
  add->mutable_add()->set_delta(1);
  v1::StoreRequest* get = batch.mutable_batch()->add_ops();
  get->set_id(2);
  get->mutable_get()->set_key("counter");
  get->mutable_get()->set_if_present(true);
  absl::StatusOr<v1::StoreResponse> refused = (*session)->CallCarrying(batch);
  ASSERT_TRUE(refused.ok()) << refused.status();
  absl::Status status = StatusOf(*refused);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("batch_get_if_present"), std::string::npos) << status;
  EXPECT_EQ(*(*session)->Add("counter", 0), 0) << "the refused batch's add was applied";
}

// The newer client against it: a wait and the get after it go on the rank's own stream (no batch
// of the node holds a read), adds still go in the node's batches, and a Gloo group forms.
TEST_F(CoordinatorStoreOnAnOlderCoordinatorTest, TheClientSendsItNoReadInABatchAndGlooFormsOnIt) {
  const StoreCombiner* carried = nullptr;
  auto waiter = RankStore(0, std::chrono::seconds(30), &carried);
  auto setter = RankStore(1, std::chrono::seconds(30));
  ASSERT_TRUE(waiter && setter);
  setter->set("addr/1", Bytes("first"));
  waiter->wait({"addr/1"});
  EXPECT_EQ(waiter->get("addr/1"), Bytes("first"));
  EXPECT_EQ(carried->carried().ops, 0) << "a read went in a batch, which this coordinator refuses";
  EXPECT_EQ(waiter->add("counter", 1), 1);
  EXPECT_EQ(carried->carried().ops, 1) << "adds combine on any coordinator";
  std::vector<float> sums = GlooGroupSums();
  ASSERT_EQ(sums.size(), kRanks);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(sums[r], 1 + 2 + 3 + 4) << "rank " << r;
}

}  // namespace
}  // namespace dt
