// The web console's JSON API, served by dtcoord under /api/v1/ (console_server.h carries it over
// HTTP). The shapes are dtctl's (common/run_json.h); a caller acts with the permissions its token
// has on the gRPC API: the admin sees every run, a run token only its own run.
//
//   GET /api/v1/whoami                       {"admin": bool, "run_id": "..."}
//   GET /api/v1/runs?state=S1,S2&limit=N     {"runs": [run...]} (admin: all; run token: its run)
//   GET /api/v1/runs/RUN                     run, with "wandb": [{...,"url"}] and "rank_step_time"
//   GET /api/v1/runs/RUN/checkpoints         {"checkpoints": [...]}
//   GET /api/v1/runs/RUN/metrics?name=&rank=&from_step=&limit=&after_step=&after_rank=&after_name=
//                                            {"records": [...], "next": {step,rank,name} | null}
//   GET /api/v1/runs/RUN/series?from_step=&max_points=
//                                            {"series": {name: {rank: [[step, value]...]}},
//                                             "complete": bool, "next_from_step": S}
//   GET /api/v1/runs/RUN/logs/RANK?bytes=N   {"rank","file","size","truncated","text"}
//   GET /api/v1/runs/RUN/logs/all?bytes=N&fold=1
//                                            the same for every rank (the first 64) in one stream
//                                            in time order, "[rank R] " before each line
//                                            (common/log_lines.h); fold=1 shows a line every rank
//                                            printed alike once, naming the ranks
//
// Errors: {"error": "<what was wrong>", "code": "<gRPC code name>"} with HTTP 400 (bad argument),
// 401 (no or unknown token), 403 (another run's token), 404 (no such run, rank or route), 405
// (not GET), 409 (the experiment directory was moved away), 500 otherwise.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/dir_fd.h"
#include "coordinator/coordinator.h"
#include "coordinator/wandb/forwarder.h"

namespace dt {

struct ConsoleRequest {
  std::string method = "GET";
  std::string path;                           // "/api/v1/runs/r-…/series", URL-decoded
  std::map<std::string, std::string> params;  // the query string's, decoded
};

struct ConsoleResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// The W&B runs of a dt run (the forwarder's; none without one).
using WandbRunsOf = std::function<std::vector<wandb::WandbRunInfo>(const std::string& run_id)>;

class ConsoleApi {
 public:
  ConsoleApi(Coordinator* coordinator, WandbRunsOf wandb_runs);

  // Answers one request made with `who`'s permissions.
  ConsoleResponse Handle(const Principal& who, const ConsoleRequest& request) const;

  // The HTTP status for a gRPC-style code (UNAUTHENTICATED → 401, …).
  static int HttpStatus(absl::StatusCode code);
  // {"error","code"} with the matching HTTP status.
  static ConsoleResponse Error(const absl::Status& status);

  // The web page of a W&B run: https://wandb.ai/ENTITY/PROJECT/runs/ID for W&B's cloud (the API at
  // api.wandb.ai), the same path on a self-hosted server; "" while the entity is unknown.
  static std::string WandbRunUrl(const wandb::WandbRunInfo& run);

 private:
  absl::StatusOr<nlohmann::json> Route(const Principal& who, const ConsoleRequest& request) const;
  absl::StatusOr<nlohmann::json> Runs(const Principal& who, const ConsoleRequest& request) const;
  absl::StatusOr<nlohmann::json> Run(const std::string& run_id) const;
  absl::StatusOr<nlohmann::json> Checkpoints(const std::string& run_id) const;
  absl::StatusOr<nlohmann::json> Metrics(const std::string& run_id, const ConsoleRequest& request) const;
  absl::StatusOr<nlohmann::json> Series(const std::string& run_id, const ConsoleRequest& request) const;
  absl::StatusOr<nlohmann::json> LogTail(const std::string& run_id, const std::string& rank,
                                         const ConsoleRequest& request) const;
  absl::StatusOr<nlohmann::json> AllLogsTail(const v1::Run& run, const DirFd& logs, size_t bytes, bool fold) const;
  // The newest step_time_s each rank of the current generation reported: {rank: {step, seconds}}.
  nlohmann::json RankStepTimes(const v1::Run& run) const;

  Coordinator* coordinator_;
  WandbRunsOf wandb_runs_;
};

}  // namespace dt
