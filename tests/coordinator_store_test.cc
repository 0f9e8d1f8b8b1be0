// CoordinatorStore, the c10d::Store that LibTorch's process groups use, with its node's store
// combiner, against a real coordinator over gRPC: a wait and the get after it go through the
// node's batches and see the store as it is; a wait for a key that never comes times out as a wait
// should; a Gloo process group forms on four ranks' stores and reduces.
#include <gtest/gtest.h>

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

  void SetUp() override {
    v1::SubmitRunRequest req;
    *req.mutable_spec() = testing::MakeSpec("store", tmp_.Sub("runs"), 1, kRanks);
    auto r = Call(*admin_, &v1::RunService::Stub::SubmitRun, admin_->runs(), req, absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    run_ = *r;
  }

  // Rank `rank`'s store on node-a, combining with the node's other ranks; `carried` (when given)
  // reads what its combiner carried.
  c10::intrusive_ptr<CoordinatorStore> RankStore(int rank, std::chrono::milliseconds timeout,
                                                 const StoreCombiner** carried = nullptr) {
    auto session = StoreSession::Open(coord_.Client(run_.run_token()), run_.run_id(), 0, rank);
    auto combiner = StoreCombiner::Open(run_.run_id(), 0, "node-a", kRanks);
    if (!session.ok() || !combiner.ok()) {
      ADD_FAILURE() << session.status() << " / " << combiner.status();
      return c10::intrusive_ptr<CoordinatorStore>();
    }
    auto store = c10::make_intrusive<CoordinatorStore>(std::move(*session), timeout);
    if (carried != nullptr) *carried = combiner->get();
    store->CombineWith(std::move(*combiner));
    return store;
  }

  testing::TempDir tmp_;
  EmbeddedCoordinator coord_{tmp_.Sub("state")};
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

// A key that is not there sends the wait on the rank's own stream after the look: it waits, and
// times out with the store's timeout, naming the key.
TEST_F(CoordinatorStoreTest, AWaitForAKeyThatNeverComesTimesOutNamingIt) {
  auto store = RankStore(0, std::chrono::milliseconds(300));
  ASSERT_TRUE(store);
  absl::Time start = absl::Now();
  try {
    store->wait({"never-set"});
    FAIL() << "the wait returned for a key nobody set";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("never-set"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("DEADLINE_EXCEEDED"), std::string::npos) << e.what();
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
}

// Four ranks' stores on one node: the Gloo group forms through them (its address exchange carried
// in the node's batches) and an allreduce adds every rank's tensor.
TEST_F(CoordinatorStoreTest, AGlooProcessGroupFormsOnTheNodesStoresAndReduces) {
  std::vector<const StoreCombiner*> carried(kRanks);
  std::vector<c10::intrusive_ptr<CoordinatorStore>> stores;
  for (int r = 0; r < kRanks; ++r) {
    stores.push_back(RankStore(r, std::chrono::seconds(60), &carried[r]));
    ASSERT_TRUE(stores.back());
  }
  std::vector<float> sums(kRanks, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      auto store = c10::make_intrusive<c10d::PrefixStore>("pg", stores[r]);
      auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      c10d::ProcessGroupGloo group(store, r, kRanks, options);
      std::vector<at::Tensor> tensors{torch::full({2}, static_cast<float>(r + 1))};
      group.allreduce(tensors)->wait();
      sums[r] = tensors[0][1].item<float>();
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(sums[r], 1 + 2 + 3 + 4) << "rank " << r;
  // Each rank waited for its 3 peers' addresses and got each: every get went in a batch (12), and
  // so did every wait's look but perhaps the first, which follows the rank's own unanswered set and
  // goes on its stream (at least 8).
  int64_t ops = 0;
  for (const StoreCombiner* c : carried) ops += c->carried().ops;
  EXPECT_GE(ops, kRanks * (kRanks - 1) + kRanks * (kRanks - 2));
}

}  // namespace
}  // namespace dt
