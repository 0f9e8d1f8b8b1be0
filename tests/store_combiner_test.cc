// The store combiner across real processes, with a stand-in for the coordinator (the batches each
// carrier sends are answered here): adds pending while a batch is in flight go out together in the
// next, each answer reaches its own process, a second thread goes alone, and a carrier killed in
// the middle of a batch does not stop the node.
#include "client/store_combiner.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/crypto.h"
#include "tests/test_util.h"

namespace dt {
namespace {

std::string FreshRun() { return "r-test-" + RandomHex(6); }

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

std::string ReadAll(int fd) {
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

struct Child {
  pid_t pid;
  int go;   // write a byte: the child adds
  int out;  // "<code> <value> <batches carried>/<adds carried>"
};

// Forks a rank that opens the node's combiner, waits for `go`, adds `delta` and reports.
Child ForkAdder(const std::string& run, int ranks_on_node, int64_t delta) {
  int go[2], out[2];
  EXPECT_EQ(::pipe(go), 0);
  EXPECT_EQ(::pipe(out), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(go[1]);
    ::close(out[0]);
    auto combiner = StoreCombiner::Open(run, 0, "node-a", ranks_on_node);
    if (!combiner.ok()) ::_exit(1);
    char c;
    if (::read(go[0], &c, 1) != 1) ::_exit(2);
    absl::StatusOr<int64_t> v = (*combiner)->Add("k", delta, AnswerEach);
    std::string report = absl::StrCat(static_cast<int>(v.status().code()), " ", v.value_or(-1), " ",
                                      (*combiner)->carried().batches, "/", (*combiner)->carried().adds);
    (void)!::write(out[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(go[0]);
  ::close(out[1]);
  return Child{pid, go[1], out[0]};
}

void Go(const Child& child) {
  EXPECT_EQ(::write(child.go, "g", 1), 1);
  ::close(child.go);
}

// A sender that holds its batch until released: this process is a carrier in flight.
struct HeldSender {
  absl::Notification entered, release;
  int batch_size = 0;
  absl::StatusOr<v1::StoreResponse> operator()(const v1::StoreRequest& request) {
    batch_size = request.batch().ops_size();
    entered.Notify();
    release.WaitForNotification();
    return AnswerEach(request);
  }
};

TEST(StoreCombinerTest, AddsPendingWhileABatchIsInFlightGoOutTogetherAndEachGetsItsOwnAnswer) {
  std::string run = FreshRun();
  Child a = ForkAdder(run, 3, 2), b = ForkAdder(run, 3, 3);
  auto combiner = StoreCombiner::Open(run, 0, "node-a", 3);
  ASSERT_TRUE(combiner.ok()) << combiner.status();
  HeldSender held;
  absl::StatusOr<int64_t> mine;
  std::thread carrier([&] { mine = (*combiner)->Add("k", 1, [&](v1::StoreRequest r) { return held(r); }); });
  ASSERT_TRUE(held.entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(held.batch_size, 1) << "nothing else was pending";
  Go(a);
  Go(b);
  // Both wait behind the batch in flight.
  ASSERT_TRUE(testing::WaitFor([&] { return (*combiner)->pending() == 2; }, absl::Seconds(10)));
  held.release.Notify();
  carrier.join();
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(*mine, 1001);
  std::string from_a = ReadAll(a.out), from_b = ReadAll(b.out);
  ::waitpid(a.pid, nullptr, 0);
  ::waitpid(b.pid, nullptr, 0);
  // One of them carried both adds in one batch; each got its own answer.
  EXPECT_TRUE((from_a == "0 1002 1/2" && from_b == "0 1003 0/0") || (from_a == "0 1002 0/0" && from_b == "0 1003 1/2"))
      << from_a << " | " << from_b;
  EXPECT_EQ((*combiner)->carried().batches, 1);
  EXPECT_EQ((*combiner)->carried().adds, 1);
  EXPECT_EQ((*combiner)->pending(), 0);
}

TEST(StoreCombinerTest, ASecondThreadOfAProcessGoesAloneWhileTheFirstsAddIsInFlight) {
  auto combiner = StoreCombiner::Open(FreshRun(), 0, "node-a", 1);
  ASSERT_TRUE(combiner.ok()) << combiner.status();
  HeldSender held;
  absl::StatusOr<int64_t> first;
  std::thread carrier([&] { first = (*combiner)->Add("k", 1, [&](v1::StoreRequest r) { return held(r); }); });
  ASSERT_TRUE(held.entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  int alone_batch = 0;
  absl::StatusOr<int64_t> second = (*combiner)->Add("k", 4, [&](v1::StoreRequest r) {
    alone_batch = r.batch().ops_size();
    return AnswerEach(r);
  });
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 1004);
  EXPECT_EQ(alone_batch, 1);
  held.release.Notify();
  carrier.join();
  EXPECT_EQ(*first, 1001);
  // A key over the store's limit goes alone too, and the coordinator's refusal of one add is its own.
  absl::StatusOr<int64_t> refused = (*combiner)->Add(std::string(600, 'k'), 1, [](v1::StoreRequest r) {
    v1::StoreResponse out;
    v1::StoreResponse* one = out.add_batch();
    one->set_id(r.batch().ops(0).id());
    one->mutable_status()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    one->mutable_status()->set_message("key too long");
    return absl::StatusOr<v1::StoreResponse>(out);
  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "key too long");
}

TEST(StoreCombinerTest, ACarrierKilledInTheMiddleOfABatchDoesNotStopTheNode) {
  std::string run = FreshRun();
  int carrying[2];
  ASSERT_EQ(::pipe(carrying), 0);
  pid_t dying = ::fork();
  if (dying == 0) {
    ::close(carrying[0]);
    auto combiner = StoreCombiner::Open(run, 0, "node-a", 2);
    if (!combiner.ok()) ::_exit(1);
    (void)(*combiner)->Add("k", 1, [&](v1::StoreRequest) -> absl::StatusOr<v1::StoreResponse> {
      (void)!::write(carrying[1], "c", 1);
      while (true) ::pause();  // in flight until killed
    });
    ::_exit(0);
  }
  ::close(carrying[1]);
  char c;
  ASSERT_EQ(::read(carrying[0], &c, 1), 1) << "the child never carried";
  auto combiner = StoreCombiner::Open(run, 0, "node-a", 2);
  ASSERT_TRUE(combiner.ok()) << combiner.status();
  absl::Notification done;
  absl::StatusOr<int64_t> mine;
  std::thread adder([&] {
    mine = (*combiner)->Add("k", 5, AnswerEach);
    done.Notify();
  });
  // Waiting behind the dead-to-be carrier's batch, then the carrier dies holding the node's lock.
  ASSERT_TRUE(testing::WaitFor([&] { return (*combiner)->pending() == 1; }, absl::Seconds(10)));
  ::kill(dying, SIGKILL);
  ::waitpid(dying, nullptr, 0);
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10))) << "the node's adds stopped with its carrier";
  adder.join();
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(*mine, 1005);
  EXPECT_EQ((*combiner)->carried().adds, 1);
}

}  // namespace
}  // namespace dt
