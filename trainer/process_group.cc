#include "trainer/process_group.h"

#include <unistd.h>

#include <cstdlib>

#include <torch/torch.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dt {

std::string DescribeBackends() {
  std::string out = absl::StrCat("LibTorch ", TORCH_VERSION, ", backends gloo");
#ifdef USE_C10D_NCCL
  size_t devices = torch::cuda::device_count();
  absl::StrAppend(&out, " nccl (", devices, devices == 1 ? " CUDA device)" : " CUDA devices)");
#endif
  return out;
}

absl::StatusOr<std::string> ResolveBackend(const std::string& requested) {
  bool cuda = torch::cuda::is_available();
  if (requested.empty()) return std::string(cuda ? "nccl" : "gloo");
  if (requested == "gloo") return requested;
  if (requested == "nccl") {
#ifdef USE_C10D_NCCL
    if (!cuda) return absl::FailedPreconditionError("--backend nccl needs a CUDA device; none is visible");
    return requested;
#else
    return absl::FailedPreconditionError(
        "--backend nccl: this dttrainer was built against a LibTorch without NCCL (CPU build); "
        "use --backend gloo or the CUDA build (docker/trainer-cuda.Dockerfile)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("--backend \"", requested, "\" is not gloo or nccl"));
}

absl::StatusOr<c10::intrusive_ptr<CommGroup>> CreateProcessGroup(const std::string& backend,
                                                                 const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                                 int world_size, int local_rank,
                                                                 std::chrono::milliseconds timeout) {
  try {
    if (backend == "gloo") {
      auto options = c10d::ProcessGroupGloo::Options::create(timeout);
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      if (ifname != nullptr && *ifname != '\0') {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      } else {
        char host[256] = {0};
        ::gethostname(host, sizeof(host) - 1);
        try {
          options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
        } catch (const std::exception& e) {
          DT_LOG(Warning) << "Gloo cannot use host name " << host << " (" << e.what()
                          << "); using its default device. Set GLOO_SOCKET_IFNAME to choose.";
          options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
        }
      }
      options->threads = 2;
      return c10::intrusive_ptr<CommGroup>(
          c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options));
    }
#ifdef USE_C10D_NCCL
    if (backend == "nccl") {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      c10::cuda::set_device(local_rank);
      return c10::intrusive_ptr<CommGroup>(
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options));
    }
#endif
    (void)local_rank;
    return absl::InvalidArgumentError(absl::StrCat("unsupported backend ", backend));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot build the ", backend, " process group (rank ", rank, " of ", world_size, "): ", e.what()));
  }
}

void CloseProcessGroup(CommGroup& group, bool clean) {
#ifdef USE_C10D_NCCL
  auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(&group);
  if (nccl == nullptr) return;
  try {
    if (clean) {
      nccl->shutdown();
      DT_LOG(Info) << "NCCL process group shut down";
    } else {
      nccl->abort();
      DT_LOG(Info) << "NCCL process group aborted";
    }
  } catch (const std::exception& e) {
    DT_LOG(Warning) << "closing the NCCL process group: " << e.what();
  }
#else
  (void)group;
  (void)clean;
#endif
}

}  // namespace dt
