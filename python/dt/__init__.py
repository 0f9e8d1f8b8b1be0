"""dt for Python programs run by dtrun (`dtctl submit --exec -- python3 train.py`).

    import dt
    dt.init()                                   # from the environment dtrun sets; False outside dt
    start = dt.latest_checkpoint()              # a committed checkpoint directory, or None
    for step in range(first, steps + 1):
        ...
        dt.log({"loss": loss, "lr": lr}, step)  # to Prometheus and W&B; also feeds the hang watchdog
        if step % 100 == 0:
            with dt.checkpoint(step) as ck:     # every rank enters; one is the writer
                if ck.is_writer:
                    torch.save(state, os.path.join(ck.dir, "state.pt"))
        if dt.should_stop(step):                # Slurm's SIGUSR2: preemption or time limit
            with dt.checkpoint(step) as ck:     # every rank agreed on this step
                ...
            sys.exit(0)                         # dtrun leaves the ranks as preempted: requeued
    dt.barrier("done")

Outside dt (no DT_RUN_ID in the environment) the same script runs bare: `init()` returns False,
`log()` and `barrier()` do nothing, `experiment_dir()` and `latest_checkpoint()` are None, and a
checkpoint round gives rank 0 a local directory (`./checkpoints/step-<S>`).

Errors are Python exceptions: `ValueError` for bad arguments, `dt.NotInitialized` before `init()`,
`dt.CoordinatorUnavailable` when the coordinator cannot be reached, `dt.BarrierTimeout` for a
barrier whose ranks did not all arrive (the message names the missing ones), and `dt.DtError`
(their base) for every other refusal, with the coordinator's message.
"""
import atexit
import contextlib
import fnmatch
import hashlib
import json
import math
import os
import re
import signal
import sys
import threading
import time

__all__ = [
    "DtError", "NotInitialized", "CoordinatorUnavailable", "BarrierTimeout", "Checkpoint",
    "init", "active", "rank", "world_size", "experiment_dir", "latest_checkpoint", "verify_checkpoint", "log",
    "barrier",
    "checkpoint", "stop_requested", "should_stop",
]

_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,128}$")


class DtError(RuntimeError):
    """The coordinator refused a call; the message says why."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class NotInitialized(DtError):
    """A dt call before dt.init()."""


class CoordinatorUnavailable(DtError):
    """The coordinator could not be reached."""


class BarrierTimeout(DtError):
    """Not every rank arrived at a barrier in time; the message names the missing ranks."""


class _Session:
    """What dtrun told this process: the run, the rank and its registration, and a channel."""

    def __init__(self, env):
        import grpc  # only under dt: a bare script needs no gRPC
        from dt.v1 import barrier_pb2, barrier_pb2_grpc, checkpoint_pb2, checkpoint_pb2_grpc
        from dt.v1 import metrics_pb2, metrics_pb2_grpc, rendezvous_pb2, rendezvous_pb2_grpc

        self.grpc = grpc
        self.pb = {"barrier": barrier_pb2, "checkpoint": checkpoint_pb2, "metrics": metrics_pb2,
                   "rendezvous": rendezvous_pb2}
        try:
            self.run_id = env["DT_RUN_ID"]
            self.address = env["DT_COORDINATOR"]
            self.token = env["DT_RUN_TOKEN"]
            self.generation = int(env["DT_GENERATION"])
            self.incarnation = env["DT_INCARNATION"]
            self.rank = int(env["RANK"])
            self.world_size = int(env["WORLD_SIZE"])
        except (KeyError, ValueError) as e:
            raise DtError(f"DT_RUN_ID is set but the environment dtrun gives is incomplete ({e}); "
                          "start the program with dtrun or dtctl submit --exec") from None
        self.experiment_dir = env.get("DT_EXPERIMENT_DIR") or None
        ca = env.get("DT_TLS_CA")
        # Reconnect within a second once a restarted coordinator listens again (gRPC's default
        # backoff grows to minutes while it is away).
        options = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if ca:
            with open(ca, "rb") as f:
                channel = grpc.secure_channel(self.address, grpc.ssl_channel_credentials(f.read()), options)
        else:
            channel = grpc.insecure_channel(self.address, options)
        self.channel = channel
        self.metadata = (("authorization", f"Bearer {self.token}"),)
        self.barriers = barrier_pb2_grpc.BarrierServiceStub(channel)
        self.checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        self.metrics = metrics_pb2_grpc.MetricsServiceStub(channel)
        self.rendezvous = rendezvous_pb2_grpc.RendezvousServiceStub(channel)
        self.lock = threading.Lock()
        self.barrier_sequences = {}
        # How long a restart of the coordinator may take (the run's timeout policy): calls are
        # retried that long, and metrics kept, before the coordinator is taken as gone.
        self.reconnect_s = _reconnect_seconds(env.get("DT_TIMEOUTS", ""))
        self.unsent = []  # metric points not yet delivered while the coordinator was away
        self.away_since = None
        # Whether a call ever got through: an address that never answered is a mistake to report
        # at once, not a restart to ride out.
        self.reached = False

    def transient(self, code, detail):
        # A coordinator that restarts: unreachable, or its drain ending the calls it was serving.
        return code == self.grpc.StatusCode.UNAVAILABLE or (
            code == self.grpc.StatusCode.CANCELLED and "cancel" in detail.lower())

    def call(self, method, request, timeout=30.0, retry=True):
        """Calls `method`; while the coordinator restarts (UNAVAILABLE, or a call its drain
        cancelled) the call is repeated, for up to the run's reconnect timeout. A client stream's
        `request` is a list: each try sends all of it (an iterator would be spent by the first)."""
        deadline = time.monotonic() + self.reconnect_s
        backoff = 0.1
        while True:
            try:
                sent = iter(request) if isinstance(request, list) else request
                reply = method(sent, metadata=self.metadata, timeout=timeout)
                self.reached = True
                return reply
            except self.grpc.RpcError as e:
                code = e.code()
                detail = e.details() or str(code)
                if code != self.grpc.StatusCode.UNAVAILABLE:
                    self.reached = True  # it answered
                if self.transient(code, detail):
                    if retry and self.reached and time.monotonic() + backoff < deadline:
                        time.sleep(backoff)
                        backoff = min(backoff * 2, 2.0)
                        continue
                    raise CoordinatorUnavailable(f"the coordinator at {self.address} is unreachable: {detail}",
                                                 code) from None
                raise DtError(detail, code) from None


def _reconnect_seconds(timeouts_text):
    """reconnect_timeout_ms of the run's TimeoutPolicy as dtrun passes it (protobuf text)."""
    m = re.search(r"reconnect_timeout_ms:\s*(\d+)", timeouts_text)
    return int(m.group(1)) / 1000.0 if m else 60.0


# Metric points kept while the coordinator is away (a restart); beyond this the oldest are dropped.
_MAX_UNSENT_POINTS = 100_000

_session = None
_initialized = False


_stop_signal = None


def _on_stop_signal(signum, frame):
    global _stop_signal
    _stop_signal = signum


def init():
    """Reads the environment dtrun sets. Returns True under dt, False when the script runs bare.

    From the main thread it also takes SIGUSR2 — what Slurm sends ahead of a preemption or the
    time limit (`#SBATCH --signal=USR2@<grace>`) — as a request to checkpoint and stop: see
    should_stop(). Without dt.init() the signal ends the process, and the job is requeued anyway.
    """
    global _session, _initialized
    if _initialized:
        return _session is not None
    if os.environ.get("DT_RUN_ID"):
        _session = _Session(os.environ)
        atexit.register(_flush_at_exit)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR2, _on_stop_signal)
    _initialized = True
    return _session is not None


def stop_requested():
    """True once this process received the scheduler's SIGUSR2 (after init())."""
    _require()
    return _stop_signal is not None


def should_stop(step):
    """Whether every rank stops after `step` for the scheduler: True on all ranks at the same step
    once any of them received SIGUSR2. Call it once per step on every rank; with torch.distributed
    initialised the ranks agree through a one-element MAX all-reduce (the signal reaches them at
    slightly different moments), otherwise the local flag decides. Checkpoint at `step`, then
    exit 0: dtrun leaves the ranks as preempted, the run is REQUEUED, and the requeued job resumes
    from that checkpoint (dt.latest_checkpoint()). Always False outside dt.
    """
    _check_step(step)
    if _require() is None:
        return False
    flag = 1 if _stop_signal is not None else 0
    dist = _torch_distributed()
    if dist is not None:
        import torch
        t = torch.tensor([flag], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        flag = int(t.item())
    return flag != 0


def _torch_distributed():
    """torch.distributed when the program already imported it and initialised a group, else None."""
    import sys
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _require():
    if not _initialized:
        raise NotInitialized("call dt.init() first")
    return _session


def active():
    """True when this process runs under dt (after init())."""
    return _require() is not None


def rank():
    s = _require()
    return s.rank if s else int(os.environ.get("RANK", "0"))


def world_size():
    s = _require()
    return s.world_size if s else int(os.environ.get("WORLD_SIZE", "1"))


def experiment_dir():
    """The run's experiment directory (<save dir>/<name>), or None outside dt."""
    s = _require()
    return s.experiment_dir if s else None


def latest_checkpoint():
    """The directory of the run's latest committed checkpoint, or None when there is none."""
    s = _require()
    if s is None:
        return None
    pb = s.pb["checkpoint"]
    try:
        info = s.call(s.checkpoints.LatestCheckpoint, pb.LatestCheckpointRequest(run_id=s.run_id))
    except DtError as e:
        if e.code == s.grpc.StatusCode.NOT_FOUND and "no committed checkpoint" in str(e):
            return None
        raise
    return info.path or None


def verify_checkpoint(path):
    """Re-reads every file a published checkpoint's manifest.json lists and checks its size and
    SHA-256 against what its writer recorded: call it before loading a checkpoint you do not trust
    (as dttrainer does on every resume). Raises DtError naming the first file that differs."""
    try:
        with open(os.path.join(path, "manifest.json")) as f:
            manifest = json.load(f)
        listed = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DtError(f"checkpoint {path} has no readable manifest.json ({e})") from None
    for entry in listed:
        name = entry.get("name", "") if isinstance(entry, dict) else ""
        if not name or "/" in name or name in (".", ".."):
            raise DtError(f"checkpoint {path}: manifest.json lists a bad file name")
        file = os.path.join(path, name)
        digest = hashlib.sha256()
        size = 0
        try:
            with open(file, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
                    size += len(chunk)
        except OSError as e:
            raise DtError(f"checkpoint file {file} cannot be read: {e.strerror}") from None
        if size != entry.get("size"):
            raise DtError(f"checkpoint file {file} is {size} bytes but {entry.get('size')} in its manifest; "
                          "the checkpoint is corrupt")
        if digest.hexdigest() != entry.get("sha256"):
            raise DtError(f"checkpoint file {file} does not match its manifest (SHA-256 {digest.hexdigest()}, "
                          f"written as {entry.get('sha256')}); the checkpoint is corrupt")


def _check_step(step):
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")


def _send_unsent(s, retry):
    """Sends the metric points that wait (a batch holds at most 1 MiB: several when many wait)."""
    if not s.unsent:
        return
    pb = s.pb["metrics"]
    batches = [pb.MetricBatch(run_id=s.run_id, generation=s.generation, rank=s.rank, points=s.unsent[i:i + 2000])
               for i in range(0, len(s.unsent), 2000)]
    try:
        s.call(s.metrics.ReportMetrics, batches, retry=retry)
    except DtError as e:
        if e.code == s.grpc.StatusCode.RESOURCE_EXHAUSTED and "send it again" in str(e):
            return  # the coordinator's disk is behind (--metric-bytes-per-run): the points wait here
        raise
    s.unsent = []


def _flush_at_exit():
    """Points that waited for a restarted coordinator are delivered before the process ends."""
    s = _session
    if s is None or not s.unsent:
        return
    try:
        _send_unsent(s, retry=True)
    except DtError as e:
        sys.stderr.write(f"dt: {len(s.unsent)} metric point(s) not delivered: {e}\n")


def log(metrics, step):
    """Sends {name: number} for `step` to the coordinator (Prometheus, W&B with the run's log
    strategy, `dtctl metrics`) and reports `step` as this rank's progress to the hang watchdog."""
    s = _require()
    _check_step(step)
    if not isinstance(metrics, dict) or not metrics:
        raise ValueError("metrics must be a non-empty dict of name → number")
    values = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"metric name {name!r} must be 1-128 characters of A-Z a-z 0-9 _ . / -")
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"metric {name!r} must be a number, got {value!r}") from None
    if s is None:
        return
    pb = s.pb["metrics"]
    s.unsent.append(pb.MetricPoint(step=step, time=time.time(), values=values))
    del s.unsent[:-_MAX_UNSENT_POINTS]
    # A coordinator that restarts (a systemd restart, kill -9) is away for seconds: the points wait
    # here and go with the next call, and training goes on, for up to the run's reconnect timeout.
    try:
        _send_unsent(s, retry=False)
        rz = s.pb["rendezvous"]
        reply = s.call(s.rendezvous.Heartbeat, rz.HeartbeatRequest(
            run_id=s.run_id, rank=s.rank, generation=s.generation, incarnation=s.incarnation, step=step),
            retry=False)
        s.away_since = None
    except CoordinatorUnavailable:
        now = time.monotonic()
        s.away_since = s.away_since or now
        if not s.reached or now - s.away_since > s.reconnect_s:
            raise
        return
    if reply.directive == rz.HeartbeatResponse.STOP:
        if reply.requeue_job or reply.cancel_job:
            _unstopped(lambda: _act_on_job_of_lost_batch_host(reply.requeue_job or reply.cancel_job, s.generation,
                                                              cancel=not reply.requeue_job))
        raise DtError(f"the coordinator stopped this rank: {reply.reason}")


def _unstopped(action):
    """Runs `action` with SIGTERM held off: dtrun hears the same stop as this rank, finds the claim
    this process won taken, and stops its workers, this one included. From the main thread, a
    SIGTERM meanwhile is only noted (whichever thread the kernel gives it to) and raised again
    after; the commands it runs inherit it blocked. dtrun's SIGKILL comes after its grace (10 s by
    default), which bounds the commands' time. From another thread it cannot be held off."""
    if threading.current_thread() is not threading.main_thread():
        return action()
    came = []
    handler = signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    try:
        return action()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGTERM, handler)
        if came:
            signal.raise_signal(signal.SIGTERM)


def _restart_count():
    """SLURM_RESTART_COUNT: how many times this process's job was requeued before it started."""
    count = os.environ.get("SLURM_RESTART_COUNT") or "0"
    return count if count.isascii() and count.isdigit() and len(count) <= 9 else "0"


def _claim_job_of_lost_batch_host(job, generation, what):
    """Several ranks (of `generation`) are told to act on the job; the one that creates the claim
    file acts (a second requeue would end the requeued job), as dtrun and dttrainer do: the same
    file (client/slurm_job.h). None when this process claimed it, else the claim's text. OSError
    when neither can be told."""
    exp = os.environ.get("DT_EXPERIMENT_DIR")
    if not exp:
        raise OSError("the run's experiment directory is not known here (DT_EXPERIMENT_DIR)")
    logs = os.path.join(exp, "logs")
    os.makedirs(logs, exist_ok=True)
    path = os.path.join(logs, f"slurm-job-{job}-restart-{_restart_count()}-generation-{generation}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        try:
            with open(path, errors="replace") as f:
                text = f.read().strip()
        except OSError:
            text = ""
        return text or f"claimed in {path}"  # empty while its creator writes it: claimed all the same
    try:
        with os.fdopen(fd, "w") as f:
            f.write(what + "\n")
    except OSError:
        pass  # the file is the claim; its text only says who
    return None


def _act_on_job_of_lost_batch_host(job, generation, cancel):
    """The run's Slurm job lost its batch host, and Slurm keeps an elastic run's --no-kill job
    RUNNING without its script: this rank is among those told to requeue it
    (HeartbeatResponse.requeue_job) or, once the run has ended, to cancel it so it frees the nodes
    that remain (HeartbeatResponse.cancel_job); it acts once it claimed the action, as dtrun and
    dttrainer do."""
    import subprocess
    what = f"the batch host of Slurm job {job} is lost"
    if not re.fullmatch(r"[0-9]+([_+][0-9]+)?", job):
        sys.stderr.write(f"dt: {what}, and {job!r} is not a Slurm job id: left alone\n")
        return
    command = ["scancel", "--", job] if cancel else ["scontrol", "requeue", job]
    ran = f"scancel {job}" if cancel else f"scontrol requeue {job}"
    by_hand = f"`{ran}`" if cancel else f"`{ran}` (or `dtctl cancel RUN`)"
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        claim = _claim_job_of_lost_batch_host(job, generation,
                                              f"rank {rank()} (pid {os.getpid()} on {node}) claimed `{ran}` at {at}: "
                                              f"the batch host of Slurm job {job} was lost")
    except OSError as e:
        if not cancel:  # every rank told would requeue, and a second requeue can end the requeued job
            sys.stderr.write(f"dt: cannot claim the requeue of Slurm job {job}, whose batch host is lost ({e}): left "
                             f"alone. Run {by_hand}, or the job holds its nodes until its time limit\n")
            return
        sys.stderr.write(f"dt: cannot claim the cancel of Slurm job {job} ({e}): cancelling it all the same\n")
        claim = None
    if claim is not None:
        sys.stderr.write(f"dt: Slurm job {job} is left to the rank that claimed it: {claim}\n")
        return
    # Said first: requeue and scancel end this job's processes, this one included, maybe before
    # they return.
    if cancel:
        sys.stderr.write(f"dt: the run ended and {what}: Slurm would keep the job, and the nodes that remain, until "
                         f"its time limit; cancelling it ({ran})\n")
    else:
        sys.stderr.write(f"dt: {what} and Slurm keeps the job without its script: requeueing it ({ran}); the "
                         f"requeued job runs the next generation\n")
    sys.stderr.flush()
    try:
        # A job requeued since this process started is left alone: it runs something new, and a
        # second requeue would end it. Short: dtrun's SIGKILL follows its SIGTERM after its grace
        # (10 s by default); a controller that does not answer in time does not stop the act.
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=3)
        restarts = re.search(r" Restarts=(\d+) ", shown.stdout)
    except (OSError, subprocess.TimeoutExpired):
        restarts = None
    if restarts and restarts.group(1) != _restart_count():
        sys.stderr.write(f"dt: job {job} was requeued meanwhile (Restarts={restarts.group(1)}): left alone\n")
        return
    try:
        r = subprocess.run(command, capture_output=True, text=True, timeout=6)
        failure = None if r.returncode == 0 else f"{command[0]} exited with {r.returncode}: {r.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as e:
        failure = str(e)
    if failure is not None:
        sys.stderr.write(f"dt: {'cancelling' if cancel else 'requeueing'} Slurm job {job} failed: {failure}. Run "
                         f"{by_hand}, or the job holds its nodes until its time limit\n")


def barrier(name, timeout=None):
    """Waits until every rank reached the barrier `name` (seconds `timeout`; None: the run's
    barrier timeout). Raises BarrierTimeout naming the ranks that did not arrive."""
    s = _require()
    if not isinstance(name, str) or not name or len(name) > 128 or any(ord(c) < 32 for c in name):
        raise ValueError(f"barrier name {name!r} must be 1-128 characters without control characters")
    if name.startswith("dt."):
        raise ValueError(f"barrier names starting with 'dt.' are dt's own: {name!r}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    if s is None:
        return
    with s.lock:
        sequence = s.barrier_sequences.get(name, 0) + 1
        s.barrier_sequences[name] = sequence
    pb = s.pb["barrier"]
    request = pb.BarrierRequest(run_id=s.run_id, generation=s.generation, rank=s.rank, name=name,
                                timeout_ms=math.ceil(timeout * 1000) if timeout else 0, sequence=sequence)
    try:
        # The server ends the wait with the barrier's own timeout; the RPC deadline stays open.
        _send_unsent(s, retry=True)  # what waited for a restarted coordinator goes first
        s.call(s.barriers.Barrier, request, timeout=None)
    except DtError as e:
        if e.code == s.grpc.StatusCode.DEADLINE_EXCEEDED:
            raise BarrierTimeout(str(e), e.code) from None
        raise


class Checkpoint:
    """One checkpoint round, as `with dt.checkpoint(step) as ck` yields it. The writer (`is_writer`)
    saves its files into `dir` (plain files, no subdirectories); when the block ends their sizes and
    SHA-256 digests go to the coordinator, which checks the sizes, records the digests in the
    published `manifest.json` and publishes them as `path` (`verify_checkpoint(path)` re-reads them
    against it). Every rank's block ends once the round is committed; an exception in any rank's
    block aborts the round (`latest` is unchanged).

    In a sharded round (`dt.checkpoint(step, sharded=True)`) every rank is a writer: all share
    `dir`, and each names the files it wrote there, with `ck.file(name)` (the path to write) or
    `ck.claim(pattern, ...)` (files a library wrote, by glob pattern: after
    `torch.distributed.checkpoint.save(state, checkpoint_id=ck.dir)`, rank r claims
    `f"__{r}_*.distcp"` and rank 0 also `".metadata"`). A file that no rank names, or that two
    ranks name, aborts the round. `ck.layout` (anything JSON can hold: a mesh, a partition) goes
    into manifest.json as "layout"; ranks that set it must set the same (in a single-writer round,
    the writer sets it)."""

    def __init__(self, step, is_writer, directory, path, sharded=False, world_size=1):
        self.step = step
        self.is_writer = is_writer
        self.dir = directory
        self.path = path
        self.sharded = sharded
        self.world_size = world_size
        self.layout = None
        self.committed = False
        self.bytes = 0
        self._claimed = set()

    def file(self, name):
        """The path at which this rank writes `name` in a sharded round, claimed as this rank's."""
        self._claim_name(name)
        return os.path.join(self.dir, name)

    def claim(self, *patterns):
        """Claims as this rank's the files of `dir` matching each glob pattern (sharded rounds).
        Raises DtError for a pattern that matches nothing."""
        self._require_sharded()
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern or "/" in pattern:
                raise ValueError(f"a claim is a file name or glob pattern inside ck.dir, got {pattern!r}")
            names = [n for n in os.listdir(self.dir) if fnmatch.fnmatchcase(n, pattern)]
            if not names:
                raise DtError(f"nothing in {self.dir} matches {pattern!r}: write the files before claiming them")
            for name in names:
                self._claim_name(name)

    def _require_sharded(self):
        if not self.sharded:
            raise DtError("ck.file and ck.claim are for sharded rounds: dt.checkpoint(step, sharded=True); "
                          "in a single-writer round the writer's files are everything in ck.dir")

    def _claim_name(self, name):
        self._require_sharded()
        if not isinstance(name, str) or "/" in name or name in ("", ".", "..", "manifest.json"):
            raise ValueError(f"checkpoint file name {name!r} must be a plain file name (no '/', not manifest.json)")
        self._claimed.add(name)


def _hash_file(path):
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _manifest(pb, directory, names=None):
    """The manifest of every plain file in `directory` (a single writer), or of `names` (a rank's
    files in a sharded round; none is allowed)."""
    files = []
    if names is None:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
        for entry in entries:
            if entry.is_symlink() or not entry.is_file():
                raise DtError(f"checkpoint directory {directory} may hold only plain files; {entry.name} is not one")
        names = [e.name for e in entries]
        if not names:
            raise DtError(f"the checkpoint writer saved nothing into {directory}")
    for name in sorted(names):
        path = os.path.join(directory, name)
        if os.path.islink(path) or not os.path.isfile(path):
            raise DtError(f"checkpoint file {path} was claimed but is not a plain file that exists")
        size, digest = _hash_file(path)
        files.append(pb.ManifestFile(name=name, size=size, sha256=digest))
    return pb.Manifest(files=files)


@contextlib.contextmanager
def checkpoint(step, timeout=None, sharded=False):
    """A checkpoint round at `step`; see Checkpoint. `sharded`: every rank writes (every rank must
    ask alike)."""
    s = _require()
    _check_step(step)
    if s is None:
        r = rank()
        directory = os.path.join(os.getcwd(), "checkpoints", f"step-{step}")
        if r == 0 or sharded:
            os.makedirs(directory, exist_ok=True)
        writer = r == 0 or sharded
        ck = Checkpoint(step, writer, directory if writer else None, directory, sharded, world_size())
        yield ck
        ck.committed = True
        return
    pb = s.pb["checkpoint"]
    _send_unsent(s, retry=True)  # a checkpoint at S follows every point up to S
    begun = s.call(s.checkpoints.BeginCheckpoint, pb.BeginCheckpointRequest(
        run_id=s.run_id, generation=s.generation, rank=s.rank, step=step,
        timeout_ms=math.ceil(timeout * 1000) if timeout else 0, sharded=sharded), timeout=None)
    if sharded and not begun.sharded:
        # A coordinator from before sharded rounds ignores the request and elects one writer.
        reason = "this dtcoord does not offer sharded rounds (it is older than this dt module): upgrade it"
        s.call(s.checkpoints.AbortCheckpoint, pb.AbortCheckpointRequest(
            run_id=s.run_id, generation=s.generation, rank=s.rank, round_id=begun.round_id, reason=reason))
        raise DtError(reason)
    writer = begun.sharded or begun.writer_rank == s.rank
    ck = Checkpoint(step, writer, begun.partial_dir if writer else None, begun.final_dir, begun.sharded,
                    begun.world_size or s.world_size)

    def abort(reason):
        # Any rank's failure aborts the round (the coordinator publishes only once every rank
        # committed); the other ranks' commits then end with the reason at once. Returns why the
        # round had already ended ("" when this call ended it, or the coordinator is away).
        try:
            reply = s.call(s.checkpoints.AbortCheckpoint, pb.AbortCheckpointRequest(
                run_id=s.run_id, generation=s.generation, rank=s.rank, round_id=begun.round_id,
                reason=reason[:1000]))
            return reply.already_ended
        except DtError:
            return ""  # the round's lease ends it anyway; the user's exception is the one to see

    def abort_for(e, reason, explained_by_removal):
        # Aborts the round for `e`. When another rank's abort had already ended it and removed the
        # round's directory under the writer, and that removal explains `e`, the abort is the
        # cause, as every other rank hears it.
        ended = abort(reason)
        if ended and explained_by_removal:
            raise DtError(ended, "ABORTED") from e

    try:
        yield ck
    except BaseException as e:
        abort_for(e, f"{type(e).__name__}: {e}", writer and isinstance(e, FileNotFoundError))
        raise
    request = pb.CommitCheckpointRequest(run_id=s.run_id, generation=s.generation, rank=s.rank,
                                         round_id=begun.round_id)
    if writer:
        try:
            request.manifest.CopyFrom(_manifest(pb, begun.partial_dir, ck._claimed if begun.sharded else None))
            if ck.layout is not None:
                request.layout_json = json.dumps(ck.layout, sort_keys=True, allow_nan=False)
        except BaseException as e:  # a subdirectory, a link, nothing saved: the round cannot commit
            abort_for(e, f"rank {s.rank}'s files cannot be committed: {e}", True)
            raise
    reply = s.call(s.checkpoints.CommitCheckpoint, request, timeout=None)
    ck.committed = True
    ck.path = reply.checkpoint.path or ck.path
    ck.bytes = reply.checkpoint.bytes
