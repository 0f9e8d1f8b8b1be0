#!/usr/bin/python3
"""A strict local Weights & Biases server for dt's tests (no network needed).

It speaks the part of the W&B wire protocol the SDK uses (docs/wandb-protocol.md):
Basic auth, the RunResumeStatus query, the UpsertBucket mutation, and file_stream posts with line
offsets. Every deviation from the protocol is recorded as an error; tests fail on any. It records
everything it accepted, and can inject faults (429, 5xx, dropped connections) into file_stream.

  wandb_server.py --port-file F --api-key KEY [--port P] [--state-file S]

--state-file keeps what it accepted across a restart (saved on SIGTERM, loaded at start), so a
test can take W&B away for a while and bring it back on the same --port.

Control endpoints (no auth): GET /_control/state, POST /_control/faults {"faults": [...]}
with faults from "429", "500", "503", "drop" (close before applying), "drop-after" (apply, then
close without answering).
"""
import argparse
import base64
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
RUNS = {}        # "entity/project/name" -> run record
ERRORS = []      # protocol deviations
FAULTS = []      # pending injected faults for file_stream
COUNTS = {"resume": 0, "upsert": 0, "file_stream": 0, "faults_injected": 0}
API_KEY = None
DEFAULT_ENTITY = "dt-test-entity"
RUN_ID = re.compile(r"^[a-z0-9_-]{1,64}$")


def error(msg):
    ERRORS.append(msg)
    sys.stderr.write("wandb_server: DEVIATION: %s\n" % msg)


def key(entity, project, name):
    return "%s/%s/%s" % (entity or DEFAULT_ENTITY, project, name)


def bucket_json(run):
    tail = run["history"][-10:]
    return {
        "id": run["name"], "name": run["name"], "displayName": run["display_name"],
        "summaryMetrics": json.dumps(run["summary"]), "logLineCount": 0,
        "historyLineCount": len(run["history"]), "eventsLineCount": 0,
        "historyTail": json.dumps(tail), "eventsTail": "[]", "config": json.dumps(run["config"]),
        "tags": run["tags"], "wandbConfig": json.dumps(run["config"].get("_wandb", {}).get("value", {})),
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, obj, headers=None):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length", "0"))
        return self.rfile.read(n)

    def authorized(self):
        want = "Basic " + base64.b64encode(("api:" + API_KEY).encode()).decode()
        if self.headers.get("Authorization") != want:
            error("bad or missing Basic auth on %s: %r" % (self.path, self.headers.get("Authorization")))
            self.reply(401, {"error": "unauthorized"})
            return False
        return True

    def do_GET(self):
        if self.path == "/_control/state":
            with LOCK:
                self.reply(200, {"runs": RUNS, "errors": ERRORS, "counts": COUNTS, "pending_faults": FAULTS})
            return
        self.reply(404, {"error": "not found"})

    def do_POST(self):
        raw = self.body()
        if self.path == "/_control/faults":
            with LOCK:
                FAULTS.extend(json.loads(raw)["faults"])
            self.reply(200, {"ok": True})
            return
        if not self.authorized():
            return
        try:
            body = json.loads(raw)
        except ValueError:
            with LOCK:
                error("non-JSON body to %s" % self.path)
            self.reply(400, {"error": "bad json"})
            return
        if self.path == "/graphql":
            self.graphql(body)
            return
        m = re.match(r"^/files/([^/]+)/([^/]+)/([^/]+)/file_stream$", self.path)
        if m:
            self.file_stream(m.group(1), m.group(2), m.group(3), body)
            return
        with LOCK:
            error("unknown endpoint %s" % self.path)
        self.reply(404, {"error": "unknown endpoint"})

    def graphql(self, body):
        query = body.get("query", "")
        v = body.get("variables", {})
        with LOCK:
            if "query RunResumeStatus" in query:
                COUNTS["resume"] += 1
                for field in ("bucket(name: $name, missingOk: true)", "historyLineCount", "historyTail",
                              "eventsLineCount", "logLineCount", 'wandbConfig(keys: ["t"])'):
                    if field not in query:
                        error("RunResumeStatus does not select %s" % field)
                if not isinstance(v.get("name"), str) or not isinstance(v.get("project"), str):
                    error("RunResumeStatus variables need name and project strings: %r" % v)
                run = RUNS.get(key(v.get("entity"), v.get("project"), v.get("name")))
                bucket = bucket_json(run) if run else None
                self.reply(200, {"data": {"model": {"id": "p", "name": v.get("project"),
                                                    "entity": {"id": "e", "name": v.get("entity") or DEFAULT_ENTITY},
                                                    "bucket": bucket}}})
                return
            if "mutation UpsertBucket" in query:
                COUNTS["upsert"] += 1
                name = v.get("name")
                if not isinstance(name, str) or not RUN_ID.match(name):
                    error("UpsertBucket name %r is not a W&B run id" % (name,))
                if not isinstance(v.get("project"), str) or not v.get("project"):
                    error("UpsertBucket without a project")
                cfg_text = v.get("config")
                cfg = {}
                if not isinstance(cfg_text, str):
                    error("UpsertBucket config must be a JSON string, got %r" % type(cfg_text).__name__)
                else:
                    try:
                        cfg = json.loads(cfg_text)
                        if "t" not in cfg.get("_wandb", {}).get("value", {}):
                            error("UpsertBucket config lacks _wandb.value.t")
                        for k, item in cfg.items():
                            if not isinstance(item, dict) or "value" not in item:
                                error("config key %s is not {\"value\": ...}" % k)
                    except ValueError:
                        error("UpsertBucket config is not JSON")
                tags = v.get("tags", [])
                if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                    error("UpsertBucket tags must be a list of strings")
                for field in ("upsertBucket(input:", "project { id name entity { id name } }", "inserted"):
                    if field not in query:
                        error("UpsertBucket does not select %s" % field)
                k = key(v.get("entity"), v.get("project"), name)
                inserted = k not in RUNS
                if not inserted and RUNS[k]["complete"]:
                    # Upserting a finished run resumes it (W&B flips it back to running).
                    RUNS[k]["complete"] = False
                    RUNS[k]["resumed"] = RUNS[k].get("resumed", 0) + 1
                run = RUNS.setdefault(k, {"name": name, "entity": v.get("entity") or DEFAULT_ENTITY,
                                          "project": v.get("project"), "history": [], "summary": {},
                                          "complete": False, "exitcode": None, "upserts": 0, "posts": 0})
                run.update({"display_name": v.get("displayName"), "group": v.get("groupName"),
                            "job_type": v.get("jobType"), "tags": tags, "config": cfg})
                run["upserts"] += 1
                self.reply(200, {"data": {"upsertBucket": {"bucket": {
                    "id": name, "name": name, "displayName": v.get("displayName"), "description": None,
                    "config": cfg_text, "sweepName": None,
                    "project": {"id": "p", "name": v.get("project"),
                                "entity": {"id": "e", "name": run["entity"]}},
                    "historyLineCount": len(run["history"])}, "inserted": inserted}}})
                return
            error("unknown GraphQL operation: %s" % query[:80])
            self.reply(400, {"errors": [{"message": "unknown operation"}]})

    def file_stream(self, entity, project, name, body):
        with LOCK:
            fault = FAULTS.pop(0) if FAULTS else None
            if fault:
                COUNTS["faults_injected"] += 1
        if fault in ("429", "500", "503"):
            headers = {"Retry-After": "1"} if fault == "429" else {}
            self.reply(int(fault), {"error": "injected %s" % fault}, headers)
            return
        if fault == "drop":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        with LOCK:
            COUNTS["file_stream"] += 1
            if self.headers.get("Content-Type") != "application/json":
                error("file_stream Content-Type is %r" % self.headers.get("Content-Type"))
            run = RUNS.get("%s/%s/%s" % (entity, project, name))
            if run is None:
                error("file_stream for %s/%s/%s before UpsertBucket" % (entity, project, name))
                self.reply(404, {"error": "no such run"})
                return
            if run["complete"]:
                error("file_stream for %s after complete" % name)
            run["posts"] += 1
            files = body.get("files", {})
            if not isinstance(body.get("complete"), bool):
                error("file_stream body needs a boolean complete")
            for fname, chunk in files.items():
                if fname == "wandb-history.jsonl":
                    self.history(run, chunk)
                elif fname == "wandb-summary.json":
                    if chunk.get("offset") != 0 or len(chunk.get("content", [])) != 1:
                        error("summary must be one line at offset 0")
                    else:
                        summary = json.loads(chunk["content"][0])
                        if "runtime" not in summary.get("_wandb", {}):
                            error("summary lacks _wandb.runtime")
                        run["summary"] = summary
                elif fname not in ("wandb-events.jsonl", "output.log"):
                    error("unknown file %s" % fname)
            if body.get("complete"):
                if not isinstance(body.get("exitcode"), int):
                    error("complete without an integer exitcode")
                run["complete"] = True
                run["exitcode"] = body.get("exitcode")
        if fault == "drop-after":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.reply(200, {"exitcode": None, "limits": {}})

    def history(self, run, chunk):
        offset = chunk.get("offset")
        lines = chunk.get("content", [])
        have = run["history"]
        if not isinstance(offset, int) or offset < 0:
            error("history offset %r is not a line count" % (offset,))
            return
        if offset > len(have):
            error("history offset %d leaves a gap after line %d" % (offset, len(have)))
            return
        overlap = have[offset:offset + len(lines)]
        if overlap != lines[:len(overlap)]:
            error("history resend at offset %d differs from what was accepted" % offset)
            return
        for line in lines[len(overlap):]:
            try:
                row = json.loads(line)
            except ValueError:
                error("history line is not JSON: %r" % line[:80])
                continue
            for field in ("_step", "_timestamp", "_runtime"):
                if field not in row:
                    error("history line lacks %s: %r" % (field, line[:120]))
            if not isinstance(row.get("_step"), int):
                error("_step is not an integer: %r" % row.get("_step"))
                continue
            if have:
                prev = json.loads(have[-1])["_step"]
                if row["_step"] <= prev:
                    error("_step %d does not increase (previous %d) in %s" % (row["_step"], prev, run["name"]))
            have.append(line)


def main():
    global API_KEY
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--state-file")
    args = ap.parse_args()
    API_KEY = args.api_key
    import os
    import signal
    if args.state_file and os.path.exists(args.state_file):
        with open(args.state_file) as f:
            saved = json.load(f)
        RUNS.update(saved["runs"])
        ERRORS.extend(saved["errors"])
        COUNTS.update(saved["counts"])

    def save_and_exit(signum, frame):
        if args.state_file:
            with LOCK:
                with open(args.state_file + ".tmp", "w") as f:
                    json.dump({"runs": RUNS, "errors": ERRORS, "counts": COUNTS}, f)
                os.rename(args.state_file + ".tmp", args.state_file)
        os._exit(0)

    signal.signal(signal.SIGTERM, save_and_exit)
    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
