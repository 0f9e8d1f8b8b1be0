#!/usr/bin/python3
"""Trainer-side benchmarks, each against its anchor in the same run:

  1. Launch to first step: `dtctl submit --scheduler local --nproc-per-node 2` until both ranks
     finished step 1 (tiny model), vs `torchrun --standalone --nproc_per_node 2` of the Python
     anchor doing the same, as users run it; beside it the anchor given the OpenBLAS kernels dt
     gave its ranks (where OpenBLAS's own pick is older than the CPU: common/blas_core.h) and
     dttrainer's malloc settings (trainer/main.cc).
     Goal: dt <= 0.2x torchrun. Beside it the floor: the same two dttrainers started by hand on a
     run submitted beforehand; dt's launch overhead (dt - floor, medians), goal <= 0.1 s.
  2. Training throughput: dttrainer vs PyTorch DDP (python3-torch, same GPT-2 shape, batch,
     threads, Gloo, OpenBLAS kernels, malloc settings) at 1 and 2 ranks; C++/Python ratio (goal >= 1) and 2-rank scaling efficiency
     (goal >= 80% of linear); pairs of runs alternating which side goes first, step times pooled.
  3. The cost of metric reporting on step time: the reporter's own CPU per step (bench_metrics
     reporter-cost, at dttrainer's step time) over the step time with reporting off. Goal < 1%.
     Beside it, without a goal, step times with reporting on vs off (noisier than 1% here).
  4. Launch to first step of a user's Python script (examples/python/train_ddp.py, 2 local ranks)
     under `dtctl submit --exec` vs `torchrun --standalone`, side by side. Goal: dt <= 0.5x
     torchrun. Beside it the floor: the script's two processes started by hand with torchrun's
     environment, their store hosted before they start (as the agent of torchrun's static
     rendezvous hosts it, so neither waits out torch's one-second connect retry); dt's launch
     overhead (the median over rounds of dt's round less the floor's round beside it), goal <= 0.1 s.
  5. Memory of --zero 1 against --zero 0 (GPT-2 small at 2 and 4 ranks): the AdamW moments each
     rank holds (goal: 1/world of them) and each rank's peak resident memory; the training stall
     of a --zero 1 sharded round against its write time (goal <= 0.1x).
  6. gpu (not in the default list: it needs a CUDA build of dt, a CUDA torch in DT_BENCH_PYTHON and
     a GPU): GPT-2 124M, batch 8 x 1024 tokens, one GPU, dttrainer --precision fp32 and bf16 vs
     bench/python/gpt2_gpu.py (the same model, batch and precision in eager PyTorch): tokens/s
     (goal >= 1x) and MFU; beside it, without a goal, torch.compile in bf16. Then the training
     stall of an asynchronous checkpoint round (bf16, a round every 10 steps): goal <= 10 ms.

Results go to $DT_BENCH_OUT as JSON lines (see bench/bench_util.h); DT_BENCH_QUICK=1 shortens.
"""
import json
import os
import signal
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# DT_BENCH_BIN: dt's binaries (dtcoord, dtctl, dttrainer) from another build, e.g. a CUDA one;
# DT_BENCH_PYTHON: the anchors' Python, e.g. a virtual environment with a CUDA torch.
BIN = os.environ.get("DT_BENCH_BIN") or os.path.join(ROOT, "build", "bin")
DATA = os.path.join(ROOT, "data")
PY = os.environ.get("DT_BENCH_PYTHON") or "/usr/bin/python3"
ANCHOR = os.path.join(ROOT, "bench", "python", "gpt2_ddp.py")
GPU_ANCHOR = os.path.join(ROOT, "bench", "python", "gpt2_gpu.py")
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_ddp.py")
QUICK = os.environ.get("DT_BENCH_QUICK") == "1"
# gpu modes: where Chrome traces of warmup steps 2 to 4 go (dttrainer --profile-trace beside
# gpt2_gpu.py --profile-out), with profile_summary.py's comparison; unset: no traces.
GPU_PROFILE_DIR = os.environ.get("DT_GPU_PROFILE_DIR")
PROFILE_STEPS = 3
# Launch rounds each side: an odd count in quick mode, so the median is a round, not the mean of two.
LAUNCH_REPEATS = 5 if QUICK else 7
# The --exec floor row is a median of per-round differences: more rounds than the other launch rows.
EXEC_LAUNCH_REPEATS = 9 if QUICK else 15
WORK = tempfile.mkdtemp(prefix="dt-bench-trainer-")
# Idle time before each --exec launch round. A round started right after another process's `import
# torch` imports torch faster: two ranks' import read a median of 1.051 s against 1.125 s right
# after a third process imported it, and 1.133 against 1.139 s with 3 s between (12-16 interleaved
# pairs, 2026-12-03). The floor's store host imports torch just before its ranks start, so without
# this the floor ran warm and dt's rounds did not.
EXEC_ROUND_SETTLE_S = 3.0


def report(name, value, unit, anchor, anchor_value, goal="", goal_ratio=0, higher=False, met=None):
    ratio = value / anchor_value if anchor_value else 0
    if goal_ratio:
        met = ratio >= goal_ratio if higher else ratio <= goal_ratio
    print("%-58s %12.4g %-8s | %-22s %12.4g | ratio %7.3f | goal %-14s %s" % (
        name, value, unit, anchor, anchor_value, ratio, goal, "" if met is None else ("met" if met else "MISSED")))
    out = os.environ.get("DT_BENCH_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"name": name, "value": value, "unit": unit, "anchor": anchor,
                                "anchor_value": anchor_value, "ratio": ratio, "goal": goal, "met": met}) + "\n")


class Coordinator:
    def __init__(self):
        self.state = tempfile.mkdtemp(prefix="coord-", dir=WORK)
        self.proc = subprocess.Popen([os.path.join(BIN, "dtcoord"), "--listen", "127.0.0.1:0", "--state-dir",
                                      self.state, "--metrics-listen", "off"],
                                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "dtcoord.log"), "w"),
                                     env=dict(os.environ, DT_LOG_LEVEL="warning"))
        addr = os.path.join(self.state, "dtcoord.addr")
        for _ in range(200):
            if os.path.exists(addr) and open(addr).read().strip():
                break
            time.sleep(0.05)
        self.env = dict(os.environ, DT_COORDINATOR=open(addr).read().strip(),
                        DT_TOKEN=open(os.path.join(self.state, "admin.token")).read().strip())

    def dtctl(self, *args, check=True, env=None):
        r = subprocess.run([os.path.join(BIN, "dtctl")] + list(args), env=dict(self.env, **(env or {})),
                           capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError("dtctl %s: %s %s" % (args[0], r.stdout, r.stderr))
        return r

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def shape_args(n_embd, n_layer, n_head, seq, batch):
    return ["--model", "gpt2", "--config-overrides", "n_embd=%d,n_layer=%d,n_head=%d,n_positions=%d" % (
        n_embd, n_layer, n_head, seq), "--seq-len", str(seq), "--batch-size", str(batch)]


def dt_trainer_args(trainer_args):
    return ["--dataset", os.path.join(DATA, "alpaca_sample.json"), "--tokenizer-dir", os.path.join(DATA, "gpt2"),
            "--eval-split", "0", *trainer_args]


def dt_submit(coord, name, procs, trainer_args, omp_threads=1):
    """`omp_threads` None: no --omp-threads, dtctl's local default (cores / trainers)."""
    threads = ["--omp-threads", str(omp_threads)] if omp_threads is not None else []
    r = coord.dtctl("submit", "-o", "json", "--name", name, "--save-dir", os.path.join(WORK, "runs"),
                    "--nproc-per-node", str(procs), *threads, "--", *dt_trainer_args(trainer_args))
    return json.loads(r.stdout)


# What dttrainer does to glibc's malloc in its main (large blocks stay in the heap instead of an
# mmap and munmap each step), as a Python process gets it from the environment.
SAME_MALLOC = {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"}


def same_settings_env(exp_dir):
    """The settings a dt run's ranks ran with, as environment for the Python anchor: the OpenBLAS
    kernels rank 0's pre-flight line names (dt's launcher gives its ranks the best ones of the CPU
    where OpenBLAS's own pick is older than the CPU; common/blas_core.h) and dttrainer's malloc
    settings. Rows that compare dttrainer's code with PyTorch's give the anchor the same."""
    log = open(os.path.join(exp_dir, "logs", "rank-0.log"), errors="replace").read()
    m = re.search(r"\(OpenBLAS (\w+) kernels\)", log)
    return dict(SAME_MALLOC, **({"OPENBLAS_CORETYPE": m.group(1)} if m else {}))


def seconds_to_log_line(log, needle, start, what, timeout=120):
    """Seconds since `start` (time.perf_counter) once `log` holds `needle`, polled every 5 ms."""
    while not (os.path.exists(log) and needle in open(log, errors="replace").read()):
        if time.perf_counter() - start > timeout:
            raise RuntimeError("%s did not reach %r:\n%s" % (what, needle, open(log).read() if os.path.exists(log) else ""))
        time.sleep(0.005)
    return time.perf_counter() - start


def submit_only(coord, name, procs, trainer_args):
    """The SubmitRun `dt_submit` makes (dtctl's spec), sent over gRPC without launching anything: the
    run's ranks are then started by hand, as a user's own launcher would start them."""
    sys.path.insert(0, os.path.join(ROOT, "build", "python"))
    import grpc
    from dt.v1 import common_pb2, runs_pb2, runs_pb2_grpc
    spec = common_pb2.RunSpec(experiment_name=name, save_dir=os.path.join(WORK, "runs"), nodes=1,
                              procs_per_node=procs, scheduler=common_pb2.LOCAL, keep_checkpoints=3,
                              trainer_path=os.path.join(BIN, "dttrainer"),
                              trainer_args=dt_trainer_args(trainer_args))
    with grpc.insecure_channel(coord.env["DT_COORDINATOR"]) as channel:
        return runs_pb2_grpc.RunServiceStub(channel).SubmitRun(
            runs_pb2.SubmitRunRequest(spec=spec), timeout=30,
            metadata=(("authorization", "Bearer " + coord.env["DT_TOKEN"]),))


def bare_trainers_to_first_step(coord, name, procs, trainer_args, blas_env):
    """Seconds from starting `procs` dttrainer processes by hand (a run submitted beforehand, not
    timed) until rank 0's log shows step 1: the program's own start, which any launcher pays. Each
    gets what dt's launcher gives its ranks: the same arguments, OMP_NUM_THREADS=1 and the
    OpenBLAS kernels dt's rank 0 reported."""
    run = submit_only(coord, name, procs, trainer_args)
    logs = os.path.join(run.exp_dir, "bare-logs")
    os.makedirs(logs, exist_ok=True)
    env = dict(os.environ, DT_COORDINATOR=coord.env["DT_COORDINATOR"], DT_RUN_ID=run.run_id,
               DT_RUN_TOKEN=run.run_token, OMP_NUM_THREADS="1",
               **{k: v for k, v in blas_env.items() if k == "OPENBLAS_CORETYPE"})
    start = time.perf_counter()
    procs_started = []
    for slot in range(procs):
        argv = [os.path.join(BIN, "dttrainer"), *dt_trainer_args(trainer_args), "--node", "bare", "--local-rank",
                str(slot), "--nnodes", "1", "--nproc-per-node", str(procs)]
        procs_started.append(subprocess.Popen(argv, stdout=open(os.path.join(logs, "rank-%d.log" % slot), "w"),
                                              stderr=subprocess.STDOUT, env=dict(env, LOCAL_RANK=str(slot))))
    elapsed = seconds_to_log_line(os.path.join(logs, "rank-0.log"), "step 1/1", start, "the bare trainers")
    for p in procs_started:
        p.wait()
    dt_wait(coord, run.run_id)
    return elapsed


def dt_wait(coord, run_id):
    r = coord.dtctl("watch", run_id, check=False)
    if r.returncode != 0:
        raise RuntimeError("run %s did not succeed: %s" % (run_id, r.stdout[-2000:]))


def await_launcher_exit(exp_dir, timeout=30):
    """Waits until a local run's launcher has exited, its processes with it: a run has SUCCEEDED
    once its ranks left, while they and LibTorch are still tearing down, and a round started then
    would share the cores with them."""
    log = os.path.join(exp_dir, "logs", "launcher.log")
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            with open(log) as f:
                if "launcher exits" in f.read():
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    raise RuntimeError("the launcher of %s did not exit within %d s" % (exp_dir, timeout))


def stop_session(p):
    """SIGKILL to every process of `p`'s session; returns once none is left."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline:
        if not live_members(p.pid):
            return
        time.sleep(0.01)
    raise RuntimeError("torchrun's workers outlived SIGKILL for 30 s")


def live_members(pgid):
    """Processes of process group `pgid` that are not zombies (a zombie waits for its reaper)."""
    live = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open("/proc/%s/stat" % pid).read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(pid))
    return live


def torchrun(procs, args, first_step_only=False, extra_env=None):
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs), "--redirects", "1",
           "--tee", "1", ANCHOR] + args
    env = dict(os.environ, OMP_NUM_THREADS="1", **(extra_env or {}))
    start = time.perf_counter()
    # A session of its own: stopping it at the first step must stop its workers too, or they would
    # still be running (on the same two cores) when the next measurement starts.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    first = None
    result = None
    for line in p.stdout:
        if "DT_BENCH_FIRST_STEP" in line and first is None:
            first = time.perf_counter() - start
            if first_step_only:
                stop_session(p)
                break
        m = re.search(r"DT_BENCH_RESULT (\{.*\})", line)
        if m:
            result = json.loads(m.group(1))
    p.wait()
    return first, result


def launch_to_first_step():
    coord = Coordinator()
    dt_times, py_times, py_same_blas_times, bare_times = [], [], [], []
    tiny = ["--n-embd", "64", "--n-layer", "2", "--n-head", "2", "--n-positions", "64", "--seq-len", "64",
            "--batch-size", "8", "--steps", "1"]
    # One unmeasured launch each first: dt's token cache (shared by experiments on the same data)
    # and both sides' binaries and libraries in the page cache, as on a user's second run.
    for i in range(-1, LAUNCH_REPEATS):
        name = "launch-%d" % i
        start = time.perf_counter()
        trainer_args = ["--model", "tiny", "--seq-len", "64", "--max-steps", "1", "--log-freq", "1"]
        run = dt_submit(coord, name, 2, trainer_args)
        log = os.path.join(run["exp_dir"], "logs", "rank-0.log")
        dt_times.append(seconds_to_log_line(log, "step 1/1", start, "the dt run"))
        dt_wait(coord, run["run_id"])
        await_launcher_exit(run["exp_dir"])
        # The floor: the same two dttrainers started by hand on a run submitted beforehand, right
        # after dt's round (once its processes are gone), so the pair sees the same phase of the VM.
        bare_times.append(bare_trainers_to_first_step(coord, "bare-%d" % i, 2, trainer_args,
                                                      same_settings_env(run["exp_dir"])))
        py_times.append(torchrun(2, tiny, first_step_only=True)[0])
        # The same, with the OpenBLAS kernels and malloc settings dt's ranks ran with: what is left
        # is the launch itself.
        py_same_blas_times.append(torchrun(2, tiny, first_step_only=True, extra_env=same_settings_env(run["exp_dir"]))[0])
        if i < 0:
            for times in (dt_times, py_times, py_same_blas_times, bare_times):
                times.pop()
    coord.stop()
    print("launch to first step: dt %s, torchrun %s, torchrun with dt's settings %s, dttrainers started by hand %s" % (
        ["%.2f" % t for t in dt_times], ["%.2f" % t for t in py_times], ["%.2f" % t for t in py_same_blas_times],
        ["%.2f" % t for t in bare_times]))
    # Each dt round less the floor's round beside it, then the median, as for --exec: a difference
    # of two medians carried the VM's drift between rounds (about 0.1 s at 3 rounds).
    overhead = statistics.median(d - b for d, b in zip(dt_times, bare_times))
    report("launch overhead over the floor, dttrainer, 2 local ranks (median of paired rounds)", overhead, "s",
           "goal 0.1 s", 0.1, "<= 1x", 1.0)
    report("launch to first step, 2 local ranks (median)", statistics.median(dt_times), "s",
           "torchrun --standalone", statistics.median(py_times), "<= 0.2x", 0.2)
    report("launch to first step, 2 local ranks, anchor with dt's OpenBLAS kernels and malloc settings (median)",
           statistics.median(dt_times), "s", "torchrun --standalone", statistics.median(py_same_blas_times), "")


def time_to_line(cmd, env, needle, timeout=120):
    """Seconds from starting `cmd` until a line of its output contains `needle`; then waits for it."""
    start = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = None
    for line in p.stdout:
        if seen is None and needle in line:
            seen = time.perf_counter() - start
    p.wait()
    if seen is None or p.returncode != 0:
        raise RuntimeError("%s: exit %s before %r" % (" ".join(cmd), p.returncode, needle))
    return seen


# Hosts a c10d TCPStore on the port given, prints "ready" once it listens, and holds it until its
# stdin closes: the bare floor's store, up before its ranks start, as the agent of torchrun's
# static rendezvous hosts it.
_STORE_HOST = """
import sys, datetime
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), int(sys.argv[2]), True, datetime.timedelta(seconds=120),
                      wait_for_workers=False)
print("ready", flush=True)
sys.stdin.read()
"""


def bare_script_to_line(script, procs, needle, timeout=120, settle=0.0):
    """Seconds from starting `procs` processes of `script` by hand, with the environment torchrun
    would give them (RANK, WORLD_SIZE, MASTER_ADDR/PORT, one thread each), until rank 0 prints a
    line containing `needle`; then waits for all of them. Their store is hosted before the clock
    starts, as the agent of torchrun's static rendezvous hosts it (TORCHELASTIC_USE_AGENT_STORE=True):
    with rank 0 hosting it, a rank that connects before rank 0 listens waits out torch 1.13's fixed
    one-second retry, in about half the rounds, which is a race of the hand start and no part of the
    program's own start. (`torchrun --standalone`, the anchor, has rank 0 host it.) The clock starts
    `settle` seconds after the store is up, so its own import of torch does not warm the ranks'."""
    port = free_port()
    host = subprocess.Popen([PY, "-c", _STORE_HOST, str(port), str(procs)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    ps = []
    try:
        line = host.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError("the bare floor's TCPStore did not start: %r" % line)
        time.sleep(settle)
        start = time.perf_counter()
        for r in range(procs):
            env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(procs), LOCAL_WORLD_SIZE=str(procs),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                       TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0")
            ps.append(subprocess.Popen([PY, *script], stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                                       stderr=subprocess.STDOUT, text=True, env=env))
        seen = None
        for line in ps[0].stdout:
            if seen is None and needle in line:
                seen = time.perf_counter() - start
        for p in ps:
            p.wait(timeout=timeout)
    finally:
        for p in ps:  # an error above: nothing of the round outlives it
            if p.poll() is None:
                p.kill()
                p.wait()
        host.stdin.close()
        try:
            host.wait(timeout=10)
        except subprocess.TimeoutExpired:
            host.kill()
            host.wait()
    if seen is None or any(p.returncode != 0 for p in ps):
        raise RuntimeError("%s started bare: exits %s before %r" % (" ".join(script), [p.returncode for p in ps], needle))
    return seen


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exec_launch():
    coord = Coordinator()
    script = [EXAMPLE, "--steps", "1", "--ckpt-every", "0"]
    dt_times, agent_store_times, torchrun_times, bare_times, dt_paths = [], [], [], [], []

    def dt_run(name, env=None, paths=None):
        time.sleep(EXEC_ROUND_SETTLE_S)
        wall_start = time.time()
        start = time.perf_counter()
        r = coord.dtctl("submit", "-o", "json", "--name", name, "--save-dir", os.path.join(WORK, "runs"),
                        "--nproc-per-node", "2", "--exec", "--", PY, *script, env=env)
        run = json.loads(r.stdout)
        log = os.path.join(run["exp_dir"], "logs", "rank-0.log")
        elapsed = seconds_to_log_line(log, "step 1 loss", start, "the --exec run")
        dt_wait(coord, run["run_id"])
        await_launcher_exit(run["exp_dir"])  # the next round starts on cores the run has left
        if paths is not None:
            paths.append(last_rank_started(run["exp_dir"]) - wall_start)
        return elapsed

    for i in range(-1, EXEC_LAUNCH_REPEATS):  # one unmeasured round first: libraries in the page cache
        dt_times.append(dt_run("exec-%d" % i, paths=dt_paths))
        # dtrun --agent-store (DT_AGENT_STORE=1): the workers' TCPStore in dtrun-store, as torchrun's agent.
        agent_store_times.append(dt_run("exec-agent-%d" % i, {"DT_AGENT_STORE": "1"}))
        time.sleep(EXEC_ROUND_SETTLE_S)
        torchrun_times.append(time_to_line(
            [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--redirects", "1", "--tee",
             "1", *script], dict(os.environ), "step 1 loss"))
        bare_times.append(bare_script_to_line(script, 2, "step 1 loss", settle=EXEC_ROUND_SETTLE_S))
        if i < 0:
            for times in (dt_times, agent_store_times, torchrun_times, bare_times, dt_paths):
                times.pop()
    coord.stop()
    print("--exec launch to first step: dt %s, dt --agent-store %s, torchrun %s, bare %s; dt's path to the last "
          "rank's start %s" % (["%.2f" % t for t in dt_times], ["%.2f" % t for t in agent_store_times],
                               ["%.2f" % t for t in torchrun_times], ["%.2f" % t for t in bare_times],
                               ["%.3f" % t for t in dt_paths]))
    dt_median = statistics.median(dt_times)
    torchrun_median = statistics.median(torchrun_times)
    report("--exec launch to first step, Python script, 2 local ranks (median)", dt_median, "s",
           "torchrun --standalone", torchrun_median, "<= 0.5x", 0.5)
    report("--exec launch to first step with dtrun --agent-store (median)", statistics.median(agent_store_times), "s",
           "torchrun --standalone", torchrun_median, "")
    # Each dt round less the floor's round beside it, then the median: the VM's slow and fast
    # phases move both rounds of a pair alike, and neither side waits out torch's connect retry
    # (dt's relay listens before its ranks start; the floor's store is up before its ranks).
    report("launch overhead over the floor, --exec, 2 local ranks (median of paired rounds)",
           statistics.median(d - b for d, b in zip(dt_times, bare_times)), "s", "goal 0.1 s", 0.1, "<= 1x", 1.0)
    # The same overhead read from dt's own log, free of the programs' start-up noise: from before
    # `dtctl submit` to the moment dtrun started the last rank (its log's "rank N: pid" line).
    report("--exec: dtctl submit to the last rank started (median)", statistics.median(dt_paths), "s",
           "goal 0.1 s", 0.1, "")


def last_rank_started(exp_dir):
    """Wall-clock seconds (time.time) at which dtrun logged starting the run's last rank."""
    import calendar
    import glob
    latest = None
    for path in glob.glob(os.path.join(exp_dir, "logs", "dtrun-*.log")):
        for line in open(path, errors="replace"):
            m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z I dtrun \S+\] rank \d+: pid ", line)
            if m:
                t = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + int(m.group(2)) / 1000
                latest = t if latest is None else max(latest, t)
    if latest is None:
        raise RuntimeError("no dtrun log under %s says it started a rank" % exp_dir)
    return latest


def paired_runs(pairs, sides):
    """Runs each of two sides `pairs` times, alternating which goes first (a, b, then b, a, ...), so
    both see the same machine noise and neither always runs after the other. `sides`: label ->
    function of the pair's index returning that run's samples. Returns each side's samples pooled."""
    labels = list(sides)
    pooled = {label: [] for label in labels}
    for i in range(pairs):
        for label in (labels if i % 2 == 0 else labels[::-1]):
            pooled[label] += sides[label](i)
    return pooled


def dt_step_times(coord, name, procs, args, skip, blas_env=None):
    """Rank 0's step times of a dttrainer run, after the first `skip` steps. `blas_env`, when given,
    is updated with the settings the run's ranks ran with (same_settings_env)."""
    run = dt_submit(coord, name, procs, args)
    dt_wait(coord, run["run_id"])
    if blas_env is not None:
        blas_env.update(same_settings_env(run["exp_dir"]))
    recs = json.loads(coord.dtctl("metrics", run["run_id"], "--key", "step_time_s", "--rank", "0",
                                  "-o", "json").stdout)
    return [r["value"] for r in recs if r["step"] > skip]


def throughput():
    n_embd, n_layer, n_head, seq, batch = (128, 4, 4, 128, 4)
    steps = 12 if QUICK else 30
    skip = 3
    coord = Coordinator()
    tps = {}
    dt_args = shape_args(n_embd, n_layer, n_head, seq, batch) + ["--max-steps", str(steps), "--log-freq", "1",
                                                                 "--lr", "1e-4"]
    py_args = ["--n-embd", str(n_embd), "--n-layer", str(n_layer), "--n-head", str(n_head), "--n-positions", str(seq),
               "--seq-len", str(seq), "--batch-size", str(batch), "--steps", str(steps)]
    # The anchor runs with the OpenBLAS kernels and malloc settings dt's ranks ran with (known after
    # dt's first run, which goes first in the first pair): these rows compare the trainers' code.
    blas_env = {}
    for procs in (1, 2):
        # One run of each read 0.75x and then 1.02x at 1 rank on the same machine (2026-11-26), a
        # neighbour's load landing on one side only: hence pairs.
        times = paired_runs(2 if QUICK else 3, {
            "dt": lambda i: dt_step_times(coord, "tput-%d-%d" % (procs, i), procs, dt_args, skip, blas_env),
            "py": lambda i: torchrun(procs, py_args, extra_env=blas_env)[1]["step_times"][skip:],
        })
        dt_tps = procs * batch * seq / statistics.median(times["dt"])
        py_tps = procs * batch * seq / statistics.median(times["py"])
        tps[procs] = (dt_tps, py_tps)
        report("training throughput, %d rank(s), GPT-2 %dx%d, batch %dx%d" % (procs, n_layer, n_embd, batch, seq),
               dt_tps, "tokens/s", "PyTorch DDP (Python)", py_tps, ">= 1x", 1.0, higher=True)
    dt_scaling = tps[2][0] / (2 * tps[1][0])
    py_scaling = tps[2][1] / (2 * tps[1][1])
    report("2-rank scaling efficiency (fraction of linear)", dt_scaling, "", "PyTorch DDP scaling", py_scaling,
           ">= 0.80 (absolute)", 0, higher=True, met=dt_scaling >= 0.8)
    print("dt 2-rank scaling %.1f%% of linear (goal >= 80%%: %s); PyTorch %.1f%%" % (
        100 * dt_scaling, "met" if dt_scaling >= 0.8 else "MISSED", 100 * py_scaling))
    coord.stop()


def last_per_rank(coord, run_id, key, procs):
    """Each rank's last value of `key`."""
    out = []
    for rank in range(procs):
        recs = json.loads(coord.dtctl("metrics", run_id, "--key", key, "--rank", str(rank), "-o", "json").stdout)
        out.append(recs[-1]["value"])
    return out


def zero_memory():
    """GPT-2 small (124M) for 3 steps at 2 and 4 ranks, with --zero 1 and --zero 0: each rank's
    peak resident memory and the AdamW moments it holds, as dttrainer reports them at its last
    step (before the final checkpoint's copy). Goal: the moments per rank about 1/world of them;
    the peak memory beside it."""
    coord = Coordinator()
    args = ["--model", "gpt2", "--seq-len", "64", "--batch-size", "1", "--max-steps", "3", "--log-freq", "1",
            "--ckpt-freq", "0"]
    mib = 1 << 20
    for procs in (2, 4):
        got = {}
        for zero in ("0", "1"):
            run = dt_submit(coord, "zero%s-mem-%d" % (zero, procs), procs, args + ["--zero", zero])
            dt_wait(coord, run["run_id"])
            got[zero] = (max(last_per_rank(coord, run["run_id"], "peak_rss_bytes", procs)),
                         max(last_per_rank(coord, run["run_id"], "optimizer_state_bytes", procs)))
            shutil.rmtree(run["exp_dir"], ignore_errors=True)  # its final checkpoint: 1.5 GB
        (peak0, state0), (peak1, state1) = got["0"], got["1"]
        report("optimizer state per rank, GPT-2 small, %d ranks, --zero 1" % procs, state1 / mib, "MiB",
               "--zero 0", state0 / mib, "<= %.3gx (1/world)" % (1.01 / procs), 1.01 / procs)
        report("peak resident memory per rank, GPT-2 small, %d ranks, --zero 1" % procs, peak1 / mib, "MiB",
               "--zero 0", peak0 / mib)
    coord.stop()


def zero_stall():
    """GPT-2 small at 2 ranks with --zero 1, a sharded round every 3 steps (9 steps): what each
    round stalls training (dttrainer's checkpoint_pause_seconds: Begin, the copies left on the step,
    the optimizer step's wait for the rest; the largest over the ranks) against the round's write
    time (checkpoint_seconds, rank 0's). Goal: <= 0.1x."""
    coord = Coordinator()
    procs = 2
    args = ["--model", "gpt2", "--seq-len", "64", "--batch-size", "1", "--max-steps", "9", "--log-freq", "1",
            "--ckpt-freq", "3", "--zero", "1"]
    run = dt_submit(coord, "zero1-stall", procs, args)
    dt_wait(coord, run["run_id"])

    def series(key, rank):
        return {r["step"]: r["value"] for r in json.loads(coord.dtctl(
            "metrics", run["run_id"], "--key", key, "--rank", str(rank), "-o", "json").stdout)}
    pauses = [series("checkpoint_pause_seconds", rank) for rank in range(procs)]
    # A round begun at step S pauses steps S (Begin and the copies) and S + 1 (the wait): both land
    # in S + 1's point. The final round (step 9) has no step after it.
    stalls = [max(p.get(step, 0) for p in pauses) for step in (4, 7)]
    writes = list(series("checkpoint_seconds", 0).values())
    shutil.rmtree(run["exp_dir"], ignore_errors=True)
    coord.stop()
    report("training stall of a --zero 1 sharded round, GPT-2 small, 2 ranks", statistics.median(stalls), "s",
           "the round's write time", statistics.median(writes), "<= 0.1x", 0.1)


def metrics_cost():
    coord = Coordinator()
    steps = 30 if QUICK else 100

    def cost_run(label, extra):
        def run(i):
            r = dt_submit(coord, "cost-%s-%d" % (label, i), 1, ["--model", "tiny", "--seq-len", "64", "--batch-size",
                                                                "4", "--max-steps", str(steps), "--log-freq", "1"] + extra)
            dt_wait(coord, r["run_id"])
            log = open(os.path.join(r["exp_dir"], "logs", "rank-0.log"), errors="replace").read()
            return [float(t) for t in re.findall(r"([0-9.]+)s/step", log)][5:]
        return run

    # With off always first, a machine slowing down during the row counted against on.
    times = paired_runs(4 if QUICK else 6, {"off": cost_run("off", ["--no-metrics"]), "on": cost_run("on", [])})
    medians = {k: statistics.median(v) for k, v in times.items()}
    coord.stop()
    # The goal row. Step times here swing by more than 1% from run to run, so the cost is measured
    # where it can be: the reporter alone in a process, at this step time (bench_metrics).
    out = subprocess.run([os.path.join(BIN, "bench_metrics"), "reporter-cost", "%.4f" % medians["off"]],
                         capture_output=True, text=True, check=True).stdout
    added = float(re.search(r"reporter cpu per step: .* ([0-9.e-]+) s added", out).group(1))
    report("step-time cost of metric reporting every step (the reporter's CPU)", medians["off"] + added, "s",
           "reporting off", medians["off"], "<= 1.01x", 1.01)
    report("step time with metric reporting on (log every step)", medians["on"], "s", "reporting off", medians["off"])


def capture_cost():
    """Step time of a 2-rank dttrainer run while `dtctl stacks` captures every rank's stacks every
    10 s (each capture attaches eu-stack to every rank for a moment), against the same run without."""
    coord = Coordinator()
    steps = 120 if QUICK else 300

    def cost_run(label, capture):
        def run(i):
            r = dt_submit(coord, "capture-%s-%d" % (label, i), 2, ["--model", "tiny", "--seq-len", "64",
                                                                   "--batch-size", "4", "--max-steps", str(steps),
                                                                   "--log-freq", "1"])
            captures = 0
            while capture:
                state = json.loads(coord.dtctl("status", r["run_id"], "-o", "json").stdout)["state"]
                if state not in ("PENDING", "RENDEZVOUS", "RUNNING"):
                    break
                if state == "RUNNING" and coord.dtctl("stacks", r["run_id"], "-o", "json", check=False).returncode == 0:
                    captures += 1
                time.sleep(10)
            dt_wait(coord, r["run_id"])
            if capture and captures < 2:
                print("warning: only %d capture(s) during run %s" % (captures, r["run_id"]))
            log = open(os.path.join(r["exp_dir"], "logs", "rank-0.log"), errors="replace").read()
            return [float(t) for t in re.findall(r"([0-9.]+)s/step", log)][5:]
        return run

    times = paired_runs(1 if QUICK else 2, {"off": cost_run("off", False), "on": cost_run("on", True)})
    medians = {k: statistics.mean(v) for k, v in times.items()}
    coord.stop()
    report("step time with a live stack capture every 10 s (2 ranks)", medians["on"], "s", "no captures",
           medians["off"], "<= 1.05x", 1.05)


GPU_SHAPE = (768, 12, 12, 1024, 8)  # GPT-2 124M: n_embd, n_layer, n_head, seq (= n_positions), batch


def gpu_anchor(precision, steps, warmup, compile=False, trace=None):
    """bench/python/gpt2_gpu.py on GPU_SHAPE: its DT_BENCH_RESULT (step_times, tokens_per_s, mfu,
    flops_per_token, peak_tflops, ...). `trace`: a Chrome trace of warmup steps 2 to 4 goes there."""
    n_embd, n_layer, n_head, seq, batch = GPU_SHAPE
    cmd = [PY, GPU_ANCHOR, "--n-embd", str(n_embd), "--n-layer", str(n_layer), "--n-head", str(n_head),
           "--n-positions", str(seq), "--seq-len", str(seq), "--batch-size", str(batch), "--steps", str(steps),
           "--warmup", str(warmup), "--precision", precision, "--device", "cuda"] + (["--compile"] if compile else []) + (
        ["--profile-out", trace, "--profile-steps", str(PROFILE_STEPS)] if trace else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"DT_BENCH_RESULT (\{.*\})", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError("%s: exit %d\n%s%s" % (" ".join(cmd), r.returncode, r.stdout[-2000:], r.stderr[-4000:]))
    return json.loads(m.group(1))


def profile_args(trace, first_step=2):
    """dttrainer's flags for a trace of PROFILE_STEPS steps from first_step (none without a path)."""
    return ["--profile-trace", trace, "--profile-first-step", str(first_step),
            "--profile-steps", str(PROFILE_STEPS)] if trace else []


def trace_path(label):
    return os.path.join(GPU_PROFILE_DIR, label + ".json") if GPU_PROFILE_DIR else None


def summarize_traces(labels):
    """profile_summary.py over the traces made: printed, and written beside them."""
    traces = ["%s=%s" % (label, trace_path(label)) for label in labels if os.path.exists(trace_path(label))]
    if not traces:
        print("no traces were written in %s" % GPU_PROFILE_DIR)
        return
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "profile_summary.py"), "--steps",
                          str(PROFILE_STEPS)] + traces, capture_output=True, text=True)
    text = out.stdout + out.stderr
    print(text)
    with open(os.path.join(GPU_PROFILE_DIR, "summary.txt"), "w") as f:
        f.write(text)


def dt_gpu_run(coord, name, trainer_args):
    """A 1-rank dttrainer run on the GPU: rank 0's step points as {step: (step_time_s, time)} (the
    time a point was made: Unix seconds, at the end of the step's loop body, before a checkpoint
    round begun at that step), and {key: {step: value}} of the checkpoint metrics. Its files are
    removed after (each checkpoint of GPT-2 124M with AdamW is 1.5 GB)."""
    n_embd, n_layer, n_head, seq, batch = GPU_SHAPE
    # No --omp-threads 1: one trainer on a GPU gets dtctl's local default (the cores), as the
    # anchor gets torch's (the cores); --omp-threads 1 is for several CPU ranks sharing the cores.
    run = dt_submit(coord, name, 1, shape_args(n_embd, n_layer, n_head, seq, batch) +
                    ["--backend", "nccl", "--log-freq", "1"] + trainer_args, omp_threads=None)
    dt_wait(coord, run["run_id"])

    def records(key):
        return json.loads(coord.dtctl("metrics", run["run_id"], "--key", key, "--rank", "0", "-o", "json").stdout)
    steps = {r["step"]: (r["value"], r["time"]) for r in records("step_time_s")}
    ckpt = {key: {r["step"]: r["value"] for r in records(key)}
            for key in ("checkpoint_pause_seconds", "checkpoint_seconds")}
    shutil.rmtree(run["exp_dir"], ignore_errors=True)
    return steps, ckpt


def step_periods(steps, skip, after_rounds=()):
    """{step: seconds from the previous step's point to this one's}, steps after the first `skip`
    and not right after a checkpoint round (`after_rounds`: the steps rounds began at): the whole
    loop per step, the optimizer's device work and the per-step logging included."""
    return {k: steps[k][1] - steps[k - 1][1] for k in sorted(steps)
            if k > skip and k - 1 in steps and k - 1 not in after_rounds}


def check_gpu_build():
    trainer = os.path.join(BIN, "dttrainer")
    version = subprocess.run([trainer, "--version"], capture_output=True, text=True).stdout
    if "nccl" not in version:
        raise RuntimeError("gpu: %s is not a CUDA build (--version: %r); set DT_BENCH_BIN" % (trainer, version.strip()))
    if "--precision" not in subprocess.run([trainer, "--help"], capture_output=True, text=True).stdout:
        raise RuntimeError("gpu: %s has no --precision flag (fp32|bf16)" % trainer)
    print("dttrainer %s; anchor python %s" % (version.strip(), PY))


def gpu():
    """GPT-2 124M, batch 8 x 1024, one GPU: dttrainer vs gpt2_gpu.py in fp32 and bf16 (tokens/s,
    goal >= 1x eager; MFU beside), the checkpoint stall per round (goal <= 10 ms), torch.compile
    in bf16 beside (no goal). About 3 to 4 minutes on an H200, most of it torch.compile."""
    check_gpu_build()
    n_embd, n_layer, n_head, seq, batch = GPU_SHAPE
    steps = 20 if QUICK else 30
    skip = 5
    coord = Coordinator()
    dt_tps_by, dt_period_by = {}, {}
    try:
        for precision in ("fp32", "bf16"):
            # Traces of warmup steps 2 to 4 (skip > PROFILE_STEPS + 1): the timed steps come after.
            eager = gpu_anchor(precision, steps, skip, trace=trace_path("eager-" + precision))
            dt_steps, _ = dt_gpu_run(coord, "gpu-%s" % precision,
                                     ["--precision", precision, "--max-steps", str(steps + skip)] +
                                     profile_args(trace_path("dttrainer-" + precision)))
            periods = list(step_periods(dt_steps, skip).values())
            dt_period_by[precision] = statistics.median(periods)
            dt_tps = dt_tps_by[precision] = batch * seq / dt_period_by[precision]
            reported = batch * seq / statistics.median(v for k, (v, _) in dt_steps.items() if k > skip)
            print("%s: dttrainer %.0f tokens/s (point to point; %.0f from its step_time_s), eager %.0f tokens/s "
                  "on %s, torch %s, fp32 matmul %s" % (precision, dt_tps, reported, eager["tokens_per_s"],
                                                       eager["device"], eager["torch"], eager["fp32_matmul"]))
            name = "GPT-2 124M, batch %dx%d, %s" % (batch, seq, precision)
            report("GPU training throughput, " + name, dt_tps, "tokens/s", "PyTorch eager (Python)",
                   eager["tokens_per_s"], ">= 1x", 1.0, higher=True)
            peak = eager["peak_tflops"]
            if peak:
                dt_mfu = dt_tps * eager["flops_per_token"] / (peak * 1e12)
                print("%s MFU (peak %.1f TFLOPS, %.4g FLOPs/token): dttrainer %.1f%%, eager %.1f%%" % (
                    precision, peak, eager["flops_per_token"], 100 * dt_mfu, 100 * eager["mfu"]))
                report("GPU MFU, " + name, 100 * dt_mfu, "%", "PyTorch eager (Python)", 100 * eager["mfu"], "")
            else:
                print("%s MFU: no peak known for %s (gpt2_gpu.py --peak-tflops)" % (precision, eager["device"]))

        gpu_checkpoint_stall(coord, dt_period_by["bf16"])
        if GPU_PROFILE_DIR:
            summarize_traces(["dttrainer-fp32", "eager-fp32", "dttrainer-bf16", "eager-bf16", "dttrainer-bf16-round"])
        if os.environ.get("DT_GPU_BENCH_COMPILE", "1") != "0":
            gpu_compile_row(dt_tps_by["bf16"], steps, skip)
    finally:
        coord.stop()


def gpu_checkpoint_stall(coord, bf16_period=None):
    """The checkpoint stall of dttrainer's asynchronous rounds on the GPU (row and goal: report.py)."""
    skip = 5
    # The checkpoint stall: rounds begun at steps 30, 60 and 90 (95 steps), bf16. 30 steps (about
    # 2.4 s) outlast a round's write (1.5 s on the H200): a round that began while the last was
    # still writing would wait for it, a cost of rounds closer than their write, not of a round.
    # With traces, a fourth round at 120 is traced (steps 120 to 122) and left out of the figures.
    freq, ckpt_steps = 30, 95
    traced = 4 * freq if GPU_PROFILE_DIR else None
    # DT_GPU_CKPT_ARGS: more dttrainer flags for this run (a diagnosis's variant, e.g. --checkpoint-io buffered).
    dt_steps, ckpt = dt_gpu_run(coord, "gpu-ckpt", ["--precision", "bf16", "--ckpt-freq", str(freq), "--max-steps",
                                                    str(traced + 5 if traced else ckpt_steps)] +
                                (profile_args(trace_path("dttrainer-bf16-round"), traced) if traced else []) +
                                os.environ.get("DT_GPU_CKPT_ARGS", "").split())
    if traced:
        dt_steps = {k: v for k, v in dt_steps.items() if k <= ckpt_steps}
        ckpt = {key: {k: v for k, v in values.items() if k <= ckpt_steps} for key, values in ckpt.items()}
    rounds = [s for s in range(freq, ckpt_steps, freq) if s - 1 in dt_steps and s + 2 in dt_steps]
    base = statistics.median(step_periods(dt_steps, skip, rounds).values())
    # What a round begun at S costs training: the time from S - 1's point to S + 2's (the wait for
    # a round still in flight, BeginCheckpoint, queueing the copies, the optimizer step's wait
    # for them, step S + 1) less three steps without a round. Not S's point to S + 1's: on a GPU
    # a step's point is made while the next step runs (trainer.cc, HeldPoint), so S's is made
    # after the round began and can come late by its pause on the host, while the device runs on.
    stalls = [dt_steps[s + 2][1] - dt_steps[s - 1][1] - 3 * base for s in rounds]
    pauses = [ckpt["checkpoint_pause_seconds"].get(s + 1, 0.0) for s in rounds]
    writes = list(ckpt["checkpoint_seconds"].values())
    # Beside it, whether a write in flight slows the steps it overlaps (not in the row): the
    # steps S + 2 .. S + freq, against the bf16 run without rounds.
    overlapped = statistics.median(p for k, p in step_periods(dt_steps, skip).items()
                                   if any(s + 2 <= k <= s + freq for s in rounds))
    print("checkpoint rounds at steps %s: stall %s ms, dttrainer's checkpoint_pause_seconds %s ms; writes %s s; "
          "step without a round %.1f ms (%s in the bf16 run without rounds; %.1f ms for steps 2 to %d "
          "after a round), %.2f s between rounds" % (
              rounds, ["%.1f" % (1e3 * s) for s in stalls], ["%.1f" % (1e3 * p) for p in pauses],
              ["%.2f" % w for w in writes], 1e3 * base,
              "%.1f ms" % (1e3 * bf16_period) if bf16_period else "not measured", 1e3 * overlapped, freq,
              freq * base))
    for s in rounds:  # when each point around a round was made, for a trace or a thread sampler
        print("round at %d: point %d at %.6f (Unix s); then %s ms after it" % (
            s, s - 1, dt_steps[s - 1][1], ", ".join("%d: %.1f" % (k, 1e3 * (dt_steps[k][1] - dt_steps[s - 1][1]))
                                                   for k in range(s, s + 4) if k in dt_steps)))
    stall_ms = 1e3 * statistics.median(stalls)
    report("GPU checkpoint stall per round, GPT-2 124M", stall_ms, "ms", "step without a round (median)",
           1e3 * base, "<= 10 ms (absolute)", 0, met=stall_ms <= 10)
    report("GPU checkpoint pause per round, dttrainer's checkpoint_pause_seconds, GPT-2 124M",
           1e3 * statistics.median(pauses), "ms", "the round's write time (median)",
           1e3 * statistics.median(writes) if writes else 0, "")


def gpu_compile_row(dt_bf16_tps, steps, skip):
    """torch.compile beside, bf16 only (its compilation takes about a minute): no goal, so a torch
    without it (or without Triton or a C compiler for its kernels) skips the row."""
    batch, seq = GPU_SHAPE[4], GPU_SHAPE[3]
    try:
        compiled = gpu_anchor("bf16", steps, skip, compile=True)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print("torch.compile anchor skipped: %s" % str(e)[-1500:])
        return
    print("bf16 torch.compile: %.0f tokens/s%s" % (compiled["tokens_per_s"], ", MFU %.1f%%" % (
        100 * compiled["mfu"]) if compiled["mfu"] else ""))
    report("GPU training throughput, GPT-2 124M, batch %dx%d, bf16, against torch.compile" % (batch, seq),
           dt_bf16_tps, "tokens/s", "PyTorch torch.compile (Python)", compiled["tokens_per_s"], "")


def gpu_checkpoint_only():
    """`gpu-ckpt`: the checkpoint stall row alone (a short run on a GPU machine)."""
    check_gpu_build()
    coord = Coordinator()
    try:
        gpu_checkpoint_stall(coord)
    finally:
        coord.stop()


def main():
    which = sys.argv[1:] or ["launch", "exec-launch", "throughput", "metrics-cost", "capture-cost", "zero-memory",
                             "zero-stall"]
    print("== trainer benchmarks (%s)" % ", ".join(which))
    try:
        if "launch" in which:
            launch_to_first_step()
        if "exec-launch" in which:
            exec_launch()
        if "throughput" in which:
            throughput()
        if "metrics-cost" in which:
            metrics_cost()
        if "capture-cost" in which:
            capture_cost()
        if "zero-memory" in which:
            zero_memory()
        if "zero-stall" in which:
            zero_stall()
        if "gpu" in which:
            gpu()
        if "gpu-ckpt" in which:
            gpu_checkpoint_only()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
