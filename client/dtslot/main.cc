// dtslot: runs one rank's program and owns its whole process tree (client/dtslot/slot_keeper.h).
// dt starts it; a person has no reason to.
//
//   dtslot [--grace SECONDS] [--times FILE] [--status-fd FD] -- PROGRAM ARGS...

#include <fcntl.h>
#include <sys/resource.h>

#include <iostream>

#include <CLI/CLI.hpp>

#include "client/dtslot/slot_keeper.h"
#include "common/cli_checks.h"
#include "common/log.h"
#include "common/stop_signals.h"
#include "common/version.h"

int main(int argc, char** argv) {
  dt::SetLogProgram("dtslot");
  CLI::App app{
      "dtslot: runs one rank's program and owns every process it starts. A stop (SIGTERM, SIGINT, SIGHUP,\n"
      "SIGQUIT, or the death of whoever started dtslot) sends SIGTERM to the whole tree and SIGKILL after the\n"
      "grace; processes the program leaves behind when it ends are stopped the same way. Ends as the program\n"
      "did. Started by dtrun and the local launcher."};
  app.set_version_flag("--version", std::string(dt::kVersion));
  dt::slot::SlotOptions options;
  double grace_s = 10;
  app.add_option("--grace", grace_s, "seconds between SIGTERM and SIGKILL")->capture_default_str();
  app.add_option("--times", options.times_file,
                 "copy the program's output to stdout through a pipe, recording when each chunk came in this file");
  app.add_option("--status-fd", options.status_fd,
                 "an inherited descriptor: the program's wait status is written to it the moment the program ends");
  app.add_option("command", options.command, "the program and its arguments, after --")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return dt::ExitOnParseError(app, e, "dtslot", 2);
  }
  if (grace_s < 0) {
    std::cerr << "dtslot: --grace must not be negative\n";
    return 2;
  }
  if (options.status_fd >= 0 && (options.status_fd <= 2 || ::fcntl(options.status_fd, F_GETFD) < 0)) {
    std::cerr << "dtslot: --status-fd " << options.status_fd
              << " is not an open descriptor other than stdin, stdout or stderr; pass one this process inherited\n";
    return 2;
  }
  options.grace = absl::Seconds(grace_s);
  int code = dt::slot::RunSlot(options);
  if (code < 0) {
    // End as the program did; a core dump is the program's to write, not dtslot's.
    struct rlimit none = {0, 0};
    ::setrlimit(RLIMIT_CORE, &none);
    dt::DieBySignal(-code);
  }
  return code;
}
