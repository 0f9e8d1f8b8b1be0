#include "tests/webdriver.h"

#include <unistd.h>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "tests/http_test_client.h"

namespace dt::testing {
namespace {

constexpr char kChromium[] = "/usr/bin/chromium";
constexpr char kElementKey[] = "element-6066-11e4-a52e-4f735466cecf";  // the W3C element reference

}  // namespace

std::string WebDriver::Unavailable() {
  if (::access(kChromium, X_OK) != 0) return "chromium is not installed (scripts/setup.sh installs it)";
  if (FindOnPath("chromedriver").empty())
    return "chromedriver is not installed (scripts/setup.sh installs chromium-driver)";
  return "";
}

absl::StatusOr<std::unique_ptr<WebDriver>> WebDriver::Start(int width, int height) {
  std::unique_ptr<WebDriver> d(new WebDriver());
  std::string log = JoinPath(d->dir_.path(), "chromedriver.log");
  d->driver_ = std::make_unique<Subprocess>(std::vector<std::string>{FindOnPath("chromedriver"), "--port=0"},
                                            std::map<std::string, std::string>{}, log);
  // chromedriver says which port it took: "... started successfully on port 37583."
  int port = 0;
  bool up = WaitFor(
      [&] {
        std::string text = Slurp(log);
        size_t at = text.find("on port ", text.find("started successfully"));
        if (at == std::string::npos) return false;
        size_t end = text.find('.', at);
        return end != std::string::npos && absl::SimpleAtoi(text.substr(at + 8, end - at - 8), &port) && port > 0;
      },
      absl::Seconds(20));
  if (!up) return absl::UnavailableError(absl::StrCat("chromedriver did not start: ", Slurp(log)));
  d->base_ = absl::StrCat("http://127.0.0.1:", port, "/");
  // As root Chromium needs --no-sandbox; the network flags keep it from reaching for Google's
  // services, which this machine cannot reach.
  nlohmann::json chrome = {
      {"binary", kChromium},
      {"args",
       {"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
        "--hide-scrollbars", absl::StrCat("--window-size=", width, ",", height),
        absl::StrCat("--user-data-dir=", d->dir_.Sub("profile"))}}};
  nlohmann::json caps = {
      {"capabilities", {{"alwaysMatch", {{"browserName", "chrome"}, {"goog:chromeOptions", chrome}}}}}};
  absl::StatusOr<nlohmann::json> session = d->Command("POST", "session", caps);
  if (!session.ok()) return session.status();
  d->session_ = session->value("sessionId", "");
  if (d->session_.empty()) return absl::InternalError(absl::StrCat("no session id in ", session->dump()));
  if (absl::Status s = d->SetViewport(width, height); !s.ok()) return s;
  return d;
}

WebDriver::~WebDriver() {
  if (!session_.empty()) (void)Http("DELETE", base_ + "session/" + session_, {}, "", absl::Seconds(20));
}

absl::StatusOr<nlohmann::json> WebDriver::Command(const std::string& method, const std::string& path,
                                                  const nlohmann::json& body) {
  std::string url =
      base_ + (path == "session" ? path : absl::StrCat("session/", session_, path.empty() ? "" : "/", path));
  HttpResponse r =
      Http(method, url, {"Content-Type: application/json"}, body.is_null() ? "" : body.dump(), absl::Seconds(60));
  if (r.status == 0) return absl::UnavailableError(absl::StrCat(method, " ", url, ": ", r.error));
  nlohmann::json reply = nlohmann::json::parse(r.body, nullptr, false);
  if (reply.is_discarded()) return absl::InternalError(absl::StrCat(method, " ", url, ": ", r.body));
  nlohmann::json value = reply.value("value", nlohmann::json());
  if (r.status != 200) {
    std::string error = value.is_object() ? value.value("error", "") : "";
    std::string message = value.is_object() ? value.value("message", "") : r.body;
    absl::Status s = absl::InternalError(absl::StrCat(method, " ", path, ": ", error, ": ", message));
    if (error == "no such element") return absl::NotFoundError(s.message());
    return s;
  }
  return value;
}

absl::Status WebDriver::Navigate(const std::string& url) { return Command("POST", "url", {{"url", url}}).status(); }

absl::StatusOr<std::string> WebDriver::Url() {
  absl::StatusOr<nlohmann::json> v = Command("GET", "url");
  if (!v.ok()) return v.status();
  return v->get<std::string>();
}

absl::StatusOr<std::string> WebDriver::Find(const std::string& css) {
  absl::StatusOr<nlohmann::json> v = Command("POST", "element", {{"using", "css selector"}, {"value", css}});
  if (!v.ok()) return v.status();
  return v->value(kElementKey, "");
}

absl::StatusOr<std::vector<std::string>> WebDriver::FindAll(const std::string& css) {
  absl::StatusOr<nlohmann::json> v = Command("POST", "elements", {{"using", "css selector"}, {"value", css}});
  if (!v.ok()) return v.status();
  std::vector<std::string> out;
  for (const auto& e : *v) out.push_back(e.value(kElementKey, ""));
  return out;
}

absl::Status WebDriver::Type(const std::string& element, const std::string& text) {
  return Command("POST", absl::StrCat("element/", element, "/value"), {{"text", text}}).status();
}

absl::Status WebDriver::Click(const std::string& element) {
  return Command("POST", absl::StrCat("element/", element, "/click"), nlohmann::json::object()).status();
}

absl::StatusOr<std::string> WebDriver::Text(const std::string& element) {
  absl::StatusOr<nlohmann::json> v = Command("GET", absl::StrCat("element/", element, "/text"));
  if (!v.ok()) return v.status();
  return v->get<std::string>();
}

absl::StatusOr<nlohmann::json> WebDriver::Run(const std::string& script, const nlohmann::json& args) {
  return Command("POST", "execute/sync", {{"script", script}, {"args", args}});
}

bool WebDriver::WaitUntil(const std::string& script, absl::Duration timeout) {
  return WaitFor(
      [&] {
        absl::StatusOr<nlohmann::json> v = Run(script);
        return v.ok() && v->is_boolean() && v->get<bool>();
      },
      timeout);
}

absl::Status WebDriver::SetViewport(int width, int height) {
  // The window includes the browser's own frame: measure it, then size the window around the page.
  absl::StatusOr<nlohmann::json> frame =
      Run("return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight];");
  if (!frame.ok()) return frame.status();
  nlohmann::json rect = {{"width", width + (*frame)[0].get<int>()}, {"height", height + (*frame)[1].get<int>()}};
  if (absl::Status s = Command("POST", "window/rect", rect).status(); !s.ok()) return s;
  absl::StatusOr<nlohmann::json> inner = Run("return [window.innerWidth, window.innerHeight];");
  if (!inner.ok()) return inner.status();
  if ((*inner)[0] != width || (*inner)[1] != height) {
    return absl::InternalError(absl::StrCat("the viewport is ", inner->dump(), ", not ", width, "x", height));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WebDriver::Screenshot() {
  absl::StatusOr<nlohmann::json> v = Command("GET", "screenshot");
  if (!v.ok()) return v.status();
  std::string png;
  if (!absl::Base64Unescape(v->get<std::string>(), &png)) return absl::InternalError("the screenshot is not base64");
  return png;
}

absl::Status WebDriver::DeleteCookies() { return Command("DELETE", "cookie").status(); }

}  // namespace dt::testing
