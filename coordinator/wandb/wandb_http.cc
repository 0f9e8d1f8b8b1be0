#include "coordinator/wandb/wandb_http.h"

#include <curl/curl.h>

#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dt::wandb {
namespace {

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t ReadHeader(char* data, size_t size, size_t n, void* user) {
  absl::string_view line(data, size * n);
  if (absl::StartsWithIgnoreCase(line, "retry-after:")) {
    double seconds = 0;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(12)), &seconds) && seconds > 0) {
      *static_cast<absl::Duration*>(user) = absl::Seconds(seconds);
    }
  }
  return size * n;
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

HttpClient::HttpClient(std::string api_key, absl::Duration timeout)
    : auth_header_(absl::StrCat("Authorization: Basic ", absl::Base64Escape(absl::StrCat("api:", api_key)))),
      timeout_(timeout) {
  InitCurlOnce();
  curl_ = curl_easy_init();
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

HttpResult HttpClient::PostJson(const std::string& url, const std::string& body) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  HttpResult result;
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, auth_header_.c_str());
  headers = curl_slist_append(headers, "User-Agent: dt-coordinator (W&B file_stream client)");
  headers = curl_slist_append(headers, "Expect:");
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &result.body);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, ReadHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &result.retry_after);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeout_)));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10'000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_OK) {
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    result.code = static_cast<int>(code);
  } else {
    result.error = curl_easy_strerror(rc);
  }
  curl_slist_free_all(headers);
  return result;
}

bool Retryable(const HttpResult& r) { return r.code == 0 || r.code == 429 || r.code >= 500; }

}  // namespace dt::wandb
