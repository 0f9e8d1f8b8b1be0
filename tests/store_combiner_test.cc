// The store combiner across real processes, with a stand-in for the coordinator (the batches each
// carrier sends are answered here): adds, sets and gets pending while every lane is in flight go
// out together in the next, each answer reaches its own process, a second thread goes alone, and a
// carrier killed in the middle of a batch neither stops the node nor leaves the operations it held
// unanswered.
#include "client/store_combiner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/crypto.h"
#include "tests/test_util.h"

namespace dt {
namespace {

std::string FreshRun() { return "r-test-" + RandomHex(6); }

// The store's timeout in the tests that do not test it: never reached.
constexpr absl::Duration kTimeout = absl::Seconds(60);

// A coordinator's answer to a batch of adds: each add's value is 1000 + its delta, so every
// process can tell that the answer it got is its own.
absl::StatusOr<v1::StoreResponse> AnswerEach(const v1::StoreRequest& request) {
  v1::StoreResponse out;
  for (const v1::StoreRequest& op : request.batch().ops()) {
    v1::StoreResponse* r = out.add_batch();
    r->set_id(op.id());
    r->set_number(1000 + op.add().delta());
  }
  return out;
}

struct Child {
  pid_t pid;
  int go;        // write a byte: the child adds
  int out;       // "<code> <value> <batches carried>/<adds carried>"
  int carrying;  // held children: a byte once their batch is in flight
  int release;   // held children: write a byte to answer it
};

// Forks a rank that opens the node's combiner, waits for `go`, adds `delta` and reports. A `held`
// one, when it carries, holds its batch in flight until `release`.
Child ForkAdder(const std::string& run, int ranks_on_node, int64_t delta, bool held = false) {
  int go[2], out[2], carrying[2], release[2];
  EXPECT_EQ(::pipe(go), 0);
  EXPECT_EQ(::pipe(out), 0);
  EXPECT_EQ(::pipe(carrying), 0);
  EXPECT_EQ(::pipe(release), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a failed test leaves no child waiting behind it
    for (int fd : {go[1], out[0], carrying[0], release[1]}) ::close(fd);
    auto combiner = StoreCombiner::Open(run, 0, "node-a", ranks_on_node);
    if (!combiner.ok()) ::_exit(1);
    (*combiner)->set_go_alone_after(absl::Minutes(1));  // the tests hold lanes on purpose
    char c;
    if (::read(go[0], &c, 1) != 1) ::_exit(2);
    absl::StatusOr<int64_t> v = (*combiner)->Add(
        "k", delta,
        [&](v1::StoreRequest r) {
          if (held) {
            (void)!::write(carrying[1], "c", 1);
            (void)!::read(release[0], &c, 1);  // until released (or the test ends)
          }
          return AnswerEach(r);
        },
        kTimeout);
    std::string report = absl::StrCat(static_cast<int>(v.status().code()), " ", v.value_or(-1), " ",
                                      (*combiner)->carried().batches, "/", (*combiner)->carried().ops);
    (void)!::write(out[1], report.data(), report.size());
    ::_exit(0);
  }
  for (int fd : {go[0], out[1], carrying[1], release[0]}) ::close(fd);
  return Child{pid, go[1], out[0], carrying[0], release[1]};
}

void Go(const Child& child) {
  EXPECT_EQ(::write(child.go, "g", 1), 1);
  ::close(child.go);
}

// Starts a held child's add and returns once its batch is in flight (it holds a lane).
void GoAndHold(const Child& child) {
  Go(child);
  char c;
  ASSERT_EQ(::read(child.carrying, &c, 1), 1) << "the held child never carried";
}

void Release(const Child& child) { EXPECT_EQ(::write(child.release, "r", 1), 1); }

std::string Finish(const Child& child) {
  std::string out = testing::ReadToEnd(child.out);
  ::waitpid(child.pid, nullptr, 0);
  return out;
}

// A SettleSet's resend that records what it sends again (and answers ABORTED, to tell its answer
// from the batch's).
struct Resent {
  std::vector<std::pair<std::string, std::string>> sets;
  absl::Status operator()(const std::string& key, std::string value) {
    sets.emplace_back(key, std::move(value));
    return absl::AbortedError("resent");
  }
};

// A SettleSet's resend for a set that must have been carried.
StoreCombiner::Resend NoResend() {
  return [](const std::string& key, std::string) {
    ADD_FAILURE() << "the set of " << key << " was sent again";
    return absl::OkStatus();
  };
}

// A sender that holds its batch until released: this process is a carrier in flight.
struct HeldSender {
  absl::Notification entered, release;
  int batch_size = 0;  // the held batch's
  // Later batches of the same carrier (the left sets it looks for after): AnswerEach unless set.
  std::function<absl::StatusOr<v1::StoreResponse>(const v1::StoreRequest&)> then;
  int calls = 0;
  absl::StatusOr<v1::StoreResponse> operator()(const v1::StoreRequest& request) {
    if (calls++ > 0) return then ? then(request) : AnswerEach(request);
    batch_size = request.batch().ops_size();
    entered.Notify();
    release.WaitForNotification();
    return AnswerEach(request);
  }
};

// Opens `n` ranks of one node of a fresh run into `ranks`, each waiting `go_alone_after` for a
// carrier. Call under ASSERT_NO_FATAL_FAILURE.
void OpenNode(int n, std::vector<std::unique_ptr<StoreCombiner>>* ranks,
              absl::Duration go_alone_after = StoreCombiner::kGoAloneAfter) {
  std::string run = FreshRun();
  for (int i = 0; i < n; ++i) {
    auto combiner = StoreCombiner::Open(run, 0, "node-a", n);
    ASSERT_TRUE(combiner.ok()) << combiner.status();
    (*combiner)->set_go_alone_after(go_alone_after);
    ranks->push_back(std::move(*combiner));
  }
}

TEST(StoreCombinerTest, AddsPendingWhileEveryLaneIsInFlightGoOutTogetherAndEachGetsItsOwnAnswer) {
  constexpr int kLanes = StoreCombiner::kLanes, kRanks = kLanes + 3;
  std::string run = FreshRun();
  std::vector<Child> held;
  for (int i = 0; i < kLanes; ++i) held.push_back(ForkAdder(run, kRanks, 10 + i, /*held=*/true));
  Child a = ForkAdder(run, kRanks, 3), b = ForkAdder(run, kRanks, 4);
  auto observer = StoreCombiner::Open(run, 0, "node-a", kRanks);
  ASSERT_TRUE(observer.ok()) << observer.status();
  // A batch in flight on every lane: each held child carried its own add at once.
  for (const Child& c : held) GoAndHold(c);
  Go(a);
  Go(b);
  // a and b wait, together.
  ASSERT_TRUE(testing::WaitFor([&] { return (*observer)->pending() == 2; }, absl::Seconds(10)));
  Release(held[0]);
  std::string from_a = Finish(a), from_b = Finish(b);
  // One of them carried both adds in one batch; each got its own answer.
  EXPECT_TRUE((from_a == "0 1003 1/2" && from_b == "0 1004 0/0") || (from_a == "0 1003 0/0" && from_b == "0 1004 1/2"))
      << from_a << " | " << from_b;
  for (int i = 0; i < kLanes; ++i) {
    if (i > 0) Release(held[i]);
    EXPECT_EQ(Finish(held[i]), absl::StrCat("0 ", 1010 + i, " 1/1"));
  }
  EXPECT_EQ((*observer)->pending(), 0);
}

// A stand-in for the coordinator's store: applies each batch in order (set, get if present, add)
// and records the batches' sizes.
struct StandInStore {
  absl::Mutex mu;
  std::map<std::string, std::string> data ABSL_GUARDED_BY(mu);
  std::vector<int> batches ABSL_GUARDED_BY(mu);
  absl::StatusOr<v1::StoreResponse> operator()(const v1::StoreRequest& request) {
    absl::MutexLock lock(&mu);
    batches.push_back(request.batch().ops_size());
    v1::StoreResponse out;
    for (const v1::StoreRequest& op : request.batch().ops()) {
      v1::StoreResponse* r = out.add_batch();
      r->set_id(op.id());
      if (op.has_set()) data[op.set().key()] = op.set().value();
      if (op.has_add()) r->set_number(1000 + op.add().delta());
      if (op.has_get()) {
        EXPECT_TRUE(op.get().if_present());
        auto it = data.find(op.get().key());
        r->set_flag(it != data.end());
        if (it == data.end()) continue;
        if (static_cast<int64_t>(it->second.size()) > op.get().max_value_bytes()) {
          r->set_number(static_cast<int64_t>(it->second.size()));  // left out, as the coordinator does
        } else {
          r->set_value(it->second);
        }
      }
    }
    return out;
  }
};

// Ranks' sets and gets (each rank a combiner of its own here, in threads) pending while a batch is
// in flight go out in the next one; each gets its own answer; a get whose key is not there, or
// whose value is larger than a slot, comes back not carried (the caller gets it on its own stream).
TEST(StoreCombinerTest, SetsAndGetsPendingWhileABatchIsInFlightGoOutTogetherAndEachGetsItsOwnAnswer) {
  static_assert(StoreCombiner::kLanes == 1, "hold every lane in flight, as the adds' test does");
  constexpr int kRanks = 5;
  std::vector<std::unique_ptr<StoreCombiner>> ranks;
  ASSERT_NO_FATAL_FAILURE(OpenNode(kRanks, &ranks, absl::Minutes(1)));  // the lane is held on purpose
  StandInStore store;
  {
    absl::MutexLock lock(&store.mu);
    store.data["ready"] = "here";
    store.data["big"] = std::string(StoreCombiner::kSlotValueBytes + 1, 'b');
  }
  EXPECT_FALSE(ranks[1]->Gathering());
  HeldSender held;
  held.then = [&](const v1::StoreRequest& r) { return store(r); };
  std::thread carrier([&] {
    EXPECT_TRUE(ranks[0]
                    ->Add(
                        "k", 1, [&](v1::StoreRequest r) { return held(r); }, kTimeout)
                    .ok());
  });
  ASSERT_TRUE(held.entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(ranks[1]->Gathering()) << "a batch is in flight, but nothing waits for the next";
  std::optional<absl::Status> set;
  std::optional<absl::StatusOr<std::string>> ready, absent, big;
  std::vector<std::thread> threads;
  threads.emplace_back([&] { set = ranks[1]->Set("mine", "value", std::ref(store), kTimeout); });
  threads.emplace_back([&] { ready = ranks[2]->GetIfPresent("ready", std::ref(store), kTimeout); });
  threads.emplace_back([&] { absent = ranks[3]->GetIfPresent("absent", std::ref(store), kTimeout); });
  threads.emplace_back([&] { big = ranks[4]->GetIfPresent("big", std::ref(store), kTimeout); });
  ASSERT_TRUE(testing::WaitFor([&] { return ranks[0]->pending() == 4; }, absl::Seconds(10)));
  EXPECT_TRUE(ranks[1]->Gathering());
  held.release.Notify();
  carrier.join();
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(set.has_value());
  EXPECT_TRUE(set->ok()) << *set;
  EXPECT_TRUE(ranks[1]->SetUnsettled());
  EXPECT_TRUE(ranks[1]->SettleSet(std::ref(store), kTimeout, NoResend()).ok());
  ASSERT_TRUE(ready.has_value());
  ASSERT_TRUE(ready->ok()) << ready->status();
  EXPECT_EQ(**ready, "here");
  EXPECT_FALSE(absent.has_value()) << "not there: the caller waits for it on its own stream";
  EXPECT_FALSE(big.has_value()) << "larger than a slot: the caller gets it on its own stream";
  EXPECT_FALSE(ranks[1]->Gathering());
  {
    absl::MutexLock lock(&store.mu);
    EXPECT_EQ(store.data["mine"], "value");
    // In the carrier's look after its batch, for the set left in a slot (a nudged owner otherwise).
    EXPECT_EQ(store.batches, std::vector<int>{4}) << "the four went out in one batch";
  }
  // The slot that answered a present key answers an absent one as absent.
  EXPECT_FALSE(ranks[2]->GetIfPresent("absent", std::ref(store), kTimeout).has_value());
  // A value larger than a slot is not carried at all.
  EXPECT_FALSE(ranks[1]->Set("mine", std::string(StoreCombiner::kSlotValueBytes + 1, 'v'), std::ref(store), kTimeout));
  absl::MutexLock lock(&store.mu);
  EXPECT_EQ(store.batches.size(), 2u);
}

// When the carrier cannot deliver a batch (its stream broke), a set or get comes back not carried,
// so its rank sends it again on its own stream (both are safe to repeat); an add, which is not,
// reports the failure.
TEST(StoreCombinerTest, ASetOrGetItsCarrierCouldNotDeliverGoesAgainAndAnAddFails) {
  auto combiner = StoreCombiner::Open(FreshRun(), 0, "node-a", 1);
  ASSERT_TRUE(combiner.ok()) << combiner.status();
  auto broken = [](const v1::StoreRequest&) -> absl::StatusOr<v1::StoreResponse> {
    return absl::UnavailableError("the carrier's store stream broke");
  };
  // A set is left in the slot (here carried at once: no lane is in flight); its rank reads the
  // answer with its next call and sends it again itself.
  std::optional<absl::Status> left = (*combiner)->Set("k", "v", broken, kTimeout);
  ASSERT_TRUE(left.has_value());
  EXPECT_TRUE(left->ok()) << *left;
  Resent resent;
  EXPECT_EQ((*combiner)->SettleSet(broken, kTimeout, std::ref(resent)).code(), absl::StatusCode::kAborted)
      << "the resend's own answer";
  EXPECT_EQ(resent.sets, (std::vector<std::pair<std::string, std::string>>{{"k", "v"}}));
  EXPECT_FALSE((*combiner)->GetIfPresent("k", broken, kTimeout).has_value());
  absl::StatusOr<int64_t> added = (*combiner)->Add("k", 1, broken, kTimeout);
  EXPECT_EQ(added.status().code(), absl::StatusCode::kUnavailable) << added.status();
  // The store's own refusal of a set is the answer its rank's next call reads.
  auto refusing = [](const v1::StoreRequest& r) -> absl::StatusOr<v1::StoreResponse> {
    v1::StoreResponse out;
    v1::StoreResponse* one = out.add_batch();
    one->set_id(r.batch().ops(0).id());
    one->mutable_status()->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
    one->mutable_status()->set_message("the run's store is full");
    return out;
  };
  left = (*combiner)->Set("k", "v", refusing, kTimeout);
  ASSERT_TRUE(left.has_value());
  EXPECT_TRUE(left->ok()) << *left;
  absl::Status refused = (*combiner)->SettleSet(refusing, kTimeout, std::ref(resent));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(), "the run's store is full");
  EXPECT_EQ(resent.sets.size(), 1u) << "a refused set is not sent again";
  EXPECT_FALSE((*combiner)->SetUnsettled());
}

// A set left while the node's batch is in flight returns at once, before anything carried it. The
// carrier in flight takes it after its batch, though its rank makes no further call, and that
// rank's next call reads its answer.
TEST(StoreCombinerTest, ASetLeftWhileABatchIsInFlightIsCarriedWithoutItsRank) {
  std::vector<std::unique_ptr<StoreCombiner>> ranks;
  ASSERT_NO_FATAL_FAILURE(OpenNode(2, &ranks, absl::Minutes(1)));  // the lane is held on purpose
  StandInStore store;
  absl::Notification entered, release;
  int sent = 0;
  auto hold_first = [&](const v1::StoreRequest& r) {
    if (sent++ == 0) {
      entered.Notify();
      release.WaitForNotification();
    }
    return store(r);
  };
  std::thread carrier([&] { EXPECT_TRUE(ranks[0]->Add("k", 1, hold_first, kTimeout).ok()); });
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::optional<absl::Status> left = ranks[1]->Set("mine", "value", std::ref(store), kTimeout);
  ASSERT_TRUE(left.has_value()) << "it went alone";
  EXPECT_TRUE(left->ok()) << *left;
  EXPECT_TRUE(ranks[1]->SetUnsettled());
  EXPECT_EQ(ranks[0]->pending(), 1) << "returned before any carrier took it";
  {
    absl::MutexLock lock(&store.mu);
    EXPECT_EQ(store.data.count("mine"), 0u);
  }
  release.Notify();
  carrier.join();
  {
    absl::MutexLock lock(&store.mu);
    EXPECT_EQ(store.data["mine"], "value") << "the carrier in flight did not take the set left meanwhile";
    EXPECT_EQ(store.batches, (std::vector<int>{1, 1})) << "its own add, then the left set";
  }
  EXPECT_EQ(ranks[0]->carried().batches, 2);
  EXPECT_EQ(ranks[1]->carried().batches, 0);
  EXPECT_TRUE(ranks[1]->SettleSet(std::ref(store), kTimeout, NoResend()).ok());
  EXPECT_FALSE(ranks[1]->SetUnsettled());
  // The slot is the rank's again.
  std::optional<absl::StatusOr<std::string>> got = ranks[1]->GetIfPresent("mine", std::ref(store), kTimeout);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status();
  EXPECT_EQ(**got, "value");
}

// Ranks leaving sets while others carry, nudge and read: every set arrives, the last of each rank
// too, though no rank makes a call after it (a lost one would leave a peer's wait hanging).
TEST(StoreCombinerTest, EverySetLeftIsCarriedThoughItsRankMakesNoFurtherCall) {
  constexpr int kRanks = 8, kSets = 150;
  std::vector<std::unique_ptr<StoreCombiner>> ranks;
  ASSERT_NO_FATAL_FAILURE(OpenNode(kRanks, &ranks));
  StandInStore store;
  // Batches take a while, as a loaded coordinator's do: they overlap the ranks' calls.
  auto slow = [&](const v1::StoreRequest& r) {
    absl::SleepFor(absl::Microseconds(200));
    return store(r);
  };
  auto own_stream = [&](const std::string& key, std::string value) {
    absl::MutexLock lock(&store.mu);
    store.data[key] = std::move(value);
    return absl::OkStatus();
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kRanks; ++i) {
    threads.emplace_back([&, i] {
      StoreCombiner& rank = *ranks[i];
      for (int j = 0; j < kSets; ++j) {
        EXPECT_TRUE(rank.SettleSet(slow, kTimeout, own_stream).ok());
        std::string key = absl::StrCat("r", i, "-", j);
        std::optional<absl::Status> left = rank.Set(key, "v", slow, kTimeout);
        if (!left.has_value()) {
          EXPECT_TRUE(own_stream(key, "v").ok());
        } else {
          EXPECT_TRUE(left->ok()) << *left;
        }
        if (j % 3 != 0 || j == kSets - 1) continue;
        // A read waits through the slot: it settles the set first, and reads it back.
        EXPECT_TRUE(rank.SettleSet(slow, kTimeout, own_stream).ok());
        std::optional<absl::StatusOr<std::string>> got = rank.GetIfPresent(key, slow, kTimeout);
        if (got.has_value()) {
          EXPECT_EQ(got->value_or("error"), "v") << key;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  auto missing = [&] {
    absl::MutexLock lock(&store.mu);
    std::vector<std::string> out;
    for (int i = 0; i < kRanks; ++i) {
      for (int j = 0; j < kSets; ++j) {
        if (store.data.count(absl::StrCat("r", i, "-", j)) == 0) out.push_back(absl::StrCat("r", i, "-", j));
      }
    }
    return out;
  };
  // The last sets may still be in a carrier's batch in flight: it answers within milliseconds.
  EXPECT_TRUE(testing::WaitFor([&] { return missing().empty(); }, absl::Seconds(10)))
      << "never carried: " << absl::StrJoin(missing(), ", ");
}

TEST(StoreCombinerTest, ASecondThreadOfAProcessGoesAloneWhileTheFirstsAddIsInFlight) {
  auto combiner = StoreCombiner::Open(FreshRun(), 0, "node-a", 1);
  ASSERT_TRUE(combiner.ok()) << combiner.status();
  HeldSender held;
  absl::StatusOr<int64_t> first;
  std::thread carrier([&] {
    first = (*combiner)->Add(
        "k", 1, [&](v1::StoreRequest r) { return held(r); }, kTimeout);
  });
  ASSERT_TRUE(held.entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  int alone_batch = 0;
  absl::StatusOr<int64_t> second = (*combiner)->Add(
      "k", 4,
      [&](v1::StoreRequest r) {
        alone_batch = r.batch().ops_size();
        return AnswerEach(r);
      },
      kTimeout);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 1004);
  EXPECT_EQ(alone_batch, 1);
  held.release.Notify();
  carrier.join();
  EXPECT_EQ(*first, 1001);
  // A key over the store's limit goes alone too, and the coordinator's refusal of one add is its own.
  absl::StatusOr<int64_t> refused = (*combiner)->Add(
      std::string(600, 'k'), 1,
      [](v1::StoreRequest r) {
        v1::StoreResponse out;
        v1::StoreResponse* one = out.add_batch();
        one->set_id(r.batch().ops(0).id());
        one->mutable_status()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
        one->mutable_status()->set_message("key too long");
        return absl::StatusOr<v1::StoreResponse>(out);
      },
      kTimeout);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "key too long");
}

TEST(StoreCombinerTest, ACarrierKilledInTheMiddleOfABatchDoesNotStopTheNode) {
  constexpr int kLanes = StoreCombiner::kLanes;
  std::string run = FreshRun();
  // The first dies; the others (with more than one lane) keep theirs busy.
  std::vector<Child> held;
  for (int i = 0; i < kLanes; ++i) held.push_back(ForkAdder(run, kLanes + 1, 10 + i, /*held=*/true));
  auto combiner = StoreCombiner::Open(run, 0, "node-a", kLanes + 1);
  ASSERT_TRUE(combiner.ok()) << combiner.status();
  (*combiner)->set_go_alone_after(absl::Minutes(1));  // the lanes are held on purpose
  for (const Child& c : held) GoAndHold(c);
  absl::Notification done;
  absl::StatusOr<int64_t> mine;
  std::thread adder([&] {
    mine = (*combiner)->Add("k", 5, AnswerEach, kTimeout);
    done.Notify();
  });
  // Waiting behind every lane, then a carrier dies holding its lane's lock.
  ASSERT_TRUE(testing::WaitFor([&] { return (*combiner)->pending() == 1; }, absl::Seconds(10)));
  ::kill(held[0].pid, SIGKILL);
  ::waitpid(held[0].pid, nullptr, 0);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10))) << "the node's adds stopped with its carrier";
  adder.join();
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(*mine, 1005);
  EXPECT_EQ((*combiner)->carried().ops, 1);
  for (int i = 1; i < kLanes; ++i) {
    Release(held[i]);
    EXPECT_EQ(Finish(held[i]), absl::StrCat("0 ", 1010 + i, " 1/1"));
  }
}

// Adds that a dead carrier had taken into its batch are answered (UNAVAILABLE: they may or may not
// have been applied) by their own ranks, which find its lane free on their next look.
TEST(StoreCombinerTest, TheAddsADeadCarrierHeldAreAnsweredUnavailable) {
  constexpr int kLanes = StoreCombiner::kLanes, kRanks = kLanes + 3;
  std::string run = FreshRun();
  std::vector<Child> held;
  for (int i = 0; i < kLanes; ++i) held.push_back(ForkAdder(run, kRanks, 10 + i, /*held=*/true));
  Child survivor = ForkAdder(run, kRanks, 7), dying = ForkAdder(run, kRanks, 8, /*held=*/true);
  auto observer = StoreCombiner::Open(run, 0, "node-a", kRanks);
  ASSERT_TRUE(observer.ok()) << observer.status();
  for (const Child& c : held) GoAndHold(c);
  Go(survivor);
  ASSERT_TRUE(testing::WaitFor([&] { return (*observer)->pending() == 1; }, absl::Seconds(10)));
  // Stopped, the survivor cannot carry: the dying child does, with the survivor's add.
  ::kill(survivor.pid, SIGSTOP);
  Go(dying);
  ASSERT_TRUE(testing::WaitFor([&] { return (*observer)->pending() == 2; }, absl::Seconds(10)));
  Release(held[0]);
  char c;
  ASSERT_EQ(::read(dying.carrying, &c, 1), 1) << "the dying child never carried";
  EXPECT_EQ((*observer)->pending(), 0) << "its batch holds the survivor's add";
  ::kill(dying.pid, SIGKILL);
  ::waitpid(dying.pid, nullptr, 0);
  ::kill(survivor.pid, SIGCONT);
  int status = 0;
  ASSERT_TRUE(
      testing::WaitFor([&] { return ::waitpid(survivor.pid, &status, WNOHANG) == survivor.pid; }, absl::Seconds(10)))
      << "the add a dead carrier held was never answered";
  std::string report = testing::ReadToEnd(survivor.out);
  EXPECT_EQ(report.substr(0, 6), absl::StrCat(static_cast<int>(absl::StatusCode::kUnavailable), " -1 ")) << report;
  EXPECT_EQ(Finish(held[0]), "0 1010 1/1");
  for (int i = 1; i < kLanes; ++i) {
    Release(held[i]);
    EXPECT_EQ(Finish(held[i]), absl::StrCat("0 ", 1010 + i, " 1/1"));
  }
}

// A sender that records the size of each batch it sends and answers it.
struct RecordingSender {
  std::vector<int> batches;
  absl::StatusOr<v1::StoreResponse> operator()(const v1::StoreRequest& request) {
    batches.push_back(request.batch().ops_size());
    return AnswerEach(request);
  }
};

// Two ranks of a node; `stuck` carries its own add and its sender holds it (the lane stays held)
// until `held.release` is notified, at the latest when this is destroyed.
struct HeldLane {
  std::unique_ptr<StoreCombiner> stuck, rank;
  HeldSender held;
  std::thread carrier;

  // ASSERTs inside: check HasFatalFailure() after it.
  void Start() {
    std::vector<std::unique_ptr<StoreCombiner>> node;
    ASSERT_NO_FATAL_FAILURE(OpenNode(2, &node));
    stuck = std::move(node[0]);
    rank = std::move(node[1]);
    carrier = std::thread([this] { EXPECT_TRUE(stuck->Add("k", 1, std::ref(held), kTimeout).ok()); });
    ASSERT_TRUE(held.entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  void Release() {
    if (!held.release.HasBeenNotified()) held.release.Notify();
    if (carrier.joinable()) carrier.join();
  }
  ~HeldLane() { Release(); }
};

// A carrier that stops holding the node's lane (a stopped process, a debugger) does not stop the
// node's operations that it has not taken: after StoreCombiner::kGoAloneAfter, or their timeout if
// shorter, each goes alone on its own rank's stream.
TEST(StoreCombinerTest, AnOperationNoCarrierTookInTimeGoesAlone) {
  HeldLane node;
  node.Start();
  if (HasFatalFailure()) return;
  StoreCombiner* rank = node.rank.get();
  RecordingSender own;
  constexpr absl::Duration kShort = absl::Milliseconds(200);
  absl::Time start = absl::Now();
  absl::StatusOr<int64_t> added = rank->Add("k", 3, std::ref(own), kShort);
  EXPECT_GE(absl::Now() - start, kShort) << "it went alone before its time";
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 1003);
  // A set is left for the stuck lane's carrier, which never takes it: the rank's next call sends it
  // itself once it waited as long.
  std::optional<absl::Status> left = rank->Set("s", "v", std::ref(own), kShort);
  ASSERT_TRUE(left.has_value());
  EXPECT_TRUE(left->ok()) << *left;
  Resent resent;
  start = absl::Now();
  EXPECT_EQ(rank->SettleSet(std::ref(own), kShort, std::ref(resent)).code(), absl::StatusCode::kAborted)
      << "the resend's own answer";
  EXPECT_GE(absl::Now() - start, kShort) << "it went alone before its time";
  EXPECT_EQ(resent.sets, (std::vector<std::pair<std::string, std::string>>{{"s", "v"}}));
  EXPECT_FALSE(rank->GetIfPresent("s", std::ref(own), kShort).has_value()) << "the caller gets it itself";
  EXPECT_FALSE(rank->Exists("s", std::ref(own), kShort).has_value()) << "the caller asks itself";
  EXPECT_EQ(own.batches, std::vector<int>{1}) << "the add alone; the others go on the rank's own stream";
  EXPECT_EQ(rank->pending(), 0) << "nothing left behind in the slot";
  EXPECT_EQ(rank->carried().batches, 0);
  node.Release();
  EXPECT_EQ(node.held.batch_size, 1) << "the stuck carrier's batch held only its own add";
}

// Once the node's lane has been held for go_alone_after, every later operation goes alone at once:
// a stopped carrier costs the node one wait, not one per operation.
TEST(StoreCombinerTest, OnceTheLaneIsHeldPastGoAloneAfterLaterOperationsGoAloneAtOnce) {
  HeldLane node;
  node.Start();
  if (HasFatalFailure()) return;
  StoreCombiner* rank = node.rank.get();
  constexpr absl::Duration kGoAloneAfter = absl::Seconds(1);
  rank->set_go_alone_after(kGoAloneAfter);
  RecordingSender own;
  absl::Time start = absl::Now();
  ASSERT_TRUE(rank->Add("k", 3, std::ref(own), kTimeout).ok());
  EXPECT_GE(absl::Now() - start, kGoAloneAfter) << "the first waits for the lane";
  // Each of these would wait kGoAloneAfter again without the lane's mark.
  start = absl::Now();
  ASSERT_TRUE(rank->Add("k", 5, std::ref(own), kTimeout).ok());
  EXPECT_FALSE(rank->Set("s", "v", std::ref(own), kTimeout).has_value());
  EXPECT_FALSE(rank->GetIfPresent("s", std::ref(own), kTimeout).has_value());
  EXPECT_LT(absl::Now() - start, kGoAloneAfter) << "later operations waited for the stuck lane again";
  EXPECT_EQ(own.batches, (std::vector<int>{1, 1})) << "both adds alone";
  // The carrier comes back: the lane's mark is cleared, and the rank's operations combine again.
  node.Release();
  absl::StatusOr<int64_t> again = rank->Add("k", 7, std::ref(own), kTimeout);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(rank->carried().batches, 1) << "through its slot, carried by itself";
}

// A carrier whose send throws (out of memory) answers every operation of its batch, another
// rank's too, with the failure, and lets the lane go: the node combines again.
TEST(StoreCombinerTest, ACarrierWhoseSendThrowsAnswersItsBatchAndLetsTheLaneGo) {
  std::vector<std::unique_ptr<StoreCombiner>> ranks;
  ASSERT_NO_FATAL_FAILURE(OpenNode(3, &ranks));
  HeldSender first;
  auto throwing = [](const v1::StoreRequest&) -> absl::StatusOr<v1::StoreResponse> { throw std::bad_alloc(); };
  absl::StatusOr<int64_t> added[2];
  std::vector<std::thread> threads;
  absl::Cleanup join = [&] {
    if (!first.release.HasBeenNotified()) first.release.Notify();
    for (std::thread& t : threads) t.join();
  };
  threads.emplace_back([&] { EXPECT_TRUE(ranks[0]->Add("k", 1, std::ref(first), kTimeout).ok()); });
  ASSERT_TRUE(first.entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Both wait behind rank 0's batch; whichever carries next takes both, and its send throws.
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] { added[i] = ranks[1 + i]->Add("k", 2 + i, throwing, kTimeout); });
  ASSERT_TRUE(testing::WaitFor([&] { return ranks[0]->pending() == 2; }, absl::Seconds(10)));
  first.release.Notify();
  std::move(join).Invoke();
  for (const absl::StatusOr<int64_t>& a : added) {
    EXPECT_EQ(a.status().code(), absl::StatusCode::kUnknown) << a.status();
    EXPECT_THAT(a.status().message(), ::testing::HasSubstr("may or may not have been applied"));
  }
  RecordingSender own;
  absl::StatusOr<int64_t> again = ranks[1]->Add("k", 7, std::ref(own), kTimeout);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(own.batches, std::vector<int>{1}) << "the lane is free: the rank carried its add itself";
  EXPECT_EQ(ranks[1]->pending(), 0);
}

// Ranks 1 and 2 of three wait behind rank 0's batch; whichever carries the next batch takes the
// other's operation with its own and stops there (its sender holds it). Returns which one.
struct StuckCarrier {
  std::vector<std::unique_ptr<StoreCombiner>> ranks;
  HeldSender first, held[2];
  std::vector<std::thread> threads;
  int carrier = -1, victim = -1;
  std::function<void(int, const StoreCombiner::SendBatch&)> op;  // outlives the threads running it

  ~StuckCarrier() {
    for (HeldSender* h : {&first, &held[0], &held[1]}) {
      if (!h->release.HasBeenNotified()) h->release.Notify();
    }
    for (std::thread& t : threads) {
      if (t.joinable()) t.join();
    }
  }

  // `op(rank, send)` runs on ranks 1 and 2, each in a thread of its own.
  void Start(std::function<void(int, const StoreCombiner::SendBatch&)> run_op) {
    op = std::move(run_op);
    // Held lanes are on purpose here: only the store's timeout is under test.
    ASSERT_NO_FATAL_FAILURE(OpenNode(3, &ranks, absl::Minutes(1)));
    threads.emplace_back([&] { EXPECT_TRUE(ranks[0]->Add("k", 1, std::ref(first), kTimeout).ok()); });
    ASSERT_TRUE(first.entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
    for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { op(1 + i, std::ref(held[i])); });
    ASSERT_TRUE(testing::WaitFor([&] { return ranks[0]->pending() == 2; }, absl::Seconds(10)));
    first.release.Notify();
    ASSERT_TRUE(testing::WaitFor([&] { return held[0].entered.HasBeenNotified() || held[1].entered.HasBeenNotified(); },
                                 absl::Seconds(10)));
    carrier = held[0].entered.HasBeenNotified() ? 0 : 1;
    victim = 1 - carrier;
    EXPECT_EQ(held[carrier].batch_size, 2) << "the carrier's batch holds both operations";
  }
  void Join(int i) { threads[1 + i].join(); }
};

// A write that a carrier took and did not deliver within the store's timeout fails with
// DEADLINE_EXCEEDED (it may or may not have been applied), naming the carrier. Until the late
// answer comes, the rank's writes fail (they could land before it) and its reads go alone; after
// it, the slot is the rank's again.
TEST(StoreCombinerTest, AWriteItsCarrierHoldsPastTheTimeoutFailsAndHoldsBackTheRanksWrites) {
  constexpr absl::Duration kStoreTimeout = absl::Seconds(3);
  absl::StatusOr<int64_t> added[2];  // before `node`: its threads write here until it is gone
  StuckCarrier node;
  node.Start([&](int rank, const StoreCombiner::SendBatch& send) {
    added[rank - 1] = node.ranks[rank]->Add("k", 9 + rank, send, kStoreTimeout);
  });
  if (HasFatalFailure()) return;
  int carrier = node.carrier, victim = node.victim;
  node.Join(victim);
  EXPECT_EQ(added[victim].status().code(), absl::StatusCode::kDeadlineExceeded) << added[victim].status();
  EXPECT_THAT(added[victim].status().message(), ::testing::HasSubstr(absl::StrCat("(pid ", ::getpid(), ")")));
  EXPECT_THAT(added[victim].status().message(), ::testing::HasSubstr("may or may not have been applied"));
  StoreCombiner& late = *node.ranks[1 + victim];
  RecordingSender own;
  absl::StatusOr<int64_t> held_back = late.Add("k", 20, std::ref(own), kTimeout);
  EXPECT_EQ(held_back.status().code(), absl::StatusCode::kFailedPrecondition) << held_back.status();
  EXPECT_THAT(held_back.status().message(), ::testing::HasSubstr(absl::StrCat("(pid ", ::getpid(), ")")));
  EXPECT_EQ(late.WritesAllowed().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(late.GetIfPresent("k", std::ref(own), kTimeout).has_value()) << "a read goes alone";
  EXPECT_TRUE(own.batches.empty());
  // The carrier delivers at last; the late answer is nobody's, and the slot combines again.
  node.held[carrier].release.Notify();
  node.Join(carrier);
  ASSERT_TRUE(added[carrier].ok()) << added[carrier].status();
  EXPECT_EQ(*added[carrier], 1010 + carrier);
  EXPECT_TRUE(late.WritesAllowed().ok());
  absl::StatusOr<int64_t> again = late.Add("k", 30, std::ref(own), kTimeout);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 1030);
  EXPECT_EQ(late.carried().batches, 1) << "through its slot, carried by itself";
}

// A read that a carrier took and did not deliver in time comes back not carried (its rank reads
// on its own stream), and holds back nothing.
TEST(StoreCombinerTest, AReadItsCarrierHoldsPastTheTimeoutGoesAlone) {
  std::optional<absl::StatusOr<std::string>> got[2];  // before `node`: its threads write here until it is gone
  StuckCarrier node;
  node.Start([&](int rank, const StoreCombiner::SendBatch& send) {
    got[rank - 1] = node.ranks[rank]->GetIfPresent("k", send, absl::Seconds(3));
  });
  if (HasFatalFailure()) return;
  node.Join(node.victim);
  EXPECT_FALSE(got[node.victim].has_value());
  EXPECT_TRUE(node.ranks[1 + node.victim]->WritesAllowed().ok());
}

}  // namespace
}  // namespace dt
