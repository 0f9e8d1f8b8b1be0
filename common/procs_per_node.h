// torchrun's --nproc-per-node values: a count, or a rule each node resolves for itself — "gpu"
// (the GPUs this node's processes can see), "cpu" (the CPUs they may run on) or "auto" (the GPUs,
// else the CPUs). A rule is resolved where the ranks run: by dtctl for a local run, by each
// node's dtrun on Slurm; the coordinator then holds every node of the run to the first count.
#pragma once

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dt {

inline constexpr const char* kProcsPerNodeRules[] = {"gpu", "cpu", "auto"};

// A count (rule empty) or a rule (count 0).
struct ProcsPerNode {
  int count = 0;
  std::string rule;
};

// "4", "gpu", "cpu" or "auto". INVALID_ARGUMENT naming `flag` (when not empty) and the accepted
// values otherwise.
absl::StatusOr<ProcsPerNode> ParseProcsPerNode(absl::string_view text, absl::string_view flag = "--nproc-per-node");

// OK for "", "gpu", "cpu" and "auto"; INVALID_ARGUMENT naming the value otherwise.
absl::Status ValidateProcsPerNodeRule(absl::string_view rule);

// What a node has, as its processes would see it.
struct NodeDevices {
  int gpus = 0;
  int cpus = 0;
  // How the GPUs were counted ("2 of /dev/nvidia0..3 through CUDA_VISIBLE_DEVICES=0,2"), for messages.
  std::string gpu_evidence;
};

// The NVIDIA GPUs (character devices /dev/nvidiaN under `dev_dir`) this process's children can
// use — all of them, or those CUDA_VISIBLE_DEVICES (`cuda_visible_devices`) lists, read as CUDA
// does (indices up to the first that is not a device; GPU-/MIG- UUIDs taken as given) — and the
// CPUs its affinity mask allows (the job's allocation under Slurm, taskset or a cgroup).
NodeDevices ProbeNodeDevices(const std::string& dev_dir, const std::optional<std::string>& cuda_visible_devices);
// The same for this process: /dev and its environment.
NodeDevices ProbeThisNode();

// The count a rule gives on a node with `devices`. FAILED_PRECONDITION for "gpu" on a node
// without a visible GPU, naming `node` and what was looked at.
absl::StatusOr<int> ResolveProcsPerNode(const ProcsPerNode& value, const NodeDevices& devices, absl::string_view node);

}  // namespace dt
