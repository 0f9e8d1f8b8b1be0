// HTTP to Weights & Biases through libcurl: JSON POSTs with Basic auth ("api:<key>"), a timeout,
// and the Retry-After header kept for backoff.
#pragma once

#include <string>

#include "absl/time/time.h"

namespace dt::wandb {

struct HttpResult {
  int code = 0;              // HTTP status; 0 when no response arrived
  std::string body;
  std::string error;         // libcurl's message when code == 0
  absl::Duration retry_after = absl::ZeroDuration();  // from Retry-After, when given
};

class HttpClient {
 public:
  HttpClient(std::string api_key, absl::Duration timeout);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  HttpResult PostJson(const std::string& url, const std::string& body);

 private:
  std::string auth_header_;
  absl::Duration timeout_;
  void* curl_;  // CURL*, reused for keep-alive
};

// Whether a response should be retried with the identical body: 429, 5xx, no response.
bool Retryable(const HttpResult& r);

}  // namespace dt::wandb
