// torchrun's --nproc-per-node values as dtctl and dtrun read and count them.
#include "common/procs_per_node.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>

#include "tests/test_util.h"

namespace dt {
namespace {

// A /dev with `gpus` NVIDIA GPUs beside the control devices that are not GPUs.
std::string FakeDev(const testing::TempDir& tmp, int gpus) {
  std::string dev = tmp.Sub("dev");
  for (const char* other : {"nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"}) std::ofstream(dev + "/" + other);
  for (int i = 0; i < gpus; ++i) std::ofstream(dev + "/nvidia" + std::to_string(i));
  return dev;
}

TEST(ProcsPerNodeTest, ParsesACountOrARuleAndRefusesTheRestNamingTheChoices) {
  EXPECT_EQ(ParseProcsPerNode("4")->count, 4);
  EXPECT_EQ(ParseProcsPerNode("4")->rule, "");
  for (const char* rule : {"gpu", "cpu", "auto"}) {
    absl::StatusOr<ProcsPerNode> p = ParseProcsPerNode(rule);
    ASSERT_TRUE(p.ok()) << rule;
    EXPECT_EQ(p->rule, rule);
    EXPECT_EQ(p->count, 0);
  }
  for (const char* bad : {"0", "-1", "131073", "GPU", "xpu", "", "4x"}) {
    absl::StatusOr<ProcsPerNode> p = ParseProcsPerNode(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("--nproc-per-node"), std::string::npos);
    EXPECT_NE(p.status().message().find("gpu (one per visible GPU)"), std::string::npos) << p.status();
  }
}

TEST(ProcsPerNodeTest, CountsTheGpusCudaWouldShow) {
  testing::TempDir tmp;
  std::string dev = FakeDev(tmp, 4);
  EXPECT_EQ(ProbeNodeDevices(dev, std::nullopt).gpus, 4);
  EXPECT_EQ(ProbeNodeDevices(dev, "0,2").gpus, 2);
  EXPECT_EQ(ProbeNodeDevices(dev, "").gpus, 0);       // hides every GPU
  EXPECT_EQ(ProbeNodeDevices(dev, "-1").gpus, 0);     // the same, as people write it
  EXPECT_EQ(ProbeNodeDevices(dev, "1,7,2").gpus, 1);  // CUDA stops at the first that is not a device
  EXPECT_EQ(ProbeNodeDevices(dev, "GPU-5c3d,MIG-a1b2").gpus, 2);
  EXPECT_EQ(ProbeNodeDevices(dev, "0,1,2,3,0,1").gpus, 4);  // never more than there are
  testing::TempDir other;
  EXPECT_EQ(ProbeNodeDevices(FakeDev(other, 0), "0,1").gpus, 0);
  EXPECT_EQ(ProbeNodeDevices(tmp.Sub("no-such-dev"), std::nullopt).gpus, 0);
}

TEST(ProcsPerNodeTest, CountsTheCpusThisProcessMayRunOn) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(ProbeThisNode().cpus, CPU_COUNT(&set));
}

TEST(ProcsPerNodeTest, ResolvesEachRuleAndSaysWhyGpuFindsNone) {
  NodeDevices gpus{8, 64, "8 /dev/nvidia<N> devices"};
  NodeDevices none{0, 16, "no /dev/nvidia<N> device"};
  EXPECT_EQ(*ResolveProcsPerNode({3, ""}, none, "n1"), 3);
  EXPECT_EQ(*ResolveProcsPerNode({0, "gpu"}, gpus, "n1"), 8);
  EXPECT_EQ(*ResolveProcsPerNode({0, "cpu"}, gpus, "n1"), 64);
  EXPECT_EQ(*ResolveProcsPerNode({0, "auto"}, gpus, "n1"), 8);
  EXPECT_EQ(*ResolveProcsPerNode({0, "auto"}, none, "n1"), 16);
  absl::StatusOr<int> refused = ResolveProcsPerNode({0, "gpu"}, none, "n1");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  for (const char* part : {"--nproc-per-node gpu", "\"n1\"", "no /dev/nvidia<N> device", "give a count, cpu or auto"}) {
    EXPECT_NE(refused.status().message().find(part), std::string::npos) << refused.status();
  }
}

}  // namespace
}  // namespace dt
