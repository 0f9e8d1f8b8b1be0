// Plain HTTP requests for tests (libcurl): the status, the headers and the body as they came,
// redirects not followed, so a test sees exactly what a browser would be told.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dt::testing {

struct HttpResponse {
  int status = 0;     // 0: no response (see error)
  std::string error;  // libcurl's message when status is 0
  std::string body;
  std::multimap<std::string, std::string> headers;  // names lower-cased
  // The first value of header `name` (lower-case), or "".
  std::string Header(const std::string& name) const;
};

// `headers` are "Name: value" lines.
HttpResponse Http(const std::string& method, const std::string& url, const std::vector<std::string>& headers = {},
                  const std::string& body = "", absl::Duration timeout = absl::Seconds(30));

}  // namespace dt::testing
