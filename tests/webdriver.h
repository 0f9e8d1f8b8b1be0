// A real browser for tests: Debian's chromium, headless, driven by chromedriver over the W3C
// WebDriver protocol (JSON over HTTP, through tests/http_test_client). Enough of the protocol to
// act as a person would: open a page, type into a field, click, read text, run a script, take a
// screenshot.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "tests/test_util.h"

namespace dt::testing {

class WebDriver {
 public:
  // Why a browser cannot run here ("" when it can): chromium or chromedriver missing.
  static std::string Unavailable();
  // chromedriver on a free port and one headless Chromium session whose viewport is width × height.
  static absl::StatusOr<std::unique_ptr<WebDriver>> Start(int width, int height);
  ~WebDriver();  // ends the session and chromedriver

  absl::Status Navigate(const std::string& url);
  absl::StatusOr<std::string> Url();
  // The element matching a CSS selector (NOT_FOUND when none does).
  absl::StatusOr<std::string> Find(const std::string& css);
  absl::StatusOr<std::vector<std::string>> FindAll(const std::string& css);
  absl::Status Type(const std::string& element, const std::string& text);
  absl::Status Click(const std::string& element);
  absl::StatusOr<std::string> Text(const std::string& element);
  // The value a synchronous script returns (`return …;`), with `args` as `arguments`.
  absl::StatusOr<nlohmann::json> Run(const std::string& script, const nlohmann::json& args = nlohmann::json::array());
  // Polls `script` (which returns a boolean) until it returns true or `timeout` passes.
  bool WaitUntil(const std::string& script, absl::Duration timeout);
  // Resizes the window so that the page's viewport is width × height CSS pixels.
  absl::Status SetViewport(int width, int height);
  // The viewport as PNG bytes.
  absl::StatusOr<std::string> Screenshot();
  absl::Status DeleteCookies();

 private:
  WebDriver() = default;
  absl::StatusOr<nlohmann::json> Command(const std::string& method, const std::string& path,
                                         const nlohmann::json& body = nullptr);

  TempDir dir_;  // the browser profile and chromedriver's log
  std::unique_ptr<Subprocess> driver_;
  std::string base_;     // http://127.0.0.1:PORT/
  std::string session_;  // the session's id
};

}  // namespace dt::testing
