// HTTP to Weights & Biases through libcurl: JSON POSTs with Basic auth ("api:<key>"), a timeout,
// and the Retry-After header kept for backoff.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"

namespace dt::wandb {

struct HttpResult {
  int code = 0;  // HTTP status; 0 when no response arrived
  std::string body;
  std::string error;                                  // libcurl's message when code == 0
  absl::Duration retry_after = absl::ZeroDuration();  // from Retry-After, when given
};

// Posts a JSON body to a URL. The forwarder's retry, backoff and idempotency logic depends only
// on this, so tests drive it with scripted answers; HttpClient is the real one.
class HttpPoster {
 public:
  virtual ~HttpPoster() = default;
  virtual HttpResult PostJson(const std::string& url, const std::string& body) = 0;
};

class HttpClient : public HttpPoster {
 public:
  HttpClient(std::string api_key, absl::Duration timeout);
  ~HttpClient() override;
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  HttpResult PostJson(const std::string& url, const std::string& body) override;

 private:
  std::string auth_header_;
  absl::Duration timeout_;
  void* curl_;  // CURL*, reused for keep-alive
};

// Makes a poster for one W&B run: Basic auth with `api_key`, and `timeout` per request.
using HttpPosterFactory =
    std::function<std::unique_ptr<HttpPoster>(const std::string& api_key, absl::Duration timeout)>;

// Whether a response should be retried with the identical body: 429, 5xx, no response.
bool Retryable(const HttpResult& r);

}  // namespace dt::wandb
