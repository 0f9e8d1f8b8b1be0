// The key-value store's c10d semantics, with blocking calls driven by a fake clock.
#include <gtest/gtest.h>

#include "coordinator/kv_store.h"

namespace dt {
namespace {

class KvStoreTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  TimerQueue timers_{&clock_};
  SharedBudget budget_{16 << 20};
  std::shared_ptr<KvStore> store_ =
      std::make_shared<KvStore>("run r-test generation 0", &timers_, StoreLimits{5, 1000, &budget_});

  template <typename T>
  PendingPtr<T> Capture(std::optional<absl::StatusOr<T>>* out) {
    return MakePending<T>([out](absl::StatusOr<T> v) { *out = std::move(v); });
  }
  void Advance(absl::Duration d) {
    clock_.Advance(d);
    timers_.RunDue();
  }
};

TEST_F(KvStoreTest, SetThenGet) {
  Deferred d;
  ASSERT_TRUE(store_->Set("k", "v", d).ok());
  std::optional<absl::StatusOr<std::string>> got;
  store_->Get("k", absl::Seconds(1), Capture(&got), d);
  d.RunNow();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(**got, "v");
}

TEST_F(KvStoreTest, GetBlocksUntilSet) {
  std::optional<absl::StatusOr<std::string>> got;
  {
    Deferred d;
    store_->Get("late", absl::Seconds(10), Capture(&got), d);
  }
  EXPECT_FALSE(got.has_value());
  Advance(absl::Seconds(5));
  EXPECT_FALSE(got.has_value());
  {
    Deferred d;
    ASSERT_TRUE(store_->Set("late", "here", d).ok());
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(**got, "here");
  Advance(absl::Seconds(10));  // the cancelled timer does nothing more
  EXPECT_EQ(store_->waiting(), 0u);
}

TEST_F(KvStoreTest, GetTimesOutNamingTheKey) {
  std::optional<absl::StatusOr<std::string>> got;
  {
    Deferred d;
    store_->Get("missing-key", absl::Seconds(3), Capture(&got), d);
  }
  Advance(absl::Milliseconds(2999));
  EXPECT_FALSE(got.has_value());
  Advance(absl::Milliseconds(1));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got->status().message().find("missing-key"), std::string::npos);
  EXPECT_NE(got->status().message().find("3s"), std::string::npos);
}

TEST_F(KvStoreTest, WaitNeedsEveryKeyAndNamesTheMissingOnes) {
  std::optional<absl::StatusOr<Unit>> done;
  {
    Deferred d;
    ASSERT_TRUE(store_->Set("a", "1", d).ok());
    store_->Wait({"a", "b", "c"}, absl::Seconds(2), Capture(&done), d);
    ASSERT_TRUE(store_->Set("b", "1", d).ok());
  }
  EXPECT_FALSE(done.has_value());
  Advance(absl::Seconds(2));
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(done->status().message().find("\"c\""), std::string::npos);
  EXPECT_EQ(done->status().message().find("\"b\""), std::string::npos);

  std::optional<absl::StatusOr<Unit>> again;
  {
    Deferred d;
    store_->Wait({"a", "b", "c"}, absl::Seconds(2), Capture(&again), d);
    ASSERT_TRUE(store_->Set("c", "1", d).ok());
  }
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->ok());
}

TEST_F(KvStoreTest, AddIsAnAtomicDecimalCounter) {
  Deferred d;
  EXPECT_EQ(*store_->Add("n", 5, d), 5);
  EXPECT_EQ(*store_->Add("n", -2, d), 3);
  std::optional<absl::StatusOr<std::string>> got;
  store_->Get("n", absl::Seconds(1), Capture(&got), d);
  d.RunNow();
  EXPECT_EQ(**got, "3");  // as c10d::TCPStore stores it
  ASSERT_TRUE(store_->Set("text", "abc", d).ok());
  EXPECT_EQ(store_->Add("text", 1, d).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvStoreTest, CompareSetFollowsC10d) {
  Deferred d;
  // Missing key, empty expected: sets.
  EXPECT_EQ(*store_->CompareSet("k", "", "first", d), "first");
  // Wrong expected: unchanged, returns the current value.
  EXPECT_EQ(*store_->CompareSet("k", "nope", "second", d), "first");
  // Right expected: swaps.
  EXPECT_EQ(*store_->CompareSet("k", "first", "second", d), "second");
  // Missing key, non-empty expected: returns expected, sets nothing.
  EXPECT_EQ(*store_->CompareSet("absent", "x", "y", d), "x");
  EXPECT_FALSE(*store_->Check({"absent"}));
}

TEST_F(KvStoreTest, CheckDeleteNumKeys) {
  Deferred d;
  ASSERT_TRUE(store_->Set("a", "1", d).ok());
  ASSERT_TRUE(store_->Set("b", "2", d).ok());
  EXPECT_TRUE(*store_->Check({"a", "b"}));
  EXPECT_FALSE(*store_->Check({"a", "z"}));
  EXPECT_EQ(*store_->NumKeys(), 2);
  EXPECT_TRUE(*store_->DeleteKey("a"));
  EXPECT_FALSE(*store_->DeleteKey("a"));
  EXPECT_EQ(*store_->NumKeys(), 1);
}

TEST_F(KvStoreTest, LimitsAreEnforcedAndNamed) {
  Deferred d;
  absl::Status big = store_->Set("big", std::string((4 << 20) + 1, 'x'), d);
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("4 MiB"), std::string::npos);
  auto roomy = std::make_shared<KvStore>("run r-roomy generation 0", &timers_, StoreLimits{5, 8 << 20, &budget_});
  EXPECT_TRUE(roomy->Set("fits", std::string(4 << 20, 'x'), d).ok());
  roomy.reset();
  EXPECT_TRUE(store_->Set("fits", "x", d).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store_->Set("k" + std::to_string(i), "v", d).ok());
  absl::Status full = store_->Set("one-too-many", "v", d);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("limit is 5"), std::string::npos);
  EXPECT_TRUE(store_->Set("k0", "overwrite is fine", d).ok());
}

TEST_F(KvStoreTest, AbortFailsWaitersAndLaterCalls) {
  std::optional<absl::StatusOr<std::string>> got;
  {
    Deferred d;
    store_->Get("never", absl::Seconds(100), Capture(&got), d);
    store_->Abort(absl::AbortedError("generation 0 failed: rank 1 died"), d);
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->status().code(), absl::StatusCode::kAborted);
  Deferred d;
  EXPECT_EQ(store_->Set("k", "v", d).code(), absl::StatusCode::kAborted);
  EXPECT_NE(store_->NumKeys().status().message().find("rank 1 died"), std::string::npos);
}

// A parked get or wait holds memory too (a tester's 30 waits for 30,000 keys each took the
// coordinator from 27 MiB to 1.6 GiB): it is charged to the run's budget while it waits, refused
// with RESOURCE_EXHAUSTED past it, and gives the bytes back when it ends.
TEST_F(KvStoreTest, ParkedWaitsAreChargedToTheRunsBudget) {
  Deferred d;
  std::vector<std::string> many;
  for (int i = 0; i < 20; ++i) many.push_back("key-" + std::to_string(i) + std::string(20, 'k'));
  std::optional<absl::StatusOr<Unit>> refused;
  store_->Wait(many, absl::Seconds(10), Capture(&refused), d);
  d.RunNow();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status().code(), absl::StatusCode::kResourceExhausted) << refused->status();
  EXPECT_NE(refused->status().message().find("--store-bytes-per-run"), std::string::npos);
  EXPECT_EQ(budget_.used(), 0);
  std::optional<absl::StatusOr<Unit>> parked;
  store_->Wait({"a", "b"}, absl::Seconds(10), Capture(&parked), d);
  EXPECT_FALSE(parked.has_value());
  EXPECT_GT(budget_.used(), 0);  // held while it waits
  ASSERT_TRUE(store_->Set("a", "1", d).ok());
  ASSERT_TRUE(store_->Set("b", "2", d).ok());
  d.RunNow();
  ASSERT_TRUE(parked.has_value() && parked->ok());
  EXPECT_EQ(budget_.used(), 4);  // only the two keys and values left
  std::optional<absl::StatusOr<Unit>> expired;
  store_->Wait({"never"}, absl::Seconds(1), Capture(&expired), d);
  Advance(absl::Seconds(2));
  ASSERT_TRUE(expired.has_value());
  EXPECT_EQ(expired->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(budget_.used(), 4);  // given back at the timeout
}

TEST_F(KvStoreTest, ARunsBytesAreBoundedAndARefusedSetChangesNothing) {
  Deferred d;
  ASSERT_TRUE(store_->Set("a", std::string(600, 'x'), d).ok());  // 601 bytes with its key
  absl::Status over = store_->Set("b", std::string(400, 'y'), d);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_NE(over.message().find("1000 bytes per run"), std::string::npos) << over;
  EXPECT_NE(over.message().find("--store-bytes-per-run"), std::string::npos) << over;
  EXPECT_FALSE(*store_->Check({"b"}));
  // Growing an existing value counts only the growth; a refused one keeps the old value.
  EXPECT_EQ(store_->Set("a", std::string(1000, 'z'), d).code(), absl::StatusCode::kResourceExhausted);
  std::optional<absl::StatusOr<std::string>> got;
  store_->Get("a", absl::Seconds(1), Capture(&got), d);
  d.RunNow();
  EXPECT_EQ(got->value(), std::string(600, 'x'));
  // Shrinking and deleting give the bytes back.
  ASSERT_TRUE(store_->Set("a", "small", d).ok());
  ASSERT_TRUE(store_->Set("b", std::string(400, 'y'), d).ok());
  ASSERT_TRUE(*store_->DeleteKey("b"));
  ASSERT_TRUE(store_->Set("c", std::string(900, 'w'), d).ok());
  EXPECT_EQ(budget_.used(), 6 + 901);
}

TEST_F(KvStoreTest, EveryRunTogetherIsBoundedAndAnEndedGenerationGivesItsBytesBack) {
  SharedBudget shared(1500);
  auto first = std::make_shared<KvStore>("run r-1 generation 0", &timers_, StoreLimits{100, 1000, &shared});
  auto second = std::make_shared<KvStore>("run r-2 generation 0", &timers_, StoreLimits{100, 1000, &shared});
  Deferred d;
  ASSERT_TRUE(first->Set("k", std::string(899, 'a'), d).ok());
  absl::Status over = second->Set("k", std::string(899, 'b'), d);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_NE(over.message().find("all runs together"), std::string::npos) << over;
  EXPECT_NE(over.message().find("--store-bytes-total"), std::string::npos) << over;
  first->Abort(absl::AbortedError("generation 0 ended"), d);
  EXPECT_EQ(shared.used(), 0);
  EXPECT_TRUE(second->Set("k", std::string(899, 'b'), d).ok());
  second.reset();  // a store dropped without an abort gives its bytes back too
  EXPECT_EQ(shared.used(), 0);
}

}  // namespace
}  // namespace dt
