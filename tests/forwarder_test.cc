// The W&B forwarder's protocol logic on a fake clock with a scripted HTTP peer: the order of
// requests, batching, retries of the identical body with exponential backoff (and Retry-After),
// a refused batch counted and skipped, the resume of an existing W&B run, and the final post.
#include "coordinator/wandb/forwarder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/crypto.h"
#include "coordinator/clock.h"
#include "tests/test_util.h"

namespace dt::wandb {
namespace {

using ::testing::HasSubstr;

HttpResult Reply(int code, std::string body = "", std::string error = "",
                 absl::Duration retry_after = absl::ZeroDuration()) {
  HttpResult r;
  r.code = code;
  r.body = std::move(body);
  r.error = std::move(error);
  r.retry_after = retry_after;
  return r;
}

struct Posted {
  std::string url;
  nlohmann::json body;
  std::string raw;
  absl::Time at;
};

// Every W&B request of every W&B run. file_stream posts are answered from a script (200 when it
// is empty); the GraphQL calls as W&B answers them for a new run, or for an existing one.
class ScriptedWandb {
 public:
  explicit ScriptedWandb(const Clock* clock) : clock_(clock) {}

  HttpPosterFactory Factory() {
    return [this](const std::string&, absl::Duration) { return std::make_unique<Poster>(this); };
  }
  // The answer to the next file_stream post not yet answered.
  void Answer(HttpResult r) {
    absl::MutexLock lock(&mu_);
    script_.push_back(std::move(r));
  }
  // The W&B run already exists, with `lines` history lines, the last at `step`.
  void ExistingRun(int64_t lines, int64_t step, double runtime) {
    nlohmann::json last = {{"_step", step}, {"_runtime", runtime}};
    nlohmann::json tail = nlohmann::json::array({last.dump()});
    nlohmann::json bucket = {{"historyLineCount", lines}, {"historyTail", tail.dump()}};
    absl::MutexLock lock(&mu_);
    resume_ = nlohmann::json({{"data", {{"model", {{"bucket", bucket}}}}}}).dump();
  }
  std::vector<Posted> posts() {
    absl::MutexLock lock(&mu_);
    return posts_;
  }
  // Runs `f` with the body of the next file_stream post while that post is in flight (before it
  // is answered), once.
  void DuringNextStreamPost(std::function<void(const std::string& body)> f) {
    absl::MutexLock lock(&mu_);
    during_stream_post_ = std::move(f);
  }

 private:
  class Poster : public HttpPoster {
   public:
    explicit Poster(ScriptedWandb* w) : w_(w) {}
    HttpResult PostJson(const std::string& url, const std::string& body) override { return w_->Post(url, body); }

   private:
    ScriptedWandb* w_;
  };

  HttpResult Post(const std::string& url, const std::string& body) {
    std::function<void(const std::string&)> during;
    {
      absl::MutexLock lock(&mu_);
      if (!absl::EndsWith(url, "/graphql")) during = std::exchange(during_stream_post_, nullptr);
    }
    if (during) during(body);
    absl::MutexLock lock(&mu_);
    posts_.push_back({url, nlohmann::json::parse(body, nullptr, false), body, clock_->Now()});
    if (absl::EndsWith(url, "/graphql") && absl::StrContains(body, "upsertBucket")) {
      nlohmann::json project = {{"name", "proj"}, {"entity", {{"name", "team"}}}};
      return Reply(200, nlohmann::json({{"data", {{"upsertBucket", {{"bucket", {{"project", project}}}}}}}}).dump());
    }
    if (absl::EndsWith(url, "/graphql")) return Reply(200, resume_);
    if (!script_.empty()) {
      HttpResult r = script_.front();
      script_.pop_front();
      return r;
    }
    return Reply(200, "{}");
  }

  const Clock* clock_;
  absl::Mutex mu_;
  std::deque<HttpResult> script_;
  std::string resume_ = R"({"data":{"model":null}})";
  std::vector<Posted> posts_;
  std::function<void(const std::string&)> during_stream_post_;
};

class ForwarderTest : public ::testing::Test {
 protected:
  ForwarderTest() {
    ForwarderOptions o;
    o.spool_dir = tmp_.Sub("spool");
    o.env = {{"WANDB_API_KEY", "k"}, {"WANDB_BASE_URL", "http://wandb.test"}};
    o.clock = &clock_;
    o.http = wandb_.Factory();
    o.post_interval = absl::Seconds(2);
    o.retry_base = absl::Seconds(2);
    o.retry_cap = absl::Seconds(60);
    o.before_spool_open = [this](const std::string& dir) { stall_.Pass(dir); };
    options_ = o;
    forwarder_ = std::make_unique<Forwarder>(o, /*coordinator=*/nullptr, /*stats=*/nullptr);
    run_.set_run_id("r-0000000000000001");
    run_.set_state(v1::RUNNING);
    run_.mutable_spec()->set_experiment_name("exp");
    run_.mutable_spec()->set_save_dir("/save");
    run_.mutable_spec()->mutable_wandb()->set_project("proj");
  }

  // A new forwarder (on a fresh spool directory) with `change` made to the options.
  void Rebuild(const std::function<void(ForwarderOptions&)>& change) {
    forwarder_.reset();
    change(options_);
    options_.spool_dir = tmp_.Sub("spool-rebuilt");
    forwarder_ = std::make_unique<Forwarder>(options_, /*coordinator=*/nullptr, /*stats=*/nullptr);
  }

  double UnixNow() const { return absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch()); }

  void Log(int64_t first, int64_t last, double age_s = 10) { LogTo(run_, first, last, age_s); }
  void LogTo(const v1::Run& run, int64_t first, int64_t last, double age_s = 10) {
    v1::MetricBatch batch;
    batch.set_rank(0);
    for (int64_t step = first; step <= last; ++step) {
      v1::MetricPoint* p = batch.add_points();
      p->set_step(step);
      p->set_time(UnixNow() - age_s);
      (*p->mutable_values())["loss"] = 10.0 - step;
    }
    Deliver(run, batch);
  }
  // One delivery pass of one batch, as the coordinator's metric pipeline makes it.
  void Deliver(const v1::Run& run, const v1::MetricBatch& batch) {
    forwarder_->OnMetrics(run, batch);
    forwarder_->OnMetricPassEnd();
  }

  // From posts[first] on: the run resumed (check, upsert), steps 4 and 5 streamed after its three
  // lines, then the final post.
  void ExpectResumedThenStreamedStepsFourAndFiveThenFinished(const std::vector<Posted>& posts, size_t first) {
    EXPECT_THAT(posts[first].raw, HasSubstr("RunResumeStatus"));
    EXPECT_THAT(posts[first + 1].raw, HasSubstr("upsertBucket"));
    std::vector<Posted> streams = Streams();
    ASSERT_GE(streams.size(), 2u);
    const Posted& rows = streams[streams.size() - 2];
    EXPECT_EQ(rows.body["files"]["wandb-history.jsonl"]["offset"], 3);
    EXPECT_EQ(rows.body["files"]["wandb-history.jsonl"]["content"].size(), 2u);  // steps 4 and 5
    EXPECT_EQ(streams.back().body["complete"], true);
  }

  // Serves whatever is due, as the workers would, advancing the clock to the next due moment up
  // to `horizon`.
  void RunFor(absl::Duration horizon) {
    absl::Time end = clock_.Now() + horizon;
    while (clock_.Now() < end) {
      while (forwarder_->ServeDue()) {
      }
      clock_.Advance(absl::Milliseconds(100));
    }
  }

  std::vector<Posted> Streams() {
    std::vector<Posted> out;
    for (auto& p : wandb_.posts()) {
      if (absl::EndsWith(p.url, "/file_stream")) out.push_back(p);
    }
    return out;
  }

  testing::TempDir tmp_;
  testing::Stall stall_;  // spools whose directory contains the armed part
  FakeClock clock_;
  ScriptedWandb wandb_{&clock_};
  v1::Run run_;
  ForwarderOptions options_;
  std::unique_ptr<Forwarder> forwarder_;
};

TEST_F(ForwarderTest, ChecksThenCreatesTheRunThenStreamsEveryStepOnceInOrder) {
  Log(1, 5);
  RunFor(absl::Seconds(1));
  std::vector<Posted> posts = wandb_.posts();
  ASSERT_GE(posts.size(), 3u);
  EXPECT_THAT(posts[0].raw, HasSubstr("RunResumeStatus"));
  EXPECT_THAT(posts[1].raw, HasSubstr("upsertBucket"));
  EXPECT_EQ(posts[2].url, "http://wandb.test/files/team/proj/" + Sha1Hex("/save/exp") + "/file_stream");
  const nlohmann::json& history = posts[2].body["files"]["wandb-history.jsonl"];
  EXPECT_EQ(history["offset"], 0);
  ASSERT_EQ(history["content"].size(), 5u);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(nlohmann::json::parse(history["content"][k].get<std::string>())["_step"], k + 1);
  }
  // The next batch continues at the next line offset, no earlier than the post interval.
  Log(6, 7);
  RunFor(absl::Seconds(3));
  std::vector<Posted> streams = Streams();
  ASSERT_EQ(streams.size(), 2u);
  EXPECT_EQ(streams[1].body["files"]["wandb-history.jsonl"]["offset"], 5);
  EXPECT_GE(streams[1].at - streams[0].at, absl::Seconds(2));
  EXPECT_EQ(forwarder_->QueueDepth(), 0);
}

// W&B away: one W&B run's spool holds at most max_spool_bytes of points W&B has not accepted.
// Newer points skip W&B until it catches up (the run's own history keeps them); then spooling
// goes on, and W&B's history has every point spooled, in order.
TEST_F(ForwarderTest, ASpoolHoldsAtMostItsBytesWhileWandbIsAway) {
  Rebuild([](ForwarderOptions& o) { o.max_spool_bytes = 300; });
  Log(1, 20);   // under the limit when it came: spooled whole (about 600 bytes)
  Log(21, 25);  // past it: not spooled
  std::vector<WandbRunInfo> info = forwarder_->RunsOf(run_.run_id());
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].spooled, 20);
  RunFor(absl::Seconds(3));  // W&B answers and takes what waited
  Log(26, 27);
  RunFor(absl::Seconds(3));
  std::vector<int64_t> steps;
  for (const Posted& p : Streams()) {
    for (const auto& line : p.body["files"]["wandb-history.jsonl"]["content"]) {
      steps.push_back(nlohmann::json::parse(line.get<std::string>())["_step"].get<int64_t>());
    }
  }
  std::vector<int64_t> expected;
  for (int64_t step = 1; step <= 20; ++step) expected.push_back(step);
  expected.push_back(26);
  expected.push_back(27);
  EXPECT_EQ(steps, expected);
}

// A W&B run's first batch opens its spool (mkdir, fsync, reading what an earlier coordinator
// spooled) outside the forwarder's lock: while one spool's disk stalls, another run's batches and
// the console's W&B queries go through, and the stalled run's points arrive once it answers.
TEST_F(ForwarderTest, AStalledSpoolDelaysNoOtherRun) {
  stall_.Arm(Sha1Hex("/save/exp"));  // the spool directory is named by the W&B run id
  std::thread stalled([&] { Log(1, 3); });
  ASSERT_TRUE(testing::WaitFor([&] { return stall_.waiting() == 1; }, absl::Seconds(10)));
  v1::Run other = run_;
  other.set_run_id("r-0000000000000002");
  other.mutable_spec()->set_experiment_name("other");
  LogTo(other, 1, 2);
  std::vector<WandbRunInfo> others = forwarder_->RunsOf(other.run_id());
  std::vector<WandbRunInfo> mine = forwarder_->RunsOf(run_.run_id());
  // Had either call waited for the forwarder's lock, the stall would have ended first (5 s).
  EXPECT_EQ(stall_.waiting(), 1) << "another run waited for the stalled spool";
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].spooled, 2);
  EXPECT_TRUE(mine.empty());  // not open yet
  stall_.Release();
  stalled.join();
  RunFor(absl::Seconds(3));
  std::vector<int64_t> steps;
  for (const Posted& p : Streams()) {
    if (!absl::StrContains(p.url, Sha1Hex("/save/exp"))) continue;
    for (const auto& line : p.body["files"]["wandb-history.jsonl"]["content"]) {
      steps.push_back(nlohmann::json::parse(line.get<std::string>())["_step"].get<int64_t>());
    }
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
}

// The API key goes only to the coordinator's W&B server: a run whose spec names another (one stored
// before SubmitRun refused that field) is still sent to the operator's.
TEST_F(ForwarderTest, TheKeyGoesOnlyToTheCoordinatorsServer) {
  run_.mutable_spec()->mutable_wandb()->set_base_url("http://collector.example");
  Log(1, 2);
  RunFor(absl::Seconds(1));
  ASSERT_FALSE(wandb_.posts().empty());
  for (const Posted& p : wandb_.posts()) EXPECT_TRUE(absl::StartsWith(p.url, "http://wandb.test/")) << p.url;
}

TEST_F(ForwarderTest, ARetryableFailureResendsTheIdenticalBodyAfterABackoffThatGrows) {
  wandb_.Answer(Reply(503, "busy"));
  wandb_.Answer(Reply(0, "", "connection refused"));
  wandb_.Answer(Reply(429, "slow down", "", absl::Seconds(30)));
  Log(1, 3);
  RunFor(absl::Seconds(60));
  std::vector<Posted> streams = Streams();
  ASSERT_EQ(streams.size(), 4u);  // 503, no answer, 429, then accepted
  for (const Posted& p : streams) EXPECT_EQ(p.raw, streams[0].raw);
  absl::Duration first = streams[1].at - streams[0].at, second = streams[2].at - streams[1].at,
                 third = streams[3].at - streams[2].at;
  // 2 s then 4 s, each with ±25 % jitter; Retry-After (30 s) overrides the 8 s backoff.
  EXPECT_GE(first, absl::Seconds(1.5));
  EXPECT_LE(first, absl::Seconds(2.6));
  EXPECT_GE(second, absl::Seconds(3));
  EXPECT_LE(second, absl::Seconds(5.1));
  EXPECT_GE(third, absl::Seconds(30));
  EXPECT_EQ(forwarder_->QueueDepth(), 0);
  // Accepted: the backoff starts over.
  Log(4, 4);
  wandb_.Answer(Reply(500, "oops"));
  RunFor(absl::Seconds(10));
  streams = Streams();
  ASSERT_EQ(streams.size(), 6u);
  EXPECT_LE(streams[5].at - streams[4].at, absl::Seconds(2.6));
  EXPECT_EQ(streams[5].body["files"]["wandb-history.jsonl"]["offset"], 3);
}

TEST_F(ForwarderTest, ARefusedBatchIsDroppedAndTheNextOneGoesOn) {
  wandb_.Answer(Reply(400, "bad request"));
  Log(1, 2);
  RunFor(absl::Milliseconds(100));
  EXPECT_EQ(forwarder_->QueueDepth(), 0);  // not retried forever
  Log(3, 3);
  RunFor(absl::Seconds(3));
  std::vector<Posted> streams = Streams();
  ASSERT_EQ(streams.size(), 2u);
  const nlohmann::json& history = streams[1].body["files"]["wandb-history.jsonl"];
  EXPECT_EQ(history["offset"], 0);  // W&B took no line of the refused batch
  ASSERT_EQ(history["content"].size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(history["content"][0].get<std::string>())["_step"], 3);
}

// Points of one step (train values, then eval's; two ranks) are one history line: a later value
// of a name replaces the earlier one, in the line and in the summary.
TEST_F(ForwarderTest, PointsOfOneStepAreOneLineWhereTheLaterValueOfANameWins) {
  v1::MetricBatch batch;
  batch.set_rank(0);
  auto add = [&](int64_t step, std::map<std::string, double> values) {
    v1::MetricPoint* p = batch.add_points();
    p->set_step(step);
    p->set_time(UnixNow() - 10);
    for (const auto& [k, v] : values) (*p->mutable_values())[k] = v;
  };
  add(1, {{"loss", 3.0}, {"lr", 0.1}});
  add(2, {{"loss", 2.5}, {"lr", 0.2}});
  add(2, {{"eval_loss", 2.75}, {"loss", 2.25}});
  add(3, {{"loss", 2.0}});
  Deliver(run_, batch);
  RunFor(absl::Seconds(1));
  std::vector<Posted> streams = Streams();
  ASSERT_EQ(streams.size(), 1u);
  const nlohmann::json& content = streams[0].body["files"]["wandb-history.jsonl"]["content"];
  ASSERT_EQ(content.size(), 3u);
  nlohmann::json two = nlohmann::json::parse(content[1].get<std::string>());
  EXPECT_EQ(two["_step"], 2);
  EXPECT_EQ(two["loss"], 2.25);
  EXPECT_EQ(two["lr"], 0.2);
  EXPECT_EQ(two["eval_loss"], 2.75);
  EXPECT_EQ(two.size(), 6u) << two;  // three values, _step, _timestamp, _runtime
  std::vector<absl::string_view> around_loss = absl::StrSplit(content[1].get<std::string>(), "\"loss\":");
  EXPECT_EQ(around_loss.size(), 2u) << "one loss key in the line: " << content[1];
  nlohmann::json three = nlohmann::json::parse(content[2].get<std::string>());
  EXPECT_EQ(three.size(), 4u) << "step 3 has only its own loss: " << three;
  nlohmann::json summary =
      nlohmann::json::parse(streams[0].body["files"]["wandb-summary.json"]["content"][0].get<std::string>());
  EXPECT_EQ(summary["loss"], 2.0);
  EXPECT_EQ(summary["lr"], 0.2);
  EXPECT_EQ(summary["eval_loss"], 2.75);
  EXPECT_EQ(summary["_step"], 3);
}

TEST_F(ForwarderTest, AnExistingRunContinuesAfterItsLastLineAndStep) {
  wandb_.ExistingRun(/*lines=*/4, /*step=*/4, /*runtime=*/100);
  Log(3, 7);  // steps 3 and 4 are already there (a replay after a restart)
  RunFor(absl::Seconds(1));
  std::vector<Posted> streams = Streams();
  ASSERT_EQ(streams.size(), 1u);
  const nlohmann::json& history = streams[0].body["files"]["wandb-history.jsonl"];
  EXPECT_EQ(history["offset"], 4);
  ASSERT_EQ(history["content"].size(), 3u);
  nlohmann::json first = nlohmann::json::parse(history["content"][0].get<std::string>());
  EXPECT_EQ(first["_step"], 5);
  EXPECT_GE(first["_runtime"].get<double>(), 100);
}

TEST_F(ForwarderTest, TheNewestStepIsHeldBackBrieflyThenTheEndedRunGetsItsFinalPost) {
  Log(1, 1, /*age_s=*/0);  // just logged: its step may still gain values
  RunFor(absl::Milliseconds(500));
  EXPECT_TRUE(Streams().empty());
  RunFor(absl::Seconds(3));
  ASSERT_EQ(Streams().size(), 1u);
  run_.set_state(v1::SUCCEEDED);
  forwarder_->OnRunChanged(run_);
  RunFor(absl::Seconds(3));
  std::vector<Posted> streams = Streams();
  ASSERT_EQ(streams.size(), 2u);
  EXPECT_EQ(streams[1].body["complete"], true);
  EXPECT_EQ(streams[1].body["exitcode"], 0);
  EXPECT_TRUE(forwarder_->Idle());
  RunFor(absl::Minutes(2));
  EXPECT_EQ(Streams().size(), 2u);  // nothing after the final post, not even a heartbeat
}

// A held-back newest step with a replayed point read after it (a rank resumed from a checkpoint
// logs an older step again): holding the row back leaves both unread, so the newest step is
// posted once it settles, not acknowledged unsent.
TEST_F(ForwarderTest, AHeldBackStepFollowedByAReplayedStepIsStillPosted) {
  wandb_.ExistingRun(/*lines=*/4, /*step=*/4, /*runtime=*/100);
  Log(5, 5, /*age_s=*/0);  // just logged: held back
  Log(3, 3);               // W&B has step 3: skipped
  RunFor(absl::Milliseconds(500));
  EXPECT_TRUE(Streams().empty());
  RunFor(absl::Seconds(3));
  std::vector<Posted> streams = Streams();
  ASSERT_EQ(streams.size(), 1u);
  const nlohmann::json& history = streams[0].body["files"]["wandb-history.jsonl"];
  EXPECT_EQ(history["offset"], 4);
  ASSERT_EQ(history["content"].size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(history["content"][0].get<std::string>())["_step"], 5);
}

// A rank's last points can arrive after the run ended and W&B saw it complete (found by
// scripts/chaos.sh: a full disk failed the run while the other rank still flushed): the W&B run
// is resumed before they are streamed, then finished again; nothing is posted to a complete run.
TEST_F(ForwarderTest, PointsAfterTheFinalPostResumeTheRunBeforeTheyAreStreamed) {
  Log(1, 3);
  run_.set_state(v1::FAILED);
  forwarder_->OnRunChanged(run_);
  RunFor(absl::Seconds(5));
  ASSERT_EQ(Streams().back().body["complete"], true);
  size_t before = wandb_.posts().size();
  wandb_.ExistingRun(/*lines=*/3, /*step=*/3, /*runtime=*/1);
  Log(4, 5);
  RunFor(absl::Seconds(5));
  std::vector<Posted> posts = wandb_.posts();
  ASSERT_GE(posts.size(), before + 4u);
  ExpectResumedThenStreamedStepsFourAndFiveThenFinished(posts, before);
  EXPECT_EQ(Streams().back().body["exitcode"], 1);
  EXPECT_TRUE(forwarder_->Idle());
}

// Points that arrive while the final post is on its way to W&B: once W&B accepts it, the run is
// complete there, so it is resumed again (check, upsert), the points streamed, and finished again.
TEST_F(ForwarderTest, PointsArrivingWhileTheFinalPostIsInFlightResumeTheRunAfterIt) {
  Log(1, 3);
  RunFor(absl::Seconds(3));
  run_.set_state(v1::FAILED);
  forwarder_->OnRunChanged(run_);
  bool logged = false;
  wandb_.DuringNextStreamPost([&](const std::string& body) {
    EXPECT_THAT(body, HasSubstr("\"complete\":true"));  // the final post
    wandb_.ExistingRun(/*lines=*/3, /*step=*/3, /*runtime=*/1);
    Log(4, 5);
    logged = true;
  });
  size_t before = wandb_.posts().size();
  RunFor(absl::Seconds(10));
  ASSERT_TRUE(logged);
  std::vector<Posted> posts = wandb_.posts();
  ASSERT_GE(posts.size(), before + 5u);
  EXPECT_EQ(posts[before].body["complete"], true);
  ExpectResumedThenStreamedStepsFourAndFiveThenFinished(posts, before + 1);  // after W&B completed it
  EXPECT_TRUE(forwarder_->Idle());
}

TEST_F(ForwarderTest, AnIdleRunIsKeptAliveWithHeartbeats) {
  Log(1, 1);
  RunFor(absl::Seconds(1));
  ASSERT_EQ(Streams().size(), 1u);
  RunFor(absl::Seconds(65));
  std::vector<Posted> streams = Streams();
  ASSERT_EQ(streams.size(), 3u);  // at 30 s and 60 s
  EXPECT_EQ(streams[1].raw, HeartbeatBody());
  EXPECT_GE(streams[2].at - streams[1].at, absl::Seconds(30));
}

// Workers on the wall clock sleep until some run's work falls due (no timed polling): new points
// must wake them, and an idle run's keep-alive must be the time they wake at.
class ForwarderWorkersTest : public ForwarderTest {
 protected:
  void StartOnTheWallClock(absl::Duration heartbeat_after) {
    Rebuild([&](ForwarderOptions& o) {
      o.clock = RealClock::Get();
      o.post_interval = absl::Milliseconds(20);
      o.heartbeat_after = heartbeat_after;
    });
    forwarder_->Start();
  }
  // Steps [first, last], stamped 10 s ago by the wall clock (the newest step is then not held
  // back for stragglers).
  void LogNow(int64_t first, int64_t last) {
    v1::MetricBatch batch;
    batch.set_rank(0);
    for (int64_t step = first; step <= last; ++step) {
      v1::MetricPoint* p = batch.add_points();
      p->set_step(step);
      p->set_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()) - 10);
      (*p->mutable_values())["loss"] = 10.0 - step;
    }
    Deliver(run_, batch);
  }
  bool StepPosted(int64_t step) {
    for (const Posted& p : Streams()) {
      // A heartbeat has no files; a summary-only post has no history.
      if (!p.body.contains("files") || !p.body["files"].contains("wandb-history.jsonl")) continue;
      for (const auto& line : p.body["files"]["wandb-history.jsonl"]["content"]) {
        if (nlohmann::json::parse(line.get<std::string>())["_step"] == step) return true;
      }
    }
    return false;
  }
};

TEST_F(ForwarderWorkersTest, NewPointsWakeWorkersThatHaveNothingDue) {
  StartOnTheWallClock(/*heartbeat_after=*/absl::Hours(1));  // nothing else would wake them
  LogNow(0, 1);
  ASSERT_TRUE(testing::WaitFor([&] { return StepPosted(1); }, absl::Seconds(30)));
  // Every worker is idle again, with nothing due for an hour.
  LogNow(2, 3);
  EXPECT_TRUE(testing::WaitFor([&] { return StepPosted(3); }, absl::Seconds(30)))
      << "points logged while every worker slept were not posted";
}

TEST_F(ForwarderWorkersTest, AnIdleRunsKeepAliveWakesTheWorkers) {
  StartOnTheWallClock(/*heartbeat_after=*/absl::Milliseconds(300));
  LogNow(0, 1);
  ASSERT_TRUE(testing::WaitFor([&] { return StepPosted(1); }, absl::Seconds(30)));
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        std::vector<Posted> streams = Streams();
        return streams.back().raw == HeartbeatBody();
      },
      absl::Seconds(30)))
      << "no keep-alive post for an idle W&B run";
}

}  // namespace
}  // namespace dt::wandb
