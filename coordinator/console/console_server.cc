#include "coordinator/console/console_server.h"

#include <arpa/inet.h>

#include <CivetServer.h>
#include <civetweb.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/names.h"
#include "coordinator/console/console_assets.h"

namespace dt {
namespace {

constexpr char kCookie[] = "dt_console";
constexpr size_t kMaxLoginBody = 4096;
constexpr absl::Duration kSessionTtl = absl::Hours(12);
// The pages load nothing from elsewhere (the machines have no internet, and a token-holding page
// should not): scripts, styles and requests only from this origin.
constexpr char kSecurityHeaders[] =
    "Cache-Control: no-store\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "X-Frame-Options: DENY\r\n"
    // same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with this
    // console's own sign-in form, which then cannot be told from another site's.
    "Referrer-Policy: same-origin\r\n"
    "Content-Security-Policy: default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'\r\n";

struct Reply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::string> headers;  // "Name: value"
};

void Send(mg_connection* conn, const Reply& r) {
  std::string head = absl::StrCat("HTTP/1.1 ", r.status, " ", mg_get_response_code_text(conn, r.status), "\r\n",
                                  "Content-Type: ", r.content_type, "\r\n", "Content-Length: ", r.body.size(), "\r\n",
                                  kSecurityHeaders);
  for (const auto& h : r.headers) absl::StrAppend(&head, h, "\r\n");
  absl::StrAppend(&head, "Connection: close\r\n\r\n");
  mg_write(conn, head.data(), head.size());
  if (!r.body.empty()) mg_write(conn, r.body.data(), r.body.size());
}

Reply Redirect(const std::string& to, std::vector<std::string> headers = {}) {
  Reply r;
  r.status = 303;
  r.headers = std::move(headers);
  r.headers.push_back("Location: " + to);
  return r;
}

std::string HtmlEscape(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&#39;"}});
}

std::string AssetText(absl::string_view name) {
  const ConsoleAsset* a = FindConsoleAsset(name);
  return a == nullptr ? "" : std::string(reinterpret_cast<const char*>(a->data), a->size);
}

// The sign-in page, with `error` (escaped) shown above the form.
Reply LoginPage(int status, const std::string& error) {
  Reply r;
  r.status = status;
  r.content_type = "text/html; charset=utf-8";
  std::string notice =
      error.empty() ? "" : absl::StrCat("<p class=\"error\" role=\"alert\">", HtmlEscape(error), "</p>");
  r.body = absl::StrReplaceAll(AssetText("login.html"), {{"<!--error-->", notice}});
  return r;
}

// host and port of "HOST:PORT" / "[V6]:PORT".
absl::Status SplitListen(const std::string& listen, std::string& host, int& port) {
  if (absl::Status s = ValidateHostPort("--http-listen", listen, /*port_zero_ok=*/true); !s.ok()) return s;
  size_t colon = listen.rfind(':');
  host = listen.substr(0, colon);
  port = std::stoi(listen.substr(colon + 1));
  return absl::OkStatus();
}

}  // namespace

bool IsLoopbackHost(const std::string& host_in) {
  std::string host(absl::StripSuffix(absl::StripPrefix(host_in, "["), "]"));
  if (host == "localhost") return true;
  in_addr v4;
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

absl::Status ValidateConsoleListen(const std::string& listen) {
  std::string host;
  int port = 0;
  if (absl::Status s = SplitListen(listen, host, port); !s.ok()) return s;
  if (!IsLoopbackHost(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http-listen ", listen,
        " is not a loopback address: the console takes tokens and serves plain HTTP, so it listens on this "
        "machine only (e.g. 127.0.0.1:8080); from elsewhere use an SSH tunnel: ssh -L 8080:127.0.0.1:8080 <this "
        "host>"));
  }
  return absl::OkStatus();
}

class ConsoleServer::Handler : public CivetHandler {
 public:
  Handler(ConsoleServer* server, const Authenticator* auth) : server_(server), auth_(auth) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    Send(conn, Get(conn));
    return true;
  }
  bool handlePost(CivetServer*, mg_connection* conn) override {
    Send(conn, Post(conn));
    return true;
  }

 private:
  static std::string Path(mg_connection* conn) {
    const mg_request_info* info = mg_get_request_info(conn);
    return info->local_uri != nullptr ? info->local_uri : "/";
  }

  // The session behind the request's cookie, if it is live.
  std::optional<Principal> Session(mg_connection* conn) const {
    std::string id;
    if (CivetServer::getCookie(conn, kCookie, id) < 0 || id.empty()) return std::nullopt;
    return server_->sessions_->Find(id, absl::Now());
  }

  // Who asks: `Authorization: Bearer <token>` (scripts), else the session cookie (the page).
  absl::StatusOr<Principal> Caller(mg_connection* conn) const {
    if (const char* h = CivetServer::getHeader(conn, "Authorization"); h != nullptr) {
      absl::string_view value(h);
      if (!absl::StartsWithIgnoreCase(value, "bearer ")) {
        return absl::UnauthenticatedError("the Authorization header must be 'Bearer <token>'");
      }
      return auth_->AuthenticateToken(value.substr(7));
    }
    if (std::optional<Principal> who = Session(conn)) return *who;
    return absl::UnauthenticatedError(
        "sign in at /login with the admin token or a run token, or send 'Authorization: Bearer <token>'");
  }

  Reply Get(mg_connection* conn) const {
    std::string path = Path(conn);
    if (absl::StartsWith(path, "/api/")) return Api(conn, path);
    if (absl::StartsWith(path, "/static/")) {
      const ConsoleAsset* a = FindConsoleAsset(path.substr(8));
      if (a == nullptr) return Reply{404, "text/plain; charset=utf-8", "not found\n", {}};
      return Reply{200, a->content_type, std::string(reinterpret_cast<const char*>(a->data), a->size), {}};
    }
    if (path == "/login") return Session(conn) ? Redirect("/") : LoginPage(200, "");
    if (path == "/" || path == "/index.html") {
      // Without a session nothing but the sign-in form is served.
      if (!Session(conn)) return Redirect("/login");
      return Reply{200, "text/html; charset=utf-8", AssetText("index.html"), {}};
    }
    return Reply{404, "text/plain; charset=utf-8", "not found\n", {}};
  }

  Reply Post(mg_connection* conn) const {
    std::string path = Path(conn);
    if (path == "/login") return Login(conn);
    if (path == "/logout") {
      std::string id;
      if (CivetServer::getCookie(conn, kCookie, id) >= 0 && !id.empty()) server_->sessions_->Remove(id);
      return Redirect("/login",
                      {absl::StrCat("Set-Cookie: ", kCookie, "=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")});
    }
    Reply r = ToReply(ConsoleApi::Error(absl::UnimplementedError(absl::StrCat("POST ", path, ": not served here"))));
    r.headers.push_back("Allow: GET");
    return r;
  }

  // A sign-in form posted from another site (login CSRF: the browser would end up signed in as
  // whoever the other site chose) is refused. A browser that sends Sec-Fetch-Site says where the
  // form came from, and only this console's own page ("same-origin") is let in; an older browser
  // names the page's origin in Origin, which must be this console. A request with neither is not
  // a browser's cross-site form (curl, a script).
  static bool CrossSite(mg_connection* conn) {
    const char* fetch_site = CivetServer::getHeader(conn, "Sec-Fetch-Site");
    if (fetch_site != nullptr) return std::string(fetch_site) != "same-origin";
    const char* origin = CivetServer::getHeader(conn, "Origin");
    if (origin == nullptr) return false;
    const char* host = CivetServer::getHeader(conn, "Host");
    return host == nullptr || std::string(origin) != absl::StrCat("http://", host);
  }

  Reply Login(mg_connection* conn) const {
    if (CrossSite(conn)) {
      return LoginPage(403, "Sign in from this console's own page: a sign-in sent from another site is refused.");
    }
    if (absl::Status s = server_->sessions_->MayTry(absl::Now()); !s.ok()) {
      Reply r = LoginPage(429, absl::StrCat("Too many failed sign-ins: ", s.message(), "."));
      r.headers.push_back("Retry-After: 60");
      return r;
    }
    const mg_request_info* info = mg_get_request_info(conn);
    if (info->content_length < 0 || static_cast<size_t>(info->content_length) > kMaxLoginBody) {
      return LoginPage(413, "The sign-in request was too large or had no length.");
    }
    std::string body = CivetServer::getPostData(conn);
    std::string token;
    if (!CivetServer::getParam(body, "token", token) || absl::StripAsciiWhitespace(token).empty()) {
      return LoginPage(400, "Enter a token: the admin token (admin.token in dtcoord's state dir) or a run token.");
    }
    absl::StatusOr<Principal> who = auth_->AuthenticateToken(token);
    if (!who.ok()) {
      server_->sessions_->Failed(absl::Now());
      return LoginPage(401, "That token is not one this coordinator knows: use the admin token or a run's token.");
    }
    absl::StatusOr<std::string> id = server_->sessions_->Create(*who, absl::Now());
    if (!id.ok()) {
      Reply r = LoginPage(429, absl::StrCat("Not signed in: ", id.status().message(), "."));
      r.headers.push_back("Retry-After: 60");
      return r;
    }
    return Redirect("/", {absl::StrCat("Set-Cookie: ", kCookie, "=", *id, "; Path=/; Max-Age=",
                                       absl::ToInt64Seconds(kSessionTtl), "; HttpOnly; SameSite=Strict")});
  }

  static Reply ToReply(const ConsoleResponse& r) { return Reply{r.status, r.content_type, r.body, {}}; }

  Reply Api(mg_connection* conn, const std::string& path) const {
    absl::StatusOr<Principal> who = Caller(conn);
    if (!who.ok()) return ToReply(ConsoleApi::Error(who.status()));
    ConsoleRequest request;
    request.method = mg_get_request_info(conn)->request_method;
    request.path = path;
    if (absl::Status s = ParseQuery(conn, request.params); !s.ok()) return ToReply(ConsoleApi::Error(s));
    return ToReply(server_->api_->Handle(*who, request));
  }

  static absl::Status ParseQuery(mg_connection* conn, std::map<std::string, std::string>& params) {
    const char* query = mg_get_request_info(conn)->query_string;
    if (query == nullptr || *query == '\0') return absl::OkStatus();
    std::string copy(query);  // split in place
    mg_header fields[64];
    int n = mg_split_form_urlencoded(copy.data(), fields, 64);
    if (n < 0 || n >= 64) return absl::InvalidArgumentError("the query string is malformed or has too many parameters");
    for (int i = 0; i < n; ++i) {
      std::string key = fields[i].name != nullptr ? fields[i].name : "";
      if (!params.emplace(key, fields[i].value != nullptr ? fields[i].value : "").second) {
        return absl::InvalidArgumentError(absl::StrCat("parameter ", key, " is given twice"));
      }
    }
    return absl::OkStatus();
  }

  ConsoleServer* server_;
  const Authenticator* auth_;
};

absl::StatusOr<std::unique_ptr<ConsoleServer>> ConsoleServer::Start(const ConsoleOptions& options,
                                                                    Coordinator* coordinator, const Authenticator* auth,
                                                                    WandbRunsOf wandb_runs) {
  if (absl::Status s = ValidateConsoleListen(options.listen); !s.ok()) return s;
  std::string host;
  int port = 0;
  if (absl::Status s = SplitListen(options.listen, host, port); !s.ok()) return s;
  std::unique_ptr<ConsoleServer> s(new ConsoleServer());
  s->api_ = std::make_unique<ConsoleApi>(coordinator, std::move(wandb_runs));
  ConsoleSessionLimits limits;
  limits.ttl = kSessionTtl;
  s->sessions_ = std::make_unique<ConsoleSessions>(limits);
  s->handler_ = std::make_unique<Handler>(s.get(), auth);
  std::vector<std::string> opts = {"listening_ports",    options.listen, "num_threads", absl::StrCat(options.threads),
                                   "request_timeout_ms", "10000"};
  try {
    s->server_ = std::make_unique<CivetServer>(opts);
  } catch (const std::exception&) {
    // CivetWeb's own text ("null context when constructing CivetServer") says nothing more.
    return absl::UnavailableError(absl::StrCat("cannot serve the console on ", options.listen,
                                               ": the port is in use or the address is not this host's; choose "
                                               "another --http-listen (port 0: any free one)"));
  }
  s->server_->addHandler("/", s->handler_.get());
  std::vector<int> ports = s->server_->getListeningPorts();
  s->address_ = absl::StrCat(host, ":", ports.empty() ? port : ports.front());
  return s;
}

std::string ConsoleServer::url() const { return absl::StrCat("http://", address_, "/"); }

void ConsoleServer::Stop() {
  if (server_) server_->close();
}

ConsoleServer::~ConsoleServer() { Stop(); }

}  // namespace dt
