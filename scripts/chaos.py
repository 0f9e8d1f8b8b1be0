#!/usr/bin/python3
"""Chaos rounds against the real system: each round starts dtcoord (with Prometheus and the strict
W&B test server behind it), submits a local 2-rank run of the tiny GPT-2 with checkpoints every
5 steps and a restart budget, injects one fault, and checks what a user relies on afterwards:

  - the run ended as the fault dictates (SUCCEEDED, with the restarts it should have spent; or
    FAILED at once for a full disk, naming the cause);
  - `latest` names a complete checkpoint that verifies (dtctl checkpoints --verify);
  - W&B holds every step exactly once in one run, with no protocol deviation, and the
    coordinator's metric history has every step of every rank exactly once;
  - no process of the round is left.

Faults: trainer-kill9, trainer-sigstop, trainer-sigterm, rendezvous-kill9 (a rank dies before the
group forms), checkpoint-kill9 (the writer dies mid-round), coord-kill9, coord-sigterm,
coord-sigstop, wandb-errors (429/5xx/dropped connections), wandb-gone (the W&B server is down for
a while), disk-full (a small tmpfs save dir; needs root, else skipped with the reason),
dtmodule-coord-restart (the run is examples/python/train_dt.py under --exec, using the dt module,
and dtcoord is stopped with SIGTERM and started again after 1-7 s), stalled-save-dir (the save
dir is a FUSE mount, bindfs, whose daemon is stopped for 2-5 s while a checkpoint round is in
flight, as an NFS server that stops answering; every dtctl call made meanwhile must answer within
2 s; needs root and bindfs, else skipped).

  scripts/chaos.sh [ROUNDS] [--seed S] [--faults a,b,...] [--build DIR] [--keep]

Prints a table; exits 1 if any round failed. Random faults strike at a random step (or moment).
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API_KEY = "chaos-key-0123456789abcdef0123456789abcdef"
STEPS = 40
CKPT_FREQ = 5


class Failed(Exception):
    pass


def wait_for(what, cond, timeout, interval=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise Failed("timed out after %ds waiting for %s" % (timeout, what))


class Round:
    """One round: its own directory, coordinator, W&B server and run."""

    def __init__(self, build, work, fault, rng):
        self.bin = os.path.join(build, "bin")
        self.work = work
        self.fault = fault
        self.rng = rng
        self.state_dir = os.path.join(work, "coord")
        self.save_dir = os.path.join(work, "runs")
        self.procs = []
        self.coord = None
        self.wandb = None
        self.address = None
        self.wandb_port_file = os.path.join(work, "wandb.port")
        self.wandb_state = os.path.join(work, "wandb.state")
        self.mounted = False

    # ---- the parts ----------------------------------------------------------------------

    def start_wandb(self):
        log = open(os.path.join(self.work, "wandb.log"), "a")
        args = ["/usr/bin/python3", os.path.join(ROOT, "tests", "wandb_server.py"), "--port-file",
                self.wandb_port_file, "--api-key", API_KEY, "--state-file", self.wandb_state]
        if os.path.exists(self.wandb_port_file):  # a restart keeps its port
            args += ["--port", open(self.wandb_port_file).read().strip()]
            os.unlink(self.wandb_port_file)
        self.wandb = subprocess.Popen(args, stdout=log, stderr=log)
        wait_for("the W&B server", lambda: os.path.exists(self.wandb_port_file) and
                 open(self.wandb_port_file).read().strip(), 20)
        self.wandb_url = "http://127.0.0.1:%s" % open(self.wandb_port_file).read().strip()

    def wandb_state_now(self):
        with urllib.request.urlopen(self.wandb_url + "/_control/state", timeout=10) as r:
            return json.loads(r.read())

    def start_coord(self):
        listen = self.address or "127.0.0.1:0"
        addr_file = os.path.join(self.state_dir, "dtcoord.addr")
        if os.path.exists(addr_file):
            os.unlink(addr_file)
        env = dict(os.environ, WANDB_API_KEY=API_KEY, WANDB_BASE_URL=self.wandb_url)
        log = open(os.path.join(self.work, "dtcoord.log"), "a")
        self.coord = subprocess.Popen(
            [os.path.join(self.bin, "dtcoord"), "--listen", listen, "--state-dir", self.state_dir, "--metrics-listen",
             "127.0.0.1:0", "--heartbeat-interval", "200ms", "--heartbeat-timeout", "3s", "--hang-timeout", "1m",
             "--rendezvous-timeout", "1m", "--wandb-post-interval", "200ms", "--wandb-retry-base", "100ms"],
            stdout=log, stderr=log, env=env)
        self.address = wait_for("dtcoord", lambda: os.path.exists(addr_file) and open(addr_file).read().strip(), 20)
        self.token = open(os.path.join(self.state_dir, "admin.token")).read().strip()

    def dtctl(self, *args, check=True):
        env = dict(os.environ, DT_COORDINATOR=self.address, DT_TOKEN=self.token, HOME=self.work)
        r = subprocess.run([os.path.join(self.bin, "dtctl")] + list(args), capture_output=True, text=True, env=env,
                           timeout=600)
        if check and r.returncode != 0:
            raise Failed("dtctl %s: exit %d: %s" % (" ".join(args), r.returncode, (r.stdout + r.stderr)[-1500:]))
        return r

    def status(self):
        r = self.dtctl("status", self.run, "-o", "json", check=False)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None  # the coordinator is away

    def submit(self):
        if self.fault == "stalled-save-dir":
            self.mount_bindfs()
        if self.fault == "dtmodule-coord-restart":
            r = self.dtctl("submit", "-o", "json", "--name", "chaos", "--save-dir", self.save_dir, "--nproc-per-node",
                           "2", "--max-restarts", "2", "--wandb-project", "chaos", "--exec", "--", "/usr/bin/python3",
                           os.path.join(ROOT, "examples", "python", "train_dt.py"), "--steps", str(STEPS),
                           "--ckpt-every", str(CKPT_FREQ), "--step-sleep", "0.2")
            self.run = json.loads(r.stdout)["run_id"]
            return
        if self.fault == "disk-full":
            os.makedirs(self.save_dir)
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=60m", "tmpfs", self.save_dir], capture_output=True,
                               text=True)
            if r.returncode != 0:
                raise Skipped("cannot mount a tmpfs here (%s)" % r.stderr.strip())
            self.mounted = True
        data = os.path.join(ROOT, "data")
        r = self.dtctl("submit", "-o", "json", "--name", "chaos", "--save-dir", self.save_dir, "--nproc-per-node", "2",
                       "--max-restarts", "2", "--omp-threads", "1", "--wandb-project", "chaos", "--",
                       "--dataset", os.path.join(data, "alpaca_sample.json"), "--model", "tiny", "--seq-len", "64",
                       "--batch-size", "2", "--max-steps", str(STEPS), "--ckpt-freq", str(CKPT_FREQ), "--log-freq", "1",
                       "--eval-split", "0")
        self.run = json.loads(r.stdout)["run_id"]

    def mount_bindfs(self):
        if shutil.which("bindfs") is None:
            raise Skipped("bindfs is not installed (apt-get install bindfs)")
        backing = os.path.join(self.work, "backing")
        os.makedirs(backing)
        os.makedirs(self.save_dir)
        r = subprocess.run(["bindfs", backing, self.save_dir], capture_output=True, text=True)
        if r.returncode != 0:
            raise Skipped("cannot mount a FUSE file system here (%s)" % r.stderr.strip())
        self.mounted = True
        self.bindfs_pid = wait_for("bindfs", lambda: [p for p in self.find_pids("bindfs")], 10)[0]

    def stall_save_dir(self):
        """Stops the file system's daemon while a checkpoint round is in flight; every dtctl call
        made meanwhile must still answer promptly."""
        ckpts = os.path.join(self.save_dir, "chaos", "checkpoints")
        self.at_step(self.rng.randint(1, 4) * CKPT_FREQ - 1)
        wait_for("a round in progress", lambda: os.path.isdir(ckpts) and any(
            ".partial-" in e for e in os.listdir(ckpts)), 60, interval=0.002)
        stall = self.rng.uniform(2, 5)
        os.kill(self.bindfs_pid, signal.SIGSTOP)
        slow = []
        try:
            end = time.time() + stall
            while time.time() < end:
                for args in (("status", self.run, "-o", "json"), ("list", "-o", "json")):
                    start = time.time()
                    r = self.dtctl(*args, check=False)
                    took = time.time() - start
                    if r.returncode != 0 or took > 2:
                        slow.append("dtctl %s: exit %d after %.1fs while the save dir stalled" % (
                            args[0], r.returncode, took))
                time.sleep(0.2)
        finally:
            os.kill(self.bindfs_pid, signal.SIGCONT)
        if slow:
            raise Failed("; ".join(slow[:3]))

    def at_step(self, step, timeout=120):
        wait_for("step %d" % step, lambda: (self.status() or {}).get("step", 0) >= step, timeout)

    def trainer_pids(self):
        s = wait_for("the ranks", lambda: (lambda s: s if s and len(s.get("ranks", [])) == 2 else None)(
            self.status()), 60)
        return [r["pid"] for r in s["ranks"]]

    # ---- the faults ---------------------------------------------------------------------

    def inject(self):
        """Returns what the run should end as: (state, restarts)."""
        f = self.fault
        step = self.rng.randint(3, STEPS - 8)
        if f in ("trainer-kill9", "trainer-sigstop", "trainer-sigterm"):
            self.at_step(step)
            victim = self.rng.choice(self.trainer_pids())
            os.kill(victim, {"trainer-kill9": signal.SIGKILL, "trainer-sigstop": signal.SIGSTOP,
                             "trainer-sigterm": signal.SIGTERM}[f])
            return "SUCCEEDED", 1
        if f == "rendezvous-kill9":
            # A rank that dies before the group forms: the first trainer process that exists.
            pid = wait_for("a trainer process", lambda: self.find_pids("dttrainer"), 30, interval=0.005)[0]
            os.kill(pid, signal.SIGKILL)
            return "SUCCEEDED", 1
        if f == "checkpoint-kill9":
            ckpts = os.path.join(self.save_dir, "chaos", "checkpoints")
            self.at_step(self.rng.randint(1, 3) * CKPT_FREQ - 2)
            pids = self.trainer_pids()
            wait_for("a round in progress", lambda: os.path.isdir(ckpts) and any(
                ".partial-" in e for e in os.listdir(ckpts)), 60, interval=0.002)
            os.kill(pids[0], signal.SIGKILL)  # rank 0 writes
            return "SUCCEEDED", 1
        if f in ("coord-kill9", "coord-sigterm", "dtmodule-coord-restart"):
            self.at_step(step)
            self.coord.send_signal(signal.SIGKILL if f == "coord-kill9" else signal.SIGTERM)
            self.coord.wait(30)
            # Away for a moment, as a restart is; under the dt module longer than the heartbeat
            # timeout, which must not end the run.
            time.sleep(self.rng.uniform(1, 7) if f == "dtmodule-coord-restart" else self.rng.uniform(0, 1.5))
            self.start_coord()
            return "SUCCEEDED", 0
        if f == "coord-sigstop":
            self.at_step(step)
            self.coord.send_signal(signal.SIGSTOP)
            time.sleep(self.rng.uniform(0.5, 2.5))  # shorter than the heartbeat timeout
            self.coord.send_signal(signal.SIGCONT)
            return "SUCCEEDED", 0
        if f == "wandb-errors":
            self.at_step(step)
            faults = [self.rng.choice(["429", "500", "503", "drop", "drop-after"]) for _ in range(8)]
            req = urllib.request.Request(self.wandb_url + "/_control/faults", data=json.dumps(
                {"faults": faults}).encode(), method="POST")
            urllib.request.urlopen(req, timeout=10).read()
            return "SUCCEEDED", 0
        if f == "wandb-gone":
            self.at_step(step)
            self.wandb.send_signal(signal.SIGTERM)
            self.wandb.wait(10)
            time.sleep(self.rng.uniform(1, 4))
            self.start_wandb()
            return "SUCCEEDED", 0
        if f == "disk-full":
            return "FAILED", 0
        if f == "stalled-save-dir":
            self.stall_save_dir()
            return "SUCCEEDED", 0
        raise ValueError("unknown fault " + f)

    def find_pids(self, name=None):
        """Processes of this round: their command line or environment names its directory (the
        trainers' DT_LOG_DIR does)."""
        pids = []
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) == os.getpid():
                continue
            try:
                cmd = open("/proc/%s/cmdline" % p, "rb").read().decode(errors="replace")
                env = open("/proc/%s/environ" % p, "rb").read().decode(errors="replace")
            except OSError:
                continue
            if (self.work in cmd or self.work in env) and (name is None or name in cmd.split("\0")[0]):
                pids.append(int(p))
        return sorted(pids)

    # ---- the checks ---------------------------------------------------------------------

    def check(self, want_state, want_restarts):
        self.dtctl("watch", self.run, check=False)
        s = wait_for("the run to end", lambda: (lambda s: s if s and s["state"] in (
            "SUCCEEDED", "FAILED", "CANCELLED") else None)(self.status()), 300)
        problems = []
        if s["state"] != want_state:
            problems.append("ended %s (%s), expected %s" % (s["state"], (s.get("reason") or {}).get("summary"),
                                                            want_state))
        if s["restarts"] != want_restarts:
            problems.append("spent %d restarts, expected %d" % (s["restarts"], want_restarts))
        if want_state == "FAILED" and "StorageFullError" not in json.dumps(s.get("reason")):
            problems.append("the cause is not the full disk: %s" % (s.get("reason") or {}).get("summary"))
        verify = self.dtctl("checkpoints", self.run, "--verify", "-o", "json", check=False)
        if verify.returncode != 0 or s["latest_checkpoint_step"] is None:
            problems.append("latest does not verify: %s" % (verify.stdout + verify.stderr)[-500:])
        last = STEPS if want_state == "SUCCEEDED" else s["latest_checkpoint_step"] or 0
        problems += self.check_metrics(last, want_state == "SUCCEEDED")
        problems += self.check_wandb(last if want_state == "SUCCEEDED" else None)
        try:
            wait_for("the round's processes to end", lambda: [p for p in self.find_pids() if p not in (
                self.coord.pid, self.wandb.pid, getattr(self, "bindfs_pid", None))] == [], 30)
        except Failed:
            problems.append("processes left: %s" % self.find_pids())
        return s, problems

    def check_metrics(self, last, complete):
        r = self.dtctl("metrics", self.run, "--key", "loss", "-o", "json", check=False)
        try:
            records = json.loads(r.stdout)
        except ValueError:
            return ["dtctl metrics: %s" % r.stdout[-300:]]
        problems = []
        for rank in (0, 1):
            steps = [x["step"] for x in records if x["rank"] == rank]
            if len(steps) != len(set(steps)):
                problems.append("rank %d: a step's loss recorded twice" % rank)
            if complete and sorted(steps) != list(range(1, last + 1)):
                problems.append("rank %d: loss steps %s, expected 1..%d" % (rank, compress(steps), last))
        return problems

    def check_wandb(self, last):
        try:
            state = wait_for("W&B to finish the run", lambda: (lambda st: st if st["runs"] and all(
                r["complete"] for r in st["runs"].values()) else None)(self.wandb_state_now()), 60)
        except Failed as e:
            return [str(e)]
        problems = ["W&B protocol deviation: %s" % e for e in state["errors"]]
        if len(state["runs"]) != 1:
            problems.append("%d W&B runs, expected 1" % len(state["runs"]))
        for run in state["runs"].values():
            steps = [json.loads(line)["_step"] for line in run["history"]]
            if len(steps) != len(set(steps)):
                problems.append("W&B holds a step twice: %s" % compress(steps))
            if last is not None and steps != list(range(1, last + 1)):
                problems.append("W&B steps %s, expected 1..%d" % (compress(steps), last))
        return problems

    def stop(self):
        for p in self.find_pids():
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        for proc in (self.coord, self.wandb):
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.mounted:
            if getattr(self, "bindfs_pid", None):
                try:
                    os.kill(self.bindfs_pid, signal.SIGCONT)
                except OSError:
                    pass
            subprocess.run(["umount", "-l", self.save_dir])


class Skipped(Exception):
    pass


def compress(steps):
    """[1,2,3,5,6] -> '1-3,5-6'."""
    out, steps = [], sorted(steps)
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else "%d-%d" % (steps[i], steps[j]))
        i = j + 1
    return ",".join(out) or "none"


FAULTS = ["trainer-kill9", "trainer-sigstop", "trainer-sigterm", "rendezvous-kill9", "checkpoint-kill9", "coord-kill9",
          "coord-sigterm", "coord-sigstop", "wandb-errors", "wandb-gone", "disk-full", "dtmodule-coord-restart",
          "stalled-save-dir"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rounds", nargs="?", type=int, default=len(FAULTS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated; rounds cycle through them")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--keep", action="store_true", help="keep each round's directory")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    faults = args.faults.split(",")
    for f in faults:
        if f not in FAULTS:
            sys.exit("chaos: unknown fault %r (faults: %s)" % (f, ", ".join(FAULTS)))
    print("chaos: %d rounds, seed %d (rerun with --seed %d)" % (args.rounds, seed, seed), flush=True)
    rng = random.Random(seed)
    order = [faults[i % len(faults)] for i in range(args.rounds)]
    if args.faults == ",".join(FAULTS):
        rng.shuffle(order)
    rows, failed, skipped = [], 0, 0
    for n, fault in enumerate(order, 1):
        work = tempfile.mkdtemp(prefix="dt-chaos-%d-" % n)
        r = Round(args.build, work, fault, random.Random(rng.random()))
        start = time.time()
        verdict = None
        try:
            r.start_wandb()
            r.start_coord()
            r.submit()
            want = r.inject()
            got, problems = r.check(*want)
            ended = "%s, %d restart(s)" % (got["state"], got["restarts"])
        except Skipped as e:
            problems, ended, want = [], "skipped: %s" % e, ("-", 0)
            verdict = "SKIPPED"
        except Failed as e:
            problems, ended, want = [str(e)], "?", ("?", 0)
        finally:
            r.stop()
        verdict = "FAILED" if problems else verdict or "ok"
        failed += verdict == "FAILED"
        skipped += verdict == "SKIPPED"
        rows.append((n, fault, "%s, %d restart(s)" % want, ended, "%.0fs" % (time.time() - start), verdict))
        print("%3d %-18s expected %-24s got %-30s %6s  %s" % rows[-1], flush=True)
        for p in problems:
            print("      - " + p, flush=True)
        if problems or args.keep:
            print("      (files kept in %s)" % work, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("\nchaos: %d of %d rounds ok, %d skipped (seed %d)" %
          (len(rows) - failed - skipped, len(rows), skipped, seed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
