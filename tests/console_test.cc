// dtcoord's web console over real HTTP (libcurl against CivetWeb) in front of a real coordinator:
// sign-in and sessions, what a request without a token gets (nothing but the sign-in form), the
// permissions of run tokens, the JSON API's shapes and validation, the metric series, and log
// tails read without following a planted link. The page itself is tested in a real browser by
// console_browser_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/agent.h"
#include "client/metrics_reporter.h"
#include "common/fs.h"
#include "coordinator/console/console_api.h"
#include "coordinator/console/console_server.h"
#include "coordinator/console/console_sessions.h"
#include "tests/http_test_client.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using testing::Http;
using testing::HttpResponse;

class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EmbeddedOptions o;
    o.timeouts.heartbeat_interval = absl::Seconds(1);
    o.timeouts.heartbeat_timeout = absl::Seconds(60);
    o.http_listen = "127.0.0.1:0";
    coord_ = std::make_unique<EmbeddedCoordinator>(tmp_.Sub("state"), o);
    url_ = coord_->console_url();
    ASSERT_TRUE(absl::StartsWith(url_, "http://127.0.0.1:")) << url_;
    run_ = Submit("alpha");
    other_ = Submit("beta");
  }

  v1::SubmitRunResponse Submit(const std::string& name) {
    auto admin = coord_->AdminClient();
    v1::SubmitRunRequest req;
    *req.mutable_spec() = testing::MakeSpec(name, tmp_.Sub("runs"), 1, 2);
    absl::StatusOr<v1::SubmitRunResponse> r =
        Call(*admin, &v1::RunService::Stub::SubmitRun, admin->runs(), req, absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::SubmitRunResponse();
  }

  // Both ranks of `run_` registered; agents_[r] holds rank r.
  void RegisterRanks() { agents_ = testing::RegisterAgents(coord_->Client(run_.run_token()), run_.run_id(), "n1", 2); }

  // `steps` points of loss and step_time_s for each rank; rank 1 is three times slower.
  void ReportMetrics(int steps) {
    for (int rank = 0; rank < 2; ++rank) {
      MetricsReporter m(coord_->Client(run_.run_token()), run_.run_id(), agents_[rank]->generation(), rank);
      for (int s = 1; s <= steps; ++s) {
        m.Add(s, {{"loss", 10.0 / s + rank}, {"step_time_s", rank == 1 ? 0.3 : 0.1}});
      }
      ASSERT_TRUE(m.Flush(absl::Seconds(10)).ok());
    }
  }

  HttpResponse Get(const std::string& path, const std::string& token) {
    std::vector<std::string> headers;
    if (!token.empty()) headers.push_back("Authorization: Bearer " + token);
    return Http("GET", url_ + path.substr(1), headers);
  }
  nlohmann::json Json(const HttpResponse& r) {
    EXPECT_EQ(r.Header("content-type"), "application/json") << r.body;
    return nlohmann::json::parse(r.body, nullptr, false);
  }
  // Signs in through the form; the session cookie ("dt_console=…").
  std::string SignIn(const std::string& token) {
    HttpResponse r =
        Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded"}, "token=" + token);
    EXPECT_EQ(r.status, 303) << r.body;
    EXPECT_EQ(r.Header("location"), "/");
    std::string cookie = r.Header("set-cookie");
    EXPECT_TRUE(absl::StrContains(cookie, "HttpOnly")) << cookie;
    EXPECT_TRUE(absl::StrContains(cookie, "SameSite=Strict")) << cookie;
    return cookie.substr(0, cookie.find(';'));
  }

  testing::TempDir tmp_;
  std::unique_ptr<EmbeddedCoordinator> coord_;
  std::string url_;
  v1::SubmitRunResponse run_, other_;
  std::vector<std::unique_ptr<Agent>> agents_;
};

TEST_F(ConsoleTest, WithoutATokenThereIsNothingButTheSignInForm) {
  HttpResponse page = Http("GET", url_);
  EXPECT_EQ(page.status, 303);
  EXPECT_EQ(page.Header("location"), "/login");
  HttpResponse login = Http("GET", url_ + "login");
  EXPECT_EQ(login.status, 200);
  EXPECT_TRUE(absl::StrContains(login.body, "<form method=\"post\" action=\"/login\"")) << login.body;
  EXPECT_FALSE(absl::StrContains(login.body, run_.run_id()));
  EXPECT_TRUE(absl::StrContains(login.Header("content-security-policy"), "default-src 'self'"));
  EXPECT_EQ(login.Header("x-frame-options"), "DENY");
  for (const std::string& path :
       {std::string("/api/v1/runs"), "/api/v1/runs/" + run_.run_id(), std::string("/api/v1/whoami")}) {
    HttpResponse api = Get(path, "");
    EXPECT_EQ(api.status, 401) << path;
    EXPECT_FALSE(absl::StrContains(api.body, run_.run_id())) << api.body;
    EXPECT_TRUE(absl::StrContains(Json(api).value("error", ""), "sign in")) << api.body;
  }
  // A made-up cookie is no session.
  HttpResponse forged = Http("GET", url_, {"Cookie: dt_console=" + std::string(64, 'a')});
  EXPECT_EQ(forged.status, 303);
  EXPECT_EQ(Get("/api/v1/runs", "not-a-token").status, 401);
}

// A run token signing in over and over cannot sign the admin out (a tester's 4,100 sign-ins with one
// run token evicted every other session); repeated sign-ins are throttled, and a sign-in posted from
// another site is refused.
TEST_F(ConsoleTest, OneTokensSignInsNeverEndAnothersSessions) {
  std::string admin = SignIn(coord_->admin_token());
  int refused = 0;
  for (int k = 0; k < 60; ++k) {
    HttpResponse r =
        Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded"}, "token=" + run_.run_token());
    if (r.status == 429) ++refused;
  }
  EXPECT_GT(refused, 0);                                                           // throttled: at most 20 a minute
  EXPECT_EQ(Http("GET", url_ + "api/v1/runs", {"Cookie: " + admin}).status, 200);  // still signed in

  HttpResponse cross =
      Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded", "Origin: http://evil.example"},
           "token=" + coord_->admin_token());
  EXPECT_EQ(cross.status, 403) << cross.body;
  EXPECT_TRUE(cross.Header("set-cookie").empty());
  HttpResponse site =
      Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded", "Sec-Fetch-Site: cross-site"},
           "token=" + coord_->admin_token());
  EXPECT_EQ(site.status, 403);
  // A sandboxed frame elsewhere posts with "Origin: null"; a browser's same-site page (another
  // port of this host) says so in Sec-Fetch-Site. Both refused; this console's own page is not.
  EXPECT_EQ(Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded", "Origin: null"},
                 "token=" + coord_->admin_token())
                .status,
            403);
  EXPECT_EQ(
      Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded", "Sec-Fetch-Site: same-site"},
           "token=" + coord_->admin_token())
          .status,
      403);
  EXPECT_EQ(
      Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded", "Sec-Fetch-Site: same-origin"},
           "token=" + coord_->admin_token())
          .status,
      303);
}

TEST(ConsoleSessionsTest, SessionsAreCappedPerTokenAndFailuresPauseSignIn) {
  ConsoleSessionLimits limits;
  limits.max_sessions = 8;
  limits.per_principal = 3;
  limits.sign_ins_per_minute = 100;
  limits.failures_per_minute = 5;
  ConsoleSessions sessions(limits);
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  Principal admin{true, ""};
  Principal run{false, "r-0000000000000001"};
  std::string admin_session = *sessions.Create(admin, now);
  std::vector<std::string> run_sessions;
  for (int k = 0; k < 10; ++k) run_sessions.push_back(*sessions.Create(run, now + absl::Seconds(k)));
  EXPECT_TRUE(sessions.Find(admin_session, now).has_value());     // never pushed out by another token
  EXPECT_FALSE(sessions.Find(run_sessions[0], now).has_value());  // the run's own oldest made room
  EXPECT_TRUE(sessions.Find(run_sessions[9], now).has_value());
  EXPECT_EQ(sessions.size(), 4u);
  // Every slot held by others: refused, not evicting.
  for (int k = 2; k < 6; ++k) {
    ASSERT_TRUE(sessions.Create(Principal{false, absl::StrCat("r-00000000000000", k, "0")}, now).ok());
  }
  absl::StatusOr<std::string> full = sessions.Create(Principal{false, "r-0000000000000099"}, now);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(sessions.Find(admin_session, now).has_value());
  // Failures pause sign-in for the rest of the minute.
  for (int k = 0; k < 5; ++k) sessions.Failed(now);
  EXPECT_EQ(sessions.MayTry(now + absl::Seconds(30)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(sessions.MayTry(now + absl::Seconds(61)).ok());
}

TEST_F(ConsoleTest, SigningInSetsASessionThatSigningOutEnds) {
  HttpResponse bad =
      Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded"}, "token=wrong-token");
  EXPECT_EQ(bad.status, 401);
  EXPECT_TRUE(absl::StrContains(bad.body, "not one this coordinator knows")) << bad.body;
  EXPECT_TRUE(bad.Header("set-cookie").empty());
  HttpResponse empty = Http("POST", url_ + "login", {"Content-Type: application/x-www-form-urlencoded"}, "token=");
  EXPECT_EQ(empty.status, 400);

  std::string cookie = SignIn(coord_->admin_token());
  HttpResponse page = Http("GET", url_, {"Cookie: " + cookie});
  EXPECT_EQ(page.status, 200);
  EXPECT_TRUE(absl::StrContains(page.body, "/static/app.js"));
  HttpResponse runs = Http("GET", url_ + "api/v1/runs", {"Cookie: " + cookie});
  ASSERT_EQ(runs.status, 200) << runs.body;
  EXPECT_EQ(Json(runs)["runs"].size(), 2u);
  EXPECT_EQ(Http("GET", url_ + "login", {"Cookie: " + cookie}).status, 303);  // already signed in

  HttpResponse out = Http("POST", url_ + "logout", {"Cookie: " + cookie});
  EXPECT_EQ(out.status, 303);
  EXPECT_TRUE(absl::StrContains(out.Header("set-cookie"), "Max-Age=0"));
  EXPECT_EQ(Http("GET", url_ + "api/v1/runs", {"Cookie: " + cookie}).status, 401);
}

TEST_F(ConsoleTest, ARunTokenSeesItsOwnRunAndNoOther) {
  nlohmann::json who = Json(Get("/api/v1/whoami", run_.run_token()));
  EXPECT_EQ(who["admin"], false);
  EXPECT_EQ(who["run_id"], run_.run_id());
  nlohmann::json runs = Json(Get("/api/v1/runs", run_.run_token()));
  ASSERT_EQ(runs["runs"].size(), 1u);
  EXPECT_EQ(runs["runs"][0]["run_id"], run_.run_id());
  for (std::string path : {"", "/checkpoints", "/metrics", "/series", "/logs/0"}) {
    HttpResponse r = Get("/api/v1/runs/" + other_.run_id() + path, run_.run_token());
    EXPECT_EQ(r.status, 403) << path << " " << r.body;
    EXPECT_EQ(Json(r)["code"], "PERMISSION_DENIED");
    EXPECT_FALSE(absl::StrContains(r.body, "beta")) << r.body;  // nothing of the other run
  }
  // The same through a session made from the run token.
  std::string cookie = SignIn(run_.run_token());
  EXPECT_EQ(Http("GET", url_ + "api/v1/runs/" + other_.run_id(), {"Cookie: " + cookie}).status, 403);
  EXPECT_EQ(Http("GET", url_ + "api/v1/runs/" + run_.run_id(), {"Cookie: " + cookie}).status, 200);
  // The admin sees both, and can filter by state.
  EXPECT_EQ(Json(Get("/api/v1/runs", coord_->admin_token()))["runs"].size(), 2u);
  EXPECT_EQ(Json(Get("/api/v1/runs?state=SUCCEEDED,FAILED", coord_->admin_token()))["runs"].size(), 0u);
  EXPECT_EQ(Json(Get("/api/v1/runs?state=PENDING", coord_->admin_token()))["runs"].size(), 2u);
}

TEST_F(ConsoleTest, BadRequestsAreRefusedNamingTheCause) {
  const std::string& admin = coord_->admin_token();
  struct Bad {
    std::string path;
    int status;
    std::string says;
  } cases[] = {
      {"/api/v1/runs?bogus=1", 400, "unknown parameter \"bogus\""},
      {"/api/v1/runs?state=SLEEPING", 400, "is not a run state"},
      {"/api/v1/runs?limit=-1", 400, "limit must be an integer in 0..100000"},
      {"/api/v1/runs?limit=1&limit=2", 400, "given twice"},
      {"/api/v1/runs/not-a-run", 400, "run id"},
      {"/api/v1/runs/r-00000000000000ff", 404, "r-00000000000000ff"},
      {"/api/v1/runs/" + run_.run_id() + "/metrics?limit=100001", 400, "limit must be an integer in 0..100000"},
      {"/api/v1/runs/" + run_.run_id() + "/metrics?name=bad%20name", 400, "metric name"},
      {"/api/v1/runs/" + run_.run_id() + "/series?max_points=5", 400, "max_points must be an integer in 10..20000"},
      {"/api/v1/runs/" + run_.run_id() + "/logs/2", 404, "has no rank \"2\" (ranks 0..1, or all)"},
      {"/api/v1/runs/" + run_.run_id() + "/logs/x", 404, "has no rank"},
      {"/api/v1/runs/" + run_.run_id() + "/logs/0?bytes=0", 400, "bytes must be an integer in 1..1048576"},
      {"/api/v1/nothing", 404, "no API at"},
  };
  for (const Bad& b : cases) {
    HttpResponse r = Get(b.path, admin);
    EXPECT_EQ(r.status, b.status) << b.path << " " << r.body;
    std::string error = Json(r).value("error", "");
    EXPECT_TRUE(absl::StrContains(error, b.says)) << b.path << ": " << error;
  }
  HttpResponse post = Http("POST", url_ + "api/v1/runs", {"Authorization: Bearer " + admin});
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.Header("allow"), "GET");
  EXPECT_EQ(Http("GET", url_ + "static/nothing.js").status, 404);
  HttpResponse script = Http("GET", url_ + "static/app.js");
  EXPECT_EQ(script.status, 200);
  EXPECT_EQ(script.Header("content-type"), "text/javascript; charset=utf-8");
}

TEST_F(ConsoleTest, ARunShowsItsRanksStepTimesAndMetricSeries) {
  RegisterRanks();
  ReportMetrics(300);
  nlohmann::json run = Json(Get("/api/v1/runs/" + run_.run_id(), run_.run_token()));
  ASSERT_EQ(run["ranks"].size(), 2u) << run;
  EXPECT_EQ(run["ranks"][1]["node"], "n1");
  EXPECT_EQ(run["state"], "RUNNING");
  EXPECT_EQ(run["wandb"], nlohmann::json::array());  // no forwarder here
  // The newest step time of each rank: rank 1 is the straggler.
  EXPECT_DOUBLE_EQ(run["rank_step_time"]["0"]["seconds"].get<double>(), 0.1) << run["rank_step_time"];
  EXPECT_DOUBLE_EQ(run["rank_step_time"]["1"]["seconds"].get<double>(), 0.3);
  EXPECT_EQ(run["rank_step_time"]["1"]["step"], 300);

  nlohmann::json all = Json(Get("/api/v1/runs/" + run_.run_id() + "/series", run_.run_token()));
  EXPECT_EQ(all["complete"], true);
  ASSERT_EQ(all["series"]["loss"]["1"].size(), 300u);
  EXPECT_EQ(all["series"]["loss"]["1"][0], nlohmann::json::array({1, 11.0}));
  // Thinned: at most max_points a line, the highest and lowest values and the last point kept.
  nlohmann::json thin = Json(Get("/api/v1/runs/" + run_.run_id() + "/series?max_points=20", run_.run_token()));
  const nlohmann::json& loss0 = thin["series"]["loss"]["0"];
  EXPECT_LE(loss0.size(), 21u);
  EXPECT_GE(loss0.size(), 10u);
  EXPECT_EQ(loss0[0], nlohmann::json::array({1, 10.0}));  // the maximum
  EXPECT_EQ(loss0.back()[0], 300);                        // the last step, the minimum
  // Only what is new since a step.
  nlohmann::json recent = Json(Get("/api/v1/runs/" + run_.run_id() + "/series?from_step=291", run_.run_token()));
  EXPECT_EQ(recent["series"]["step_time_s"]["0"].size(), 10u);

  // dtctl's record shape, paged.
  nlohmann::json page =
      Json(Get("/api/v1/runs/" + run_.run_id() + "/metrics?name=loss&rank=1&limit=2", coord_->admin_token()));
  ASSERT_EQ(page["records"].size(), 2u);
  EXPECT_EQ(page["records"][0],
            (nlohmann::json{
                {"step", 1}, {"rank", 1}, {"name", "loss"}, {"value", 11.0}, {"time", page["records"][0]["time"]}}));
  ASSERT_FALSE(page["next"].is_null());
  nlohmann::json next =
      Json(Get(absl::StrCat("/api/v1/runs/", run_.run_id(), "/metrics?name=loss&rank=1&limit=2",
                            "&after_step=", page["next"]["step"].get<int>(), "&after_rank=1", "&after_name=loss"),
               coord_->admin_token()));
  EXPECT_EQ(next["records"][0]["step"], 3);
}

TEST_F(ConsoleTest, ARunWaitingAtABarrierShowsWhereAndForWhichRanks) {
  RegisterRanks();
  absl::Status first;
  std::thread waiting([&] { first = agents_[0]->Barrier("eval-done", absl::Seconds(60)); });
  nlohmann::json run;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        run = Json(Get("/api/v1/runs/" + run_.run_id(), run_.run_token()));
        return run["open_barriers"].size() == 1;
      },
      absl::Seconds(10)))
      << run;
  const nlohmann::json& b = run["open_barriers"][0];
  EXPECT_EQ(b["name"], "eval-done");
  EXPECT_EQ(b["sequence"], 1);
  EXPECT_EQ(b["arrived"], 1);
  EXPECT_EQ(b["missing_ranks"], nlohmann::json::array({1}));
  EXPECT_FALSE(b["first_arrival"].get<std::string>().empty());
  EXPECT_TRUE(agents_[1]->Barrier("eval-done", absl::Seconds(60)).ok());
  waiting.join();
  EXPECT_TRUE(first.ok()) << first;
  EXPECT_EQ(Json(Get("/api/v1/runs/" + run_.run_id(), run_.run_token()))["open_barriers"], nlohmann::json::array());
}

TEST_F(ConsoleTest, ALogTailStartsAtALineAndAPlantedLinkIsNotFollowed) {
  std::string logs = JoinPath(run_.exp_dir(), "logs");
  std::string text;
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&text, "line ", i, " é\n");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(logs, "rank-0.log"), text).ok());
  nlohmann::json tail = Json(Get("/api/v1/runs/" + run_.run_id() + "/logs/0?bytes=100", run_.run_token()));
  EXPECT_EQ(tail["truncated"], true);
  EXPECT_EQ(tail["size"], static_cast<int64_t>(text.size()));
  std::string got = tail["text"];
  EXPECT_TRUE(absl::StartsWith(got, "line ")) << got;  // the cut line is dropped
  EXPECT_TRUE(absl::EndsWith(got, "line 1999 é\n")) << got;
  EXPECT_EQ(tail["file"], JoinPath(logs, "rank-0.log"));

  // A rank that has not written yet: an empty log, not an error.
  nlohmann::json none = Json(Get("/api/v1/runs/" + run_.run_id() + "/logs/1", run_.run_token()));
  EXPECT_EQ(none["text"], "");

  std::string secret = JoinPath(tmp_.path(), "secret.txt");
  ASSERT_TRUE(WriteFileAtomic(secret, "the admin's secret\n").ok());
  ASSERT_EQ(::symlink(secret.c_str(), JoinPath(logs, "rank-1.log").c_str()), 0);
  HttpResponse r = Get("/api/v1/runs/" + run_.run_id() + "/logs/1", run_.run_token());
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_FALSE(absl::StrContains(r.body, "secret")) << r.body;
  EXPECT_TRUE(absl::StrContains(Json(r).value("error", ""), "symbolic link")) << r.body;
}

// logs/all: every rank's lines in one stream, in the order dtslot's chunk times say; fold=1 shows
// a line both ranks printed once; a planted link is refused there too.
TEST_F(ConsoleTest, AllRanksTailIsOneStreamInTimeOrder) {
  std::string logs = JoinPath(run_.exp_dir(), "logs");
  ASSERT_TRUE(WriteFileAtomic(JoinPath(logs, "rank-0.log"), "a\nsame\nc\n").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(logs, "rank-0.log.times"), "2 100\n7 150\n9 300\n").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(logs, "rank-1.log"), "b\nsame\nd\n").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(logs, "rank-1.log.times"), "2 200\n7 210\n9 400\n").ok());
  std::string base = "/api/v1/runs/" + run_.run_id() + "/logs/all";
  nlohmann::json all = Json(Get(base, run_.run_token()));
  EXPECT_EQ(all["text"], "[rank 0] a\n[rank 0] same\n[rank 1] b\n[rank 1] same\n[rank 0] c\n[rank 1] d\n") << all;
  EXPECT_EQ(all["rank"], "all");
  EXPECT_EQ(all["ranks"], 2);
  nlohmann::json folded = Json(Get(base + "?fold=1", run_.run_token()));
  EXPECT_EQ(folded["text"], "[rank 0] a\n[ranks 0-1] same\n[rank 1] b\n[rank 0] c\n[rank 1] d\n") << folded;
  HttpResponse one = Get("/api/v1/runs/" + run_.run_id() + "/logs/0?fold=1", run_.run_token());
  EXPECT_EQ(one.status, 400) << one.body;
  EXPECT_TRUE(absl::StrContains(Json(one).value("error", ""), "fold=1 applies to logs/all")) << one.body;

  std::string secret = JoinPath(tmp_.path(), "secret.txt");
  ASSERT_TRUE(WriteFileAtomic(secret, "the admin's secret\n").ok());
  ASSERT_EQ(::unlink(JoinPath(logs, "rank-1.log").c_str()), 0);
  ASSERT_EQ(::symlink(secret.c_str(), JoinPath(logs, "rank-1.log").c_str()), 0);
  HttpResponse r = Get(base, run_.run_token());
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_FALSE(absl::StrContains(r.body, "secret")) << r.body;
}

TEST(ConsoleServerTest, OnlyALoopbackAddressIsServed) {
  ConsoleOptions o;
  o.listen = "0.0.0.0:0";
  absl::StatusOr<std::unique_ptr<ConsoleServer>> s = ConsoleServer::Start(o, nullptr, nullptr, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "not a loopback address")) << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(), "SSH tunnel")) << s.status();
  o.listen = "nonsense";
  EXPECT_TRUE(absl::StrContains(ConsoleServer::Start(o, nullptr, nullptr, nullptr).status().message(), "HOST:PORT"));
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.8.9.1"));
  EXPECT_TRUE(IsLoopbackHost("[::1]"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("128.0.0.1"));
}

TEST(ConsoleApiTest, WandbRunLinksPointAtThePages) {
  wandb::WandbRunInfo w;
  w.base_url = "https://api.wandb.ai";
  w.entity = "team";
  w.project = "gpt2";
  w.run_id = "abc";
  EXPECT_EQ(ConsoleApi::WandbRunUrl(w), "https://wandb.ai/team/gpt2/runs/abc");
  w.base_url = "http://wandb.internal:8080/";
  EXPECT_EQ(ConsoleApi::WandbRunUrl(w), "http://wandb.internal:8080/team/gpt2/runs/abc");
  w.base_url = "javascript:alert(document.cookie)//";  // never a link that runs in the page
  EXPECT_EQ(ConsoleApi::WandbRunUrl(w), "");
  w.base_url = "https://api.wandb.ai";
  w.entity = "";  // W&B has not named the key's entity yet
  EXPECT_EQ(ConsoleApi::WandbRunUrl(w), "");
}

}  // namespace
}  // namespace dt
