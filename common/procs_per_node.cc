#include "common/procs_per_node.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/limits.h"
#include "common/names.h"

namespace dt {
namespace {

// /dev/nvidia0, /dev/nvidia1, ...: one per GPU (nvidiactl, nvidia-uvm and the like are not GPUs).
int CountGpuDevices(const std::string& dev_dir) {
  DIR* dir = ::opendir(dev_dir.c_str());
  if (dir == nullptr) return 0;
  int count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    absl::string_view name = entry->d_name;
    if (absl::ConsumePrefix(&name, "nvidia") && !name.empty() &&
        std::all_of(name.begin(), name.end(), [](char c) { return absl::ascii_isdigit(c); })) {
      ++count;
    }
  }
  ::closedir(dir);
  return count;
}

// CUDA reads the list up to its first entry that names no device and ignores the rest.
int CountVisible(const std::string& list, int devices) {
  int visible = 0;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int index = -1;
    if (absl::StartsWith(entry, "GPU-") || absl::StartsWith(entry, "MIG-")) {
      if (devices == 0) break;
    } else if (!absl::SimpleAtoi(entry, &index) || index < 0 || index >= devices) {
      break;
    }
    ++visible;
  }
  return std::min(visible, devices);
}

int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

}  // namespace

absl::Status ValidateProcsPerNodeRule(absl::string_view rule) {
  if (rule.empty()) return absl::OkStatus();
  for (absl::string_view known : kProcsPerNodeRules) {
    if (rule == known) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("processes per node rule ", Quote(rule), " is not one of gpu, cpu or auto"));
}

absl::StatusOr<ProcsPerNode> ParseProcsPerNode(absl::string_view text, absl::string_view flag) {
  ProcsPerNode out;
  if (ValidateProcsPerNodeRule(text).ok() && !text.empty()) {
    out.rule = std::string(text);
    return out;
  }
  if (!absl::SimpleAtoi(text, &out.count) || out.count < 1 || out.count > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(flag, flag.empty() ? "" : " ", Quote(text),
                                                   " is not a count within 1..", kMaxWorldSize,
                                                   ", gpu (one per visible GPU), cpu (one per usable CPU) or auto "
                                                   "(gpu where the node has GPUs, else cpu)"));
  }
  return out;
}

NodeDevices ProbeNodeDevices(const std::string& dev_dir, const std::optional<std::string>& cuda_visible_devices) {
  NodeDevices out;
  int devices = CountGpuDevices(dev_dir);
  out.gpus = cuda_visible_devices ? CountVisible(*cuda_visible_devices, devices) : devices;
  out.gpu_evidence = devices == 0 ? absl::StrCat("no ", dev_dir, "/nvidia<N> device")
                                  : absl::StrCat(devices, " ", dev_dir, "/nvidia<N> device", devices == 1 ? "" : "s");
  if (cuda_visible_devices) {
    absl::StrAppend(&out.gpu_evidence, ", CUDA_VISIBLE_DEVICES=", Quote(*cuda_visible_devices));
  }
  out.cpus = AffinityCpus();
  return out;
}

NodeDevices ProbeThisNode() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return ProbeNodeDevices("/dev", visible != nullptr ? std::optional<std::string>(visible) : std::nullopt);
}

absl::StatusOr<int> ResolveProcsPerNode(const ProcsPerNode& value, const NodeDevices& devices, absl::string_view node) {
  if (value.rule.empty()) return value.count;
  if (value.rule == "cpu") return devices.cpus;
  if (value.rule == "auto") return devices.gpus > 0 ? devices.gpus : devices.cpus;
  if (value.rule == "gpu") {
    if (devices.gpus > 0) return devices.gpus;
    return absl::FailedPreconditionError(absl::StrCat(
        "--nproc-per-node gpu: node ", Quote(node), " has no GPU its processes can see (", devices.gpu_evidence,
        "); run on GPU nodes (Slurm: --sbatch-arg=--gpus-per-node=N), or give a count, cpu or auto"));
  }
  return ValidateProcsPerNodeRule(value.rule);
}

}  // namespace dt
