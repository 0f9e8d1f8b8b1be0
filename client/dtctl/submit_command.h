// `dtctl submit`: its flags (each declared once, a given flag over the run file), the options
// they make, and the command.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/dtctl/command.h"

namespace dt::ctl {

class SubmitFlags;

struct SubmitCli {
  CLI::App* command = nullptr;
  std::unique_ptr<SubmitFlags> flags;
  std::vector<std::string> words;  // after --: trainer arguments, or with --exec the command
  std::string run_file;
  std::vector<std::string> env;  // --env KEY=VALUE, in order
  std::string env_file;
  bool follow = false;
  bool dry_run = false;
  bool exec = false;
  SubmitCli();
  ~SubmitCli();
};

void DeclareSubmit(CLI::App& app, SubmitCli& cli);
int Submit(Global& g, const SubmitCli& cli);

}  // namespace dt::ctl
