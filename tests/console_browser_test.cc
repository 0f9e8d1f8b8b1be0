// The web console in a real browser (headless Chromium through chromedriver) during a real 2-rank
// local run of dttrainer: what a person signing in sees. Without a token, nothing but the sign-in
// form; a run token sees its own run and not another; the admin's list shows the run, its page
// shows both ranks and a loss chart whose points grow while the run trains. Screenshots at
// 1280×800 go to <build>/console-screenshots/ for a person to look at.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "tests/test_util.h"
#include "tests/webdriver.h"

namespace dt {
namespace {

using testing::WebDriver;

std::string ScreenshotDir() {
  std::string dir = JoinPath(DT_BINARY_DIR, "../console-screenshots");
  (void)MakeDirs(dir);
  return dir;
}

class ConsoleBrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = WebDriver::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    coord_ = std::make_unique<testing::CoordinatorProcess>(
        tmp_.path(), std::vector<std::string>{"--http-listen", "127.0.0.1:0", "--heartbeat-interval", "500ms"});
    std::string addr = testing::Slurp(JoinPath(coord_->state_dir(), "console.addr"));
    addr.erase(addr.find_last_not_of('\n') + 1);
    ASSERT_FALSE(addr.empty()) << testing::Slurp(coord_->log());
    url_ = "http://" + addr + "/";
    absl::StatusOr<std::unique_ptr<WebDriver>> browser = WebDriver::Start(1280, 800);
    ASSERT_TRUE(browser.ok()) << browser.status();
    browser_ = std::move(*browser);
  }

  void TearDown() override {
    if (!run_.empty()) {
      // The run's trainers are this test's: cancel it and let the launcher stop them.
      (void)testing::RunDtctl(*coord_, {"cancel", run_});
      (void)testing::RunDtctl(*coord_, {"watch", run_});
    }
  }

  // A 2-rank local run of the tiny model, long enough to be watched while it trains.
  std::string SubmitTrainingRun() {
    std::vector<std::string> args = {"submit",
                                     "-o",
                                     "json",
                                     "--name",
                                     "console-demo",
                                     "--save-dir",
                                     tmp_.Sub("runs"),
                                     "--nproc-per-node",
                                     "2",
                                     "--omp-threads",
                                     "1",
                                     "--"};
    for (std::string& a : testing::TinyModelArgs()) args.push_back(std::move(a));
    args.insert(args.end(), {"--batch-size", "2", "--max-steps", "2000", "--eval-split", "0.05", "--eval-freq", "10",
                             "--eval-batches", "1", "--ckpt-freq", "25"});
    CommandResult r = testing::RunDtctl(*coord_, args, {{"HOME", tmp_.path()}});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return testing::DtctlJson(r).value("run_id", "");
  }

  void SignIn(const std::string& token) {
    ASSERT_TRUE(browser_->Navigate(url_).ok());
    ASSERT_TRUE(browser_->WaitUntil("return !!document.getElementById('token')", absl::Seconds(10)));
    absl::StatusOr<std::string> field = browser_->Find("#token");
    ASSERT_TRUE(field.ok()) << field.status();
    absl::Status typed = browser_->Type(*field, token);
    ASSERT_TRUE(typed.ok()) << typed;
    absl::StatusOr<std::string> button = browser_->Find("#sign-in");
    ASSERT_TRUE(button.ok()) << button.status();
    ASSERT_TRUE(browser_->Click(*button).ok());
    ASSERT_TRUE(
        browser_->WaitUntil("return location.pathname === '/' && !!document.getElementById('app')", absl::Seconds(10)));
  }

  void SignOut() {
    absl::StatusOr<std::string> button = browser_->Find("#sign-out");
    ASSERT_TRUE(button.ok()) << button.status();
    ASSERT_TRUE(browser_->Click(*button).ok());
    ASSERT_TRUE(browser_->WaitUntil("return location.pathname === '/login'", absl::Seconds(10)));
  }

  // The HTTP status of the page's own fetch of an API path (with its cookie).
  int FetchStatus(const std::string& path) {
    absl::StatusOr<nlohmann::json> r = browser_->Run(
        "const xhr = new XMLHttpRequest(); xhr.open('GET', arguments[0], false); xhr.send(); return xhr.status;",
        nlohmann::json::array({path}));
    return r.ok() && r->is_number() ? r->get<int>() : -1;
  }

  void ClickOn(const std::string& css) {
    absl::StatusOr<std::string> e = browser_->Find(css);
    ASSERT_TRUE(e.ok()) << css << ": " << e.status();
    ASSERT_TRUE(browser_->Click(*e).ok()) << css;
  }

  // A number a script returns; -1 when it returns something else.
  int Number(const std::string& script) {
    absl::StatusOr<nlohmann::json> v = browser_->Run(script);
    return v.ok() && v->is_number() ? v->get<int>() : -1;
  }

  int LossPoints() {
    return Number(
        "const s = document.querySelector(\"#charts [data-metric='loss'] svg\"); "
        "return s ? Number(s.dataset.points || 0) : 0;");
  }

  std::string BodyText() {
    absl::StatusOr<nlohmann::json> t = browser_->Run("return document.body.innerText;");
    return t.ok() ? t->get<std::string>() : "";
  }

  void Screenshot(const std::string& name) {
    absl::StatusOr<std::string> png = browser_->Screenshot();
    ASSERT_TRUE(png.ok()) << png.status();
    ASSERT_GT(png->size(), 1000u);
    ASSERT_EQ(png->substr(1, 3), "PNG");
    std::ofstream(JoinPath(ScreenshotDir(), name), std::ios::binary) << *png;
  }

  testing::TempDir tmp_;
  std::unique_ptr<testing::CoordinatorProcess> coord_;
  std::unique_ptr<WebDriver> browser_;
  std::string url_;
  std::string run_;
};

TEST_F(ConsoleBrowserTest, APersonSeesTheRunTheirTokenAllowsWhileItTrains) {
  run_ = SubmitTrainingRun();
  ASSERT_FALSE(run_.empty());
  // Another run with its own token (never launched: it waits PENDING).
  v1::SubmitRunResponse other = coord_->Submit(testing::MakeSpec("other-experiment", tmp_.Sub("runs"), 1, 1));

  // No token: the sign-in form and no data.
  ASSERT_TRUE(browser_->Navigate(url_).ok());
  ASSERT_TRUE(browser_->WaitUntil("return location.pathname === '/login'", absl::Seconds(10)));
  EXPECT_TRUE(browser_->Find("#login-form").ok());
  std::string text = BodyText();
  EXPECT_FALSE(absl::StrContains(text, run_)) << text;
  EXPECT_FALSE(absl::StrContains(text, "console-demo")) << text;
  EXPECT_EQ(FetchStatus("/api/v1/runs"), 401);
  Screenshot("console-login.png");

  // A wrong token: told so, still nothing.
  absl::StatusOr<std::string> field = browser_->Find("#token");
  ASSERT_TRUE(field.ok());
  absl::Status typed = browser_->Type(*field, "not-a-token");
  ASSERT_TRUE(typed.ok()) << typed;
  ClickOn("#sign-in");
  ASSERT_TRUE(browser_->WaitUntil("return !!document.querySelector('.error')", absl::Seconds(10)));
  EXPECT_TRUE(absl::StrContains(BodyText(), "not one this coordinator knows"));

  // The other run's token: that run only.
  SignIn(other.run_token());
  ASSERT_TRUE(browser_->WaitUntil("return document.querySelectorAll('#runs-body tr[data-run]').length === 1",
                                  absl::Seconds(15)))
      << BodyText();
  text = BodyText();
  EXPECT_TRUE(absl::StrContains(text, "other-experiment")) << text;
  EXPECT_FALSE(absl::StrContains(text, "console-demo")) << text;
  EXPECT_EQ(FetchStatus("/api/v1/runs/" + run_), 403);
  ASSERT_TRUE(browser_->Navigate(url_ + "#/runs/" + run_).ok());
  ASSERT_TRUE(browser_->WaitUntil("return !!document.getElementById('error-banner')", absl::Seconds(10)));
  text = BodyText();
  EXPECT_TRUE(absl::StrContains(text, "may not")) << text;
  EXPECT_FALSE(absl::StrContains(text, "console-demo")) << text;
  EXPECT_EQ(Number("return document.querySelectorAll('#ranks tr[data-rank]').length;"), 0);
  SignOut();

  // The admin: the run in the list, with its progress.
  SignIn(coord_->admin_token());
  const std::string row = "#runs-body tr[data-run='" + run_ + "']";
  ASSERT_TRUE(browser_->WaitUntil("return !!document.querySelector(\"" + row + "\")", absl::Seconds(15))) << BodyText();
  EXPECT_TRUE(absl::StrContains(BodyText(), "console-demo"));
  EXPECT_TRUE(absl::StrContains(BodyText(), "other-experiment"));
  ASSERT_TRUE(browser_->WaitUntil("return document.querySelector(\"" + row + " .badge\").textContent === 'RUNNING'",
                                  absl::Minutes(2)))
      << BodyText();
  // The state filter: "Failed" shows neither run.
  ClickOn("#state-filters button[data-filter='failed']");
  EXPECT_TRUE(browser_->WaitUntil("return document.querySelectorAll('#runs-body tr[data-run]').length === 0",
                                  absl::Seconds(5)));
  ClickOn("#state-filters button[data-filter='active']");
  EXPECT_TRUE(browser_->WaitUntil("return document.querySelectorAll('#runs-body tr[data-run]').length === 2",
                                  absl::Seconds(5)));
  Screenshot("console-runs.png");

  // The run's page: both ranks, and a loss chart whose points grow as the run trains.
  ClickOn(row + " a");
  ASSERT_TRUE(
      browser_->WaitUntil("return document.querySelectorAll('#ranks tr[data-rank]').length === 2", absl::Seconds(20)))
      << BodyText();
  ASSERT_TRUE(testing::WaitFor([&] { return LossPoints() >= 20; }, absl::Minutes(2))) << BodyText();
  int before = LossPoints();
  EXPECT_TRUE(testing::WaitFor([&] { return LossPoints() > before; }, absl::Seconds(30)));
  // One line per rank.
  EXPECT_EQ(Number("return document.querySelectorAll(\"#charts [data-metric='loss'] path.line\").length;"), 2);
  for (const char* chart : {"lr", "tokens_per_s", "step_time_s"}) {
    EXPECT_TRUE(browser_->WaitUntil(
        absl::StrCat("return !!document.querySelector(\"#charts [data-metric='", chart, "'] svg[data-points]\");"),
        absl::Seconds(10)))
        << chart;
  }
  EXPECT_TRUE(
      browser_->WaitUntil("return !!document.querySelector(\"#charts [data-metric='eval_loss']\")", absl::Seconds(60)));
  // Ranks show their node, pid and a step time; the log tail is rank 0's output.
  text = BodyText();
  v1::Run run = coord_->GetRun(run_);
  for (const auto& r : run.ranks()) EXPECT_TRUE(absl::StrContains(text, std::to_string(r.pid()))) << text;
  EXPECT_TRUE(browser_->WaitUntil(
      "return document.querySelector('#ranks tr[data-rank] td:nth-child(8)').textContent.includes(' s')",
      absl::Seconds(20)));
  EXPECT_TRUE(
      browser_->WaitUntil("return document.getElementById('log').textContent.includes('step')", absl::Seconds(20)));
  EXPECT_TRUE(absl::StrContains(BodyText(), run.exp_dir()));
  EXPECT_TRUE(
      browser_->WaitUntil("return document.querySelectorAll('#checkpoints tbody td.num').length > 0 && "
                          "!document.querySelector('#checkpoints .empty')",
                          absl::Minutes(1)));
  // "all ranks": both ranks' lines in one stream, each line naming its rank.
  ClickOn("#log-tabs button[data-rank='all']");
  EXPECT_TRUE(browser_->WaitUntil(
      "const t = document.getElementById('log').textContent; return t.includes('[rank 0] ') && t.includes('[rank 1] ')",
      absl::Seconds(20)))
      << BodyText();
  ClickOn("#log-fold");
  EXPECT_TRUE(browser_->WaitUntil("return document.getElementById('log').textContent.includes('[rank 1] ')",
                                  absl::Seconds(20)));
  // Legible at 1280×800: nothing wider than the window.
  EXPECT_LE(Number("return document.documentElement.scrollWidth;"), 1280);
  Screenshot("console-run.png");
  // The whole page at the same width, for a person to look over.
  ASSERT_TRUE(browser_->SetViewport(1280, Number("return document.documentElement.scrollHeight;")).ok());
  Screenshot("console-run-full.png");
}

}  // namespace
}  // namespace dt
