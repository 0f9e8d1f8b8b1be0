#!/usr/bin/python3
"""Collects benchmark results (JSON lines) into build/bench/results.json and docs/benchmarks.md.

    report.py RESULTS_JSONL RESULTS_JSON BENCHMARKS_MD MODE

The page is a short header, the table (one row per result, in the order the benchmarks printed
them) and "How measured": one line per group of rows that share a method, from HOW_MEASURED below
(keep it in step with bench/ when a benchmark's method or row names change). Why a figure is what
it is goes in bench/findings.md, which the header links to.

DT_BENCH_MACHINE and DT_BENCH_DATE, when set, replace the machine (from lscpu) and today's date,
DT_BENCH_COMMAND the command named as the table's writer (scripts/gpu-check.sh for the GPU rows):
for writing the page again from an earlier run's results.
"""
import datetime
import json
import os
import platform
import re
import subprocess
import sys

# What each row measures and against what, keyed by a regular expression matched against the
# start of the row's name (the first match wins); rows with the same method share one line.
# (pattern, label, how it is measured)
HOW_MEASURED = [
    (r"machine: wake-up round trip", "machine: wake-up round trip",
     "`bench_store`, first: the median of 20,000 one-byte round trips through a pair of pipes between two "
     "processes, each end waking the other. Anchor: the same writes and reads by one thread, no wake-up. Not a dt "
     "figure: it is what a wake-up costs on this machine, which moves the store rows' ratios."),
    (r"store (get|set) p(50|99), ", "store get, set p50 and p99 (1, 8, 64 clients)",
     "`bench_store store`: the coordinator embedded in the benchmark process and a c10d::TCPStore server "
     "(LibTorch) beside it, loopback; N client processes, one simulated node's ranks (dt's node combiner on, as "
     "dttrainer's ranks have it), each with a coordinator store session (one gRPC stream) and a TCPStore "
     "connection, looping set (64-byte value), get, add over 64 keys of its own, 300 iterations quick (3,000 full), "
     "divided by N/8 above 8 clients. 4 rounds a side, interleaved, each side first in turn; each side's round "
     "with the lowest get p50 is kept, p50 and p99 of its calls. Anchor: the same clients' TCPStore calls."),
    (r"store add p(50|99), .*\(every client adding\)", "store add p50 and p99, every client adding",
     "`bench_store store`, the same clients and servers: rounds in which every client only adds (a counter of "
     "its own), 4 a side beside the loop's rounds, each side first in turn, the round with the lowest add p50 "
     "kept. Anchor: TCPStore's add in the same rounds."),
    (r"store server CPU per add, ", "store server CPU per add, every client adding",
     "The adds-only rounds: the benchmark process's CPU (getrusage; one side's server runs at a time) over the "
     "kept round, divided by its adds. Anchor: the same for the TCPStore server."),
    (r"store adds per coordinator message, ", "store adds per coordinator message (node combiner)",
     "The adds-only rounds: adds divided by the coordinator messages that carried them (the combiner's batches "
     "plus adds sent alone). Anchor: 1, TCPStore's one message per add."),
    (r"store add p50 in the set/get/add loop, ", "store add p50 in the set/get/add loop",
     "The add of the set/get/add loop, in each side's kept round (lowest get p50), p50. Anchor: TCPStore's."),
    (r"store throughput, ", "store throughput",
     "The set/get/add loop: 3 x clients x iterations over the span from the first client's start to the last "
     "client's end, each side's best of its 4 rounds. Anchor: TCPStore, the same."),
    (r"store (server|client) CPU per op, ", "store server and client CPU per op",
     "The loop's kept round: the benchmark process's CPU (the server under test), or the client processes' own "
     "CPU summed (getrusage in each), over the round, divided by its operations. Anchor: TCPStore's."),
    (r"Gloo process group ready, ", "Gloo process group ready (8, 32 ranks)",
     "`bench_store pg`: N client processes each construct c10d::ProcessGroupGloo on a fresh PrefixStore over its "
     "coordinator store session (in an address exchange, as dttrainer builds its group) or its TCPStore "
     "connection; a round runs from the first rank starting its group to the last rank's group ready. 8 rounds "
     "a side (16 full), interleaved, alternating which side goes first. The goal row: the median over the pairs "
     "of each pair's dt round over its TCPStore round (rounds come in a fast and a slow mode, the TIME-WAIT "
     "sockets of earlier rounds, and a pair's two rounds share one). Beside it, without a goal, each side's p50. "
     "Anchor: the same group on the TCPStore."),
    (r"Gloo process group (client CPU|server CPU|client sleeps) per rank, ",
     "Gloo process group client CPU, server CPU, client sleeps per rank",
     "The same rounds: the ranks' own CPU summed, the benchmark process's CPU (the store server under test), "
     "and the ranks' voluntary context switches, each divided by N; p50 of the rounds. Anchor: the same on "
     "TCPStore."),
    (r"barrier release, ", "barrier release (p50, p90)",
     "`bench_store barrier`: N participants registered as the ranks of a run, 8 to a simulated node (1,024: 16 "
     "processes of 64 rank threads, a node each; up to 256, a process each), dt's `Agent::Barrier` with the node "
     "relay on (\"node relay off\": DT_NODE_RELAY=0, every rank answered by the coordinator); blocks of 20 "
     "barriers (40 below 64 participants), arrivals staggered by up to 200 us, 2 blocks a side (4 full), each "
     "side first in turn; per barrier, latest arrival to latest release, p50 and p90. Anchor: torch's store "
     "barrier on a TCPStore (add; the last arrival sets a done key; everyone waits for it)."),
    (r"barrier server CPU per released participant, ", "barrier server CPU per released participant",
     "The same blocks: the benchmark process's CPU (the coordinator, or the TCPStore server) over its side's "
     "blocks, divided by participants x barriers. Anchor: TCPStore's."),
    (r"rendezvous of ", "rendezvous of N ranks",
     "`bench_scale`: a dtcoord process (the real binary) and a run of N ranks, 8 to a node; N clients, each on "
     "its own connection, send Register at once (asynchronous); time from the first call to the last answer. "
     "64 and 512 ranks (2,048 too, full). Anchor: the 1 s goal."),
    (r"node agents: ", "node agents: 1K to 98K ranks, one connection per node",
     "`bench_scale nodes`: a dtcoord process (the real binary, metrics off) and one run each of 128, 1,024, "
     "4,096 and 12,288 nodes x 8 ranks. One benchmark process simulates every node agent: one connection per "
     "node (12,288 at the largest), each sending one RegisterNode with its 8 slots at once (asynchronous); "
     "registration is the time from the first call to the last answer, and dtcoord's CPU (/proc/PID/stat) "
     "meanwhile, per rank. Then every node heartbeats its 8 ranks every 2 s, spread evenly, for 10 s (30 s full): "
     "first a NodeHeartbeat call each, then one message each on its NodeHeartbeats stream, then the same "
     "stream asking for answers on change only (as dtrun heartbeats: the first answered, then none while "
     "nothing changes; any later answer counts as failed); dtcoord's CPU over each window, its peak RSS "
     "(VmHWM), and every answer checked (each rank told to continue). Last, one barrier of every rank: each "
     "node opens two store sessions (its first and last rank's); the first rank arrives as itself, the last as "
     "a relay member carrying the other six (as the node relay sends them); from the last arrival written to "
     "the last release read. Anchors: the goals at 98,304 ranks (10 s, 50% of a core, 1 s, 2 GiB)."),
    (r"(heartbeat RPC p99|coordinator CPU), ", "heartbeat RPC p99 and coordinator CPU, 1,000 ranks",
     "`bench_scale`: a dtcoord process, 1,000 registered ranks (10 nodes x 100, each its own connection) "
     "heartbeating every 2 s, spread evenly, asynchronous, while 8 store sessions set and get a 128-byte value "
     "every 20 ms; for 10 s (30 s full): the heartbeats' p99 as the ranks see it, and dtcoord's CPU "
     "(/proc/PID/stat) over the window. Anchors: the goals, 50 ms and 25% of a core."),
    (r"load, .*: (heartbeat|metric batch|store set\+get) p(50|99)", "load: heartbeat, metric batch, store set+get",
     "`bench_scale` mixed load: a dtcoord process (Prometheus exporter on), one run of 1,000 ranks and 50 runs of "
     "8 (1,400 ranks, each its own connection), every rank heartbeating every 2 s and sending a metric batch (one "
     "point of 6 values) every second from 8 sender threads, each run's store session setting and getting a "
     "256-byte value every 100 ms; for 20 s (2 min full); every call's latency as its caller sees it, p50 and "
     "p99. Anchors: the goals (50 ms, 100 ms, 50 ms)."),
    (r"load, .*: (dtcoord CPU|dtcoord memory|failed calls)", "load: dtcoord CPU, memory, failed calls",
     "The same load: dtcoord's CPU over the window (/proc/PID/stat), its resident set at the end (VmRSS; the "
     "peak, VmHWM, in the row's name), and the calls of all three kinds that failed. Anchors: the goals (one "
     "core, 1 GiB, none)."),
    (r"storm, .*: (heartbeat p99|calls answered wrongly)", "storm: heartbeat p99, calls answered wrongly",
     "`bench_scale`: a dtcoord process started with `--max-ranks 512` and one run of 512 ranks (64 nodes x 8, "
     "each its own connection) heartbeating every 2 s, spread evenly, asynchronous, while 8 clients (their own "
     "connections) submit 8-rank runs back to back, every one past the limit; for 10 s (30 s full): the "
     "heartbeats' p99 as the ranks see it; the heartbeats that failed plus the submissions not refused with "
     "RESOURCE_EXHAUSTED naming `--max-ranks`. Anchors: the goals (50 ms, none)."),
    (r"checkpoint write rate ", "checkpoint write rate",
     "`bench_checkpoint`: GPT-2 states after one AdamW step (weights and both moments), 193 MB quick (n_embd 256, "
     "4 layers; about 600 MB full) and GPT-2 small's 1.5 GB, torch on one thread, an embedded coordinator; 4 "
     "rounds (2 at 1.5 GB; 3 full) of `CheckpointRounds` as dttrainer runs them, each started before a "
     "training step (forward, backward, AdamW of one 64-token sequence); bytes over the round's time after its "
     "pause (copy to host memory, serialise, write and SHA-256, fsync, commit), p50. Anchor: `dd if=/dev/zero "
     "bs=4M conv=fsync` of the same size on the same file system beside each round, p50, the round and `dd` "
     "taking turns going first (see the sharded rounds' line)."),
    (r"training stall of an async checkpoint round ", "training stall of an async checkpoint round",
     "The same rounds: BeginCheckpoint's pause plus the optimizer step's wait for what is left of the copy, p50. "
     "Anchor: `dd`'s time for the same bytes (what writing them synchronously would stall)."),
    (r"training step with an async checkpoint round in flight ", "training step with a checkpoint round in flight",
     "The same rounds: the training step run while the round is in flight, p50. Anchor: the same step without a "
     "round, run just before each round, p50."),
    (r"sharded checkpoint round, ", "sharded checkpoint round, 2 and 4 writers, written behind, around and through the page cache",
     "`bench_sharded_checkpoint`: an embedded coordinator and a run of W ranks (threads of one process, each "
     "with its own Agent and connection); each round every rank writes 1/W of 256 MB quick (1 GiB full) "
     "through HashingFileWriter (write and SHA-256 side by side, fsync), commits its manifest, and the "
     "coordinator checks the sizes and publishes; first Begin to last commit reply, 6 rounds (8 full), p50. "
     "Written behind (dttrainer's default: through the page cache, each 8 MiB range's write-back started at once "
     "and its pages dropped once on disk), then around the page cache (`--checkpoint-io direct`, O_DIRECT) and "
     "through it (`--checkpoint-io buffered`), these two without a goal. Anchor: `dd if=/dev/zero bs=4M conv=fsync` of the same bytes beside each round, p50; the round and "
     "`dd` take turns going first, since whatever follows a 256 MB write and delete runs slower on this disk."),
    (r"metric points ingested", "metric points ingested",
     "`bench_metrics`: a dtcoord process with the Prometheus exporter and the W&B forwarder on (strategy all, to "
     "the project's test W&B server, tests/wandb_server.py); 16 streams on their own connections for a run of 64 "
     "ranks, batches of 50 points of 8 values as columns (what MetricsReporter sends), each stream reopened every second, for 5 s (15 s full); points "
     "accepted over the wall time, a stream ending OK only once its batches are delivered (spooled, not yet "
     "uploaded); the W&B server at nice 19, as W&B is another machine's CPU in production. Anchor: the 1M "
     "points/s goal."),
    (r"launch to first step, 2 local ranks \(median\)", "launch to first step, 2 local ranks",
     "`trainer_bench.py launch`: `dtctl submit --nproc-per-node 2` of dttrainer (tiny GPT-2: 2 layers of 64, "
     "1 step) to a local dtcoord, until rank 0's log shows step 1. Anchor: `torchrun --standalone "
     "--nproc_per_node 2` of bench/python/gpt2_ddp.py (the same model, PyTorch DDP over Gloo, one thread) until "
     "its first step, its whole session then killed. One unmeasured round, then 5 (7 full), each dt then torchrun; medians. Each round starts once the one before has left the cores (the launcher's exit)."),
    (r"launch to first step, 2 local ranks, anchor with dt's", "launch to first step, anchor with dt's settings",
     "The same dt rounds. Anchor: the same torchrun, in the same rounds, given the OpenBLAS kernels dt's rank 0 "
     "reported (OPENBLAS_CORETYPE) and dttrainer's malloc settings (GLIBC_TUNABLES mmap_max=0, trim threshold "
     "2 GB)."),
    (r"--exec launch to first step, Python script", "--exec launch to first step, Python script",
     "`trainer_bench.py exec-launch`: `dtctl submit --exec --nproc-per-node 2 -- python3 "
     "examples/python/train_ddp.py --steps 1 --ckpt-every 0` until rank 0's log shows \"step 1 loss\". Anchor: "
     "`torchrun --standalone --nproc_per_node 2` of the same script until its output shows it. One unmeasured "
     "round, then 9 (15 full); medians. Each round starts 3 s after the one before has left the cores (a round right after another process's `import torch` imports it faster)."),
    (r"--exec launch to first step with dtrun --agent-store", "--exec launch with dtrun --agent-store",
     "The same, with DT_AGENT_STORE=1 (the workers' c10d TCPStore served by dtrun-store beside them instead of "
     "by rank 0), in the same rounds. Anchor: the same torchrun median."),
    (r"launch overhead over the floor, dttrainer", "launch overhead over the floor, dttrainer",
     "The same rounds: in each, dt's time less that of the same two dttrainers started by hand right after it "
     "(same arguments, OMP_NUM_THREADS=1, the OpenBLAS kernels dt's rank 0 reported) on a run submitted "
     "beforehand over gRPC, until rank 0's log shows step 1; the median of those differences. Anchor: the "
     "0.1 s goal."),
    (r"launch overhead over the floor, --exec", "launch overhead over the floor, --exec",
     "The same rounds (9 quick, 15 full): in each, dt's time less that of the script's two processes started by "
     "hand with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, one thread each) until rank 0 prints "
     "\"step 1 loss\"; the median of those differences. The hand-started ranks' store is hosted before they "
     "start, as the agent of torchrun's static rendezvous hosts it (TORCHELASTIC_USE_AGENT_STORE=True): with "
     "rank 0 hosting it, a rank that connects before it listens waits out torch 1.13's fixed one-second retry, "
     "a race of the hand start. dt's ranks do not wait it out either (dtrun's relay listens before they start). "
     "Anchor: the 0.1 s goal."),
    (r"--exec: dtctl submit to the last rank started", "--exec: dtctl submit to the last rank started",
     "The same dt rounds: from just before `dtctl submit` to the time in dtrun's log at which it started the "
     "last rank (millisecond stamps), median: dt's own share of the launch, free of the programs' start-up "
     "noise. Anchor: the 0.1 s goal."),
    (r"training throughput, ", "training throughput (1, 2 ranks)",
     "`trainer_bench.py throughput`: dttrainer through `dtctl submit --omp-threads 1` (GPT-2, 4 layers of 128, 4 "
     "heads, batch 4 x 128 tokens, 12 steps, 30 full), rank 0's step times from `dtctl metrics` after the first "
     "3. Anchor: `torchrun` of bench/python/gpt2_ddp.py (the same model, PyTorch DDP over Gloo, one thread) given "
     "the OpenBLAS kernels and malloc settings dt's ranks ran with. 2 pairs of runs (3 full) alternating which "
     "side goes first, step times pooled; tokens/s = ranks x 512 / median step time."),
    (r"2-rank scaling efficiency", "2-rank scaling efficiency",
     "From the throughput rows: tokens/s at 2 ranks over twice that at 1, each side. Anchor: PyTorch DDP's; the "
     "goal is absolute (>= 0.80)."),
    (r"step-time cost of metric reporting", "step-time cost of metric reporting every step",
     "`bench_metrics reporter-cost`, after the metrics-cost runs below: one MetricsReporter alone in a process, "
     "adding dttrainer's 13 values every step at dttrainer's median step time with reporting off, to a dtcoord with "
     "Prometheus and the W&B forwarder on; the process's CPU over 60 steps (150 full), last batch delivered, less "
     "its CPU over as many steps without adds. Value: that step time plus the added CPU per step (what reporting "
     "costs a step on a busy node). Anchor: that step time."),
    (r"step time with metric reporting on", "step time with metric reporting on",
     "`trainer_bench.py metrics-cost`: 1-rank dttrainer runs (tiny GPT-2, batch 4 x 64, 30 steps, 100 full, "
     "logging every step), rank 0's step times from its log after the first 5; 4 pairs (6 full) alternating "
     "which goes first; median. Anchor: the same runs with `--no-metrics`."),
    (r"(optimizer state|peak resident memory) per rank, GPT-2 small", "--zero 1 memory (2, 4 ranks)",
     "`trainer_bench.py zero-memory`: dttrainer through `dtctl submit --omp-threads 1`, GPT-2 small (124M), batch "
     "1 x 64 tokens, 3 steps, with `--zero 1` and with `--zero 0`; the largest over the ranks of each rank's last "
     "`optimizer_state_bytes` (the AdamW moments it holds) and `peak_rss_bytes` (getrusage's maximum resident "
     "set), reported at step 3 before the final checkpoint's copy. Anchor: the same run with `--zero 0`."),
    (r"training stall of a --zero 1 sharded round", "training stall of a --zero 1 sharded round",
     "`trainer_bench.py zero-stall`: dttrainer through `dtctl submit --omp-threads 1`, GPT-2 small, 2 ranks, "
     "`--zero 1`, batch 1 x 64 tokens, 9 steps, a round every 3; the stall of the rounds begun at steps 3 and 6 "
     "(`checkpoint_pause_seconds` of the next step's point: Begin, the copies left on the step, the optimizer "
     "step's wait for the rest), the largest over the ranks, median. Anchor: rank 0's `checkpoint_seconds` "
     "(Begin to commit), median."),
    (r"GPU training throughput, .*against torch\.compile", "GPU training throughput against torch.compile",
     "The bf16 dttrainer run of the GPU training throughput rows. Anchor: bench/python/gpt2_gpu.py with `--compile` (torch.compile of "
     "the model, loss included; bf16 autocast), 5 untimed steps (the compilation among them), then 30 (20 quick); "
     "tokens/s = 8,192 / median step time. No goal: torch.compile is shown beside eager, not as dt's target."),
    (r"GPU training throughput, ", "GPU training throughput, GPT-2 124M (fp32, bf16)",
     "`trainer_bench.py gpu` (a CUDA build in DT_BENCH_BIN, a CUDA torch in DT_BENCH_PYTHON): dttrainer through "
     "`dtctl submit --nproc-per-node 1` (no --omp-threads: dtctl's default, the cores) with `--backend nccl "
     "--precision fp32|bf16 --log-freq 1`, GPT-2 124M (12 layers of 768, 12 heads), batch 8 x 1024 tokens, 35 "
     "steps (25 quick) on one GPU; per step, the time from the previous step's metric point to its own (rank 0's "
     "`dtctl metrics`; the whole loop: the optimizer's device work, which the step's `step_time_s` can leave to "
     "the next step's sync, and the per-step logging included), after the first 5; tokens/s = 8,192 / median. "
     "Anchor: bench/python/gpt2_gpu.py (gpt2_ddp.py's model, the same shape, batch and precision; eager "
     "PyTorch; AdamW lr 3e-4, betas 0.9/0.95, weight decay 0.1 on matrices, clip_grad_norm_ 1.0; bf16 = "
     "torch.autocast around forward and loss, fp32 weights and AdamW, no grad scaler; fp32 without TF32, torch's "
     "default; random tokens on the device), 5 untimed steps, then 30 (20 quick) each timed to "
     "torch.cuda.synchronize(); tokens/s = 8,192 / median. One run a side, the anchor first."),
    (r"GPU MFU, ", "GPU MFU, GPT-2 124M (fp32, bf16)",
     "The throughput rows' tokens/s x FLOPs per token over the device's dense peak, in percent. FLOPs per token: "
     "the nanoGPT / PaLM convention, 6 N (N the parameters less the position embedding) + 12 x layers x n_embd x "
     "seq (attention), 855 M for GPT-2 124M at 1024 tokens. Peak by device name (gpt2_gpu.py): H100 and H200 "
     "SXM 989.4 TFLOPS bf16 (dense), 66.9 fp32 (no TF32). Anchor: the same for eager PyTorch."),
    (r"GPU checkpoint stall per round, ", "GPU checkpoint stall per round, GPT-2 124M",
     "`trainer_bench.py gpu`: dttrainer as in the throughput rows, bf16, 95 steps, an asynchronous round every "
     "30 (`--ckpt-freq 30`, about 2.4 s apart, longer than a round's write); for each round begun at step S (30, "
     "60, 90), the time from S - 1's metric point to S + 2's (what the loop did between them: a wait for a round "
     "still in flight, BeginCheckpoint, queueing the device-to-host copies on their side stream, step S + 1 with "
     "its optimizer step's wait on the device for the copies) less three times the median step period of the "
     "steps not after a round, after the first 5; median of the rounds. Three periods, not one: on a GPU a "
     "step's point is made while the next step runs, so S's is made after the round began and can come late by "
     "the host's pause while the device runs on. Anchor: that median step time. Goal absolute: "
     "<= 10 ms."),
    (r"GPU checkpoint pause per round, ", "GPU checkpoint pause per round (dttrainer's own figure)",
     "The same rounds: dttrainer's `checkpoint_pause_seconds` of step S + 1's point (BeginCheckpoint and "
     "queueing the copies, plus a host copy's rest at the optimizer step; not a wait for the round before), "
     "median. Anchor: `checkpoint_seconds` (the round's start to its commit), median. No goal."),
    (r"step time with a live stack capture", "step time with a live stack capture",
     "`trainer_bench.py capture-cost`: 2-rank dttrainer runs (tiny GPT-2, 120 steps, 300 full) while `dtctl "
     "stacks` captures every rank every 10 s; mean of rank 0's step times after the first 5; 1 pair (2 full), "
     "alternating. Anchor: the same runs without captures."),
    (r"stack capture of ", "stack capture of N Python processes",
     "`bench_capture`: 2, 8 and 64 Python processes a few frames down in a sleep, with dt's hook loaded; dt's "
     "capture of all of them (common/stack_capture: Python frames through the hook, native frames from "
     "eu-stack), 3 rounds (5 below 64, full), p50. Anchor: `gdb -p PID -batch -ex \"thread apply all bt\"` over "
     "the same processes, as many at once, once."),
    (r"native-only capture ", "native-only capture (eu-stack)",
     "The same processes captured by eu-stack alone (no Python hook), p50. Anchor: the same gdb run."),
    (r"start a rank's process ", "start a rank's process",
     "`bench_spawn`: a process with 21 MB resident (dtrun's size in a run) and 2 threads writing it starts "
     "/bin/true with `Subprocess::Spawn` (vfork and exec, as dtrun starts each rank's dtslot) until the child "
     "has exec'd, 40 rounds (200 full), p50. Anchor: fork and exec of the same program from the same process, "
     "waited for the same way (a close-on-exec pipe), interleaved with dt's rounds."),
]


def how_measured(name):
    """(label, text) of the first HOW_MEASURED entry whose pattern matches the start of `name`."""
    for pattern, label, text in HOW_MEASURED:
        if re.match(pattern, name):
            return label, text
    return None


def cpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    return "%s, %d cores" % (model, os.cpu_count())


def fmt(v):
    if v is None:
        return ""
    if abs(v) >= 1000:
        return "{:,.0f}".format(v)
    return "%.4g" % v


def main():
    lines_file, json_file, md_file, mode = sys.argv[1:5]
    results = [json.loads(l) for l in open(lines_file) if l.strip()]
    json.dump([{k: r.get(k) for k in ("name", "value", "unit", "anchor", "anchor_value", "ratio", "goal", "met")}
               for r in results], open(json_file, "w"), indent=1)
    machine = os.environ.get("DT_BENCH_MACHINE") or cpu()
    date = os.environ.get("DT_BENCH_DATE") or datetime.date.today().isoformat()
    # The link as the page reads it in docs/ (gpu-check.sh writes it outside the clone, to be copied there).
    findings = "../bench/findings.md"

    # One "How measured" line per group of rows, in the order the groups first appear in the table.
    groups, undescribed = [], []
    for r in results:
        found = how_measured(r["name"])
        if found is None:
            undescribed.append(r["name"])
            groups.append((r["name"], "no description in bench/report.py's HOW_MEASURED: see the program in "
                                      "`bench/` that prints this row."))
        elif found not in groups:
            groups.append(found)

    with open(md_file, "w") as f:
        f.write("# dt benchmarks%s\n\n" % (" on a GPU" if "gpu-check" in (os.environ.get("DT_BENCH_COMMAND") or "") else ""))
        command = os.environ.get("DT_BENCH_COMMAND") or "scripts/bench.sh%s" % (" --quick" if mode == "quick" else "")
        f.write("Written by `%s` (`bench/report.py`) on %s, on one machine: %s. "
                "Ratios = dt / anchor measured in the same run, on the same machine; the goal and whether this run "
                "met it are the last columns. These machines are noisy: compare ratios, not absolute figures. How "
                "each row is measured is below the table; why a figure is what it is, in [bench/findings.md](%s).%s"
                "\n\n" % (command, date, machine, findings, "" if "gpu-check" in command else
                           " GPU rows (dttrainer against PyTorch on the same card): [benchmarks-gpu.md]"
                           "(benchmarks-gpu.md), written by `scripts/gpu-check.sh` on a GPU machine."))
        f.write("| what | dt | anchor | anchor figure | ratio | goal | met | machine | date |\n")
        f.write("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for r in results:
            met = {True: "yes", False: "**no**", None: ""}[r.get("met")]
            f.write("| %s | %s %s | %s | %s | %.3f | %s | %s | %s | %s |\n" % (
                r["name"], fmt(r["value"]), r["unit"], r["anchor"], fmt(r["anchor_value"]), r.get("ratio") or 0,
                r.get("goal", ""), met, machine, date))
        f.write("\n## How measured\n\n")
        for label, text in groups:
            f.write("- **%s**: %s\n" % (label, text))
    for name in undescribed:
        print("report.py: no HOW_MEASURED entry for %r: add one" % name, file=sys.stderr)
    print("wrote %s and %s (%d results)" % (json_file, md_file, len(results)))


if __name__ == "__main__":
    main()
