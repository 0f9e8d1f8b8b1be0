// The coordinator's limits. Every RPC checks its input against these and names the limit in the
// error it returns.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"

namespace dt {

inline constexpr size_t kMaxKeyBytes = 512;
inline constexpr size_t kMaxValueBytes = 4 << 20;  // 4 MiB
inline constexpr int64_t kMaxKeysPerRun = 100'000;
inline constexpr int kMaxStoreBatchOps = 1024;  // operations in one StoreBatchRequest
// Store bytes (keys plus values): c10d keeps addresses, counters and NCCL ids there, kilobytes
// per rank; these leave room for 65,536 ranks (a larger run gives its store more with --store-bytes-per-run) and bound
// what one token can make dtcoord hold.
inline constexpr int64_t kDefaultStoreBytesPerRun = int64_t{256} << 20;  // 256 MiB
// Metric batches of one run accepted and not yet stored and delivered (the coordinator holds them
// in memory meanwhile): a run that sends faster than its disk stores is told to send again later.
inline constexpr int64_t kDefaultMetricBytesPerRun = int64_t{64} << 20;
inline constexpr int64_t kDefaultStoreBytesTotal = int64_t{2} << 30;  // 2 GiB
inline constexpr size_t kMaxMetricBatchBytes = 1 << 20;               // 1 MiB
// Batches one metric stream may have accepted and not yet stored, and their bytes (one batch is
// always let in): a stream that waited for each batch's storage before reading the next went at
// the speed of the hand-off between threads. 64 ranks' streams hold at most 16 MiB.
inline constexpr int kMetricBatchesInFlightPerStream = 8;
inline constexpr int64_t kMetricBytesInFlightPerStream = 256 << 10;
// One QueryMetrics page (a record is ~40 bytes on the wire: ~4 MB, well inside a gRPC message).
inline constexpr int32_t kMaxMetricRecordsPerQuery = 100'000;
// Ranks of one run. 98,304 (12,288 nodes x 8) is benchmarked (bench_scale's node rows).
inline constexpr int64_t kMaxWorldSize = 131'072;
// Ranks of every run not yet ended together (dtcoord --max-ranks): past it a submission is
// RESOURCE_EXHAUSTED, so a storm of them cannot take the coordinator from the runs it serves.
inline constexpr int64_t kDefaultMaxRanks = 131'072;
inline constexpr size_t kMaxNameChars = 128;  // experiment, barrier, node names
inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr size_t kMaxMessageBytes = 64 << 10;  // error messages and stacks
inline constexpr size_t kMaxTrainerArgs = 1024;
inline constexpr size_t kMaxCheckpointFiles = 4096;           // one writer's manifest (in a sharded round, one rank's)
inline constexpr size_t kMaxShardedCheckpointFiles = 65536;   // every rank's files of a sharded round
inline constexpr size_t kMaxCheckpointLayoutBytes = 1 << 20;  // a checkpoint's layout document
inline constexpr int kMaxCheckpointLayoutDepth = 64;          // its nesting of arrays and objects
// --exec runs: how long a rank may be idle (no output, no CPU, no step) before it is hung, unless
// the run says otherwise (RunSpec.idle_timeout_ms), and the most a run may say.
inline constexpr absl::Duration kDefaultIdleTimeout = absl::Minutes(20);
inline constexpr absl::Duration kMaxIdleTimeout = absl::Hours(24 * 7);
// Stack captures: processes and bytes one rank's answer may hold.
inline constexpr int kMaxCaptureProcesses = 4096;
inline constexpr size_t kMaxCaptureBytes = 4 << 20;
// A run's labels (SubmitRun): how many, and how long a value may be (names are labels: 128 chars).
inline constexpr size_t kMaxBarrierNames = 16'384;  // distinct barrier names in one generation
inline constexpr int kMaxLabels = 64;
inline constexpr size_t kMaxLabelValueBytes = 1024;
// One page of ListRuns: its runs' encoded size, so no answer outgrows a gRPC message.
inline constexpr size_t kMaxListRunsPageBytes = 4 << 20;
// A wait a caller asks for (store calls, barriers, checkpoint rounds): a week; beyond it, surely a
// mistake (0 asks for the run's default).
inline constexpr int64_t kMaxWaitMs = int64_t{7} * 24 * 3600 * 1000;
// Other ranks of its node one barrier arrival may carry (a node's relay).
inline constexpr size_t kMaxRelayedRanks = 256;
// Ranks one node agent's call may speak for (RegisterNode's slots, NodeHeartbeat's ranks).
inline constexpr int kMaxRanksPerNodeCall = 1024;
// Nodes a run may exclude (ExcludeNodes, and failures that exclude nodes), and per call.
inline constexpr int kMaxExcludedNodes = 1024;
inline constexpr int kMaxExcludeNodesPerCall = 64;
inline constexpr size_t kMaxNodeEvidenceBytes = 4096;  // why a node is excluded
// A device pre-flight's report: its timings, and the matmul size it ran.
inline constexpr absl::Duration kMaxPreflightTime = absl::Hours(24);
inline constexpr int64_t kMaxPreflightMatmulSize = 1 << 20;
// A run's policy counts (RunSpec): requeues, restarts, identical hangs, checkpoints kept.
inline constexpr int kMaxPolicyCount = 1000;
// Stack captures one GetStacks answer lists at the most.
inline constexpr int kMaxStackCapturesPerQuery = 1000;
// The highest signal number a rank may report (Linux's, the real-time signals included).
inline constexpr int kMaxSignal = 64;
// A run's run.json, read back from its experiment directory.
inline constexpr size_t kMaxRunJsonBytes = 4 << 20;
// gRPC messages carry a value of up to kMaxValueBytes plus framing.
inline constexpr int kMaxGrpcMessageBytes = 16 << 20;

}  // namespace dt
