// dtrun's pure parts: the environment a child gets (torchrun's variables from the coordinator's
// assignment) and what a failed child's error file or output says.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "client/agent.h"
#include "client/checkpoint_manifest.h"
#include "client/dtrun/child_failure.h"
#include "client/dtrun/worker_env.h"
#include "common/crypto.h"
#include "common/fs.h"
#include "common/run_env.h"
#include "common/utf8.h"
#include "tests/test_util.h"

#include <nlohmann/json.hpp>

namespace dt::run {
namespace {

v1::RegisterResponse Assignment() {
  v1::RegisterResponse a;
  a.set_rank(5);
  a.set_world_size(8);
  a.set_local_rank(1);
  a.set_local_world_size(4);
  a.set_node_rank(1);
  a.set_nodes(2);
  a.set_generation(3);
  a.set_restarts(2);
  a.set_run_id("r-0123456789abcdef");
  a.set_exp_dir("/runs/clm");
  a.mutable_spec()->set_max_restarts(3);
  return a;
}

TEST(WorkerEnvironment, GivesTorchrunsVariablesFromTheAssignment) {
  WorkerContext c{Assignment(),
                  "inc-1",
                  "10.0.0.7",
                  29500,
                  /*agent_store=*/true,
                  "coord:50051",
                  "",
                  "dt_run_secret",
                  "/runs/clm/logs/rank-5.error.json",
                  "",
                  "",
                  "",
                  "",
                  /*stacks_dir=*/"",
                  /*ptracer_pid=*/0,
                  /*inherited_has=*/{},
                  /*inherited_wandb_settings=*/false};
  std::map<std::string, std::string> env = WorkerEnvironment(c);
  std::map<std::string, std::string> want = {{"RANK", "5"},
                                             {"LOCAL_RANK", "1"},
                                             {"WORLD_SIZE", "8"},
                                             {"LOCAL_WORLD_SIZE", "4"},
                                             {"GROUP_RANK", "1"},
                                             {"GROUP_WORLD_SIZE", "2"},
                                             {"ROLE_RANK", "5"},
                                             {"ROLE_WORLD_SIZE", "8"},
                                             {"ROLE_NAME", "default"},
                                             {"MASTER_ADDR", "10.0.0.7"},
                                             {"MASTER_PORT", "29500"},
                                             {"TORCHELASTIC_RESTART_COUNT", "2"},
                                             {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                             {"TORCHELASTIC_RUN_ID", "r-0123456789abcdef"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"TORCHELASTIC_ERROR_FILE", "/runs/clm/logs/rank-5.error.json"},
                                             {"OMP_NUM_THREADS", "1"},
                                             {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
                                             {"DT_COORDINATOR", "coord:50051"},
                                             {"DT_RUN_ID", "r-0123456789abcdef"},
                                             {"DT_RUN_TOKEN", "dt_run_secret"},
                                             {"DT_GENERATION", "3"},
                                             {"DT_INCARNATION", "inc-1"},
                                             {"DT_EXPERIMENT_DIR", "/runs/clm"},
                                             {"DT_LATEST_CHECKPOINT", ""}};
  for (const auto& [k, v] : want) EXPECT_EQ(env[k], v) << k;
  EXPECT_EQ(env.count("DT_TLS_CA"), 0u);
  EXPECT_EQ(env.count("PYTHONPATH"), 0u);
  EXPECT_EQ(env.count("OPENBLAS_CORETYPE"), 0u);  // OpenBLAS's own pick stands
  c.openblas_core = "Cooperlake";
  EXPECT_EQ(WorkerEnvironment(c)["OPENBLAS_CORETYPE"], "Cooperlake");
  c.dt_python_dir = "/opt/dt/share/dt/python";
  EXPECT_EQ(WorkerEnvironment(c)["PYTHONPATH"], "/opt/dt/share/dt/python");
  c.inherited_python_path = "/home/me/lib";
  EXPECT_EQ(WorkerEnvironment(c)["PYTHONPATH"], "/opt/dt/share/dt/python:/home/me/lib");
}

TEST(WorkerEnvironment, LeavesTheUsersThreadsAloneAndNamesTheCheckpointToResume) {
  v1::RegisterResponse a = Assignment();
  a.mutable_resume()->set_path("/runs/clm/checkpoints/step-200");
  WorkerContext c{a, "inc", "h", 1, false, "c:1", "/ca.pem", "t", "/e", "8", "", "", "", "", 0, {}, false};
  std::map<std::string, std::string> env = WorkerEnvironment(c);
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);  // inherited as the user set it
  EXPECT_EQ(env["DT_LATEST_CHECKPOINT"], "/runs/clm/checkpoints/step-200");
  EXPECT_EQ(env["DT_TLS_CA"], "/ca.pem");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");  // rank 0's process hosts the store
  a.set_local_world_size(1);
  WorkerContext one{a, "inc", "h", 1, false, "c:1", "", "t", "/e", "", "", "", "", "", 0, {}, false};
  EXPECT_EQ(WorkerEnvironment(one).count("OMP_NUM_THREADS"), 0u);  // one process per node: all cores
}

// The run's variables win over dt's defaults; the W&B identity comes with a project (or the
// user's WANDB_* settings) and leaves what the user set alone.
TEST(WorkerEnvironment, TheRunsVariablesAndTheW_BIdentity) {
  v1::RegisterResponse a = Assignment();
  a.mutable_spec()->set_experiment_name("clm");
  a.mutable_spec()->set_save_dir("/runs");
  (*a.mutable_spec()->mutable_env())["OMP_NUM_THREADS"] = "6";
  (*a.mutable_spec()->mutable_env())["PYTHONPATH"] = "/mine";
  (*a.mutable_spec()->mutable_env())["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "0";
  WorkerContext c{a,  "inc", "h", 1,  false, "c:1", "", "t", "/e", "", "/opt/dt/python", "/inherited",
                  "", "",    0,   {}, false};
  std::map<std::string, std::string> env = WorkerEnvironment(c);
  EXPECT_EQ(env["OMP_NUM_THREADS"], "6");  // over dt's 1 a process
  EXPECT_EQ(env["PYTHONPATH"], "/opt/dt/python:/mine");
  EXPECT_EQ(env["TORCH_NCCL_DUMP_ON_TIMEOUT"], "0");
  EXPECT_EQ(env.count("WANDB_RUN_ID"), 0u);  // no project, no WANDB_* settings

  a.mutable_spec()->mutable_wandb()->set_project("proj");
  a.mutable_spec()->mutable_wandb()->add_tags("a");
  a.mutable_spec()->mutable_wandb()->add_tags("b");
  c.assignment = a;
  env = WorkerEnvironment(c);
  EXPECT_EQ(env["WANDB_RUN_ID"], Sha1Hex("/runs/clm"));
  EXPECT_EQ(env["WANDB_PROJECT"], "proj");
  EXPECT_EQ(env["WANDB_TAGS"], "a,b");
  EXPECT_EQ(env["WANDB_RUN_GROUP"], "clm");
  EXPECT_EQ(env["WANDB_MODE"], "disabled");  // rank 5 under main
  EXPECT_EQ(env["WANDB_DIR"], "/runs/clm/wandb");

  a.mutable_spec()->set_log_strategy(v1::NODE);
  c.assignment = a;
  EXPECT_EQ(WorkerEnvironment(c)["WANDB_MODE"], "disabled");  // local rank 1
  a.set_local_rank(0);
  c.assignment = a;
  env = WorkerEnvironment(c);
  EXPECT_EQ(env.count("WANDB_MODE"), 0u);
  EXPECT_EQ(env["WANDB_RUN_ID"], "clm-node1");

  c.inherited_has = [](const std::string& name) { return name == "WANDB_RUN_ID" || name == "WANDB_DIR"; };
  env = WorkerEnvironment(c);
  EXPECT_EQ(env.count("WANDB_RUN_ID"), 0u);  // the user's stands
  EXPECT_EQ(env.count("WANDB_DIR"), 0u);
  EXPECT_EQ(env["WANDB_RESUME"], "allow");
}

TEST(RunEnv, RefusesDtsOwnNamesMalformedNamesAndOversizedSets) {
  auto check = [](std::map<std::string, std::string> env) { return ValidateRunEnv(env); };
  EXPECT_TRUE(check({{"HF_HOME", "/x"}, {"_A1", ""}, {"WANDB_MODE", "offline"}}).ok());
  for (const char* name : {"RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID", "DT_RUN_TOKEN"}) {
    absl::Status s = check({{name, "1"}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find(absl::StrCat("environment variable ", name, " cannot be set")), std::string::npos) << s;
  }
  for (const char* name : {"1A", "A-B", "A B", ""}) EXPECT_FALSE(check({{name, "1"}}).ok()) << name;
  EXPECT_FALSE(check({{"A", std::string("a\0b", 3)}}).ok());
  EXPECT_FALSE(check({{"A", std::string(kMaxRunEnvValueBytes + 1, 'x')}}).ok());
  std::map<std::string, std::string> many;
  for (int i = 0; i <= kMaxRunEnvVars; ++i) many[absl::StrCat("V", i)] = "1";
  EXPECT_NE(check(many).message().find("exceed the limit of 256"), std::string::npos);
  std::map<std::string, std::string> big;
  for (int i = 0; i < 9; ++i) big[absl::StrCat("V", i)] = std::string(kMaxRunEnvValueBytes, 'x');
  EXPECT_NE(check(big).message().find("over the limit"), std::string::npos);
}

TEST(RunEnv, ReadsAssignmentsAndEnvFiles) {
  std::map<std::string, std::string> env;
  EXPECT_TRUE(ParseEnvAssignment("A=b=c", &env).ok());
  EXPECT_TRUE(ParseEnvAssignment("EMPTY=", &env).ok());
  EXPECT_FALSE(ParseEnvAssignment("=x", &env).ok());
  EXPECT_FALSE(ParseEnvAssignment("NOEQUALS", &env).ok());
  EXPECT_TRUE(ParseEnvFile("f", "# c\n\nexport B='x y'\nC=\"q\"\n  D = 1\nE='unmatched\nA=again\n", &env).ok());
  std::map<std::string, std::string> want = {{"A", "again"}, {"EMPTY", ""}, {"B", "x y"},
                                             {"C", "q"},     {"D", " 1"},   {"E", "'unmatched"}};
  EXPECT_EQ(env, want);
  absl::Status s = ParseEnvFile("run.env", "A=1\nbroken\n", &env);
  EXPECT_EQ(s.message(), "env file run.env line 2: \"broken\" is not KEY=VALUE");
}

// The child's error file, written where dtrun would find it.
std::string ErrorFile(const testing::TempDir& tmp, const std::string& contents) {
  std::string path = JoinPath(tmp.path(), "error.json");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
  return path;
}

TEST(ChildFailure, TorchRecordErrorFileGivesTypeMessageAndTraceback) {
  testing::TempDir tmp;
  std::string file = R"({"message": {"message": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
      "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 9, in main\n    step()\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n", "timestamp": "1700000000"}}})";
  ChildFailure f = DescribeChildFailure(ErrorFile(tmp, file), "unrelated output\n", "pid 7 exited with code 1");
  EXPECT_EQ(f.exception_type, "RuntimeError");
  EXPECT_EQ(f.message, "CUDA out of memory. Tried to allocate 2.00 GiB (pid 7 exited with code 1)");
  EXPECT_NE(f.stack.find("File \"train.py\", line 9"), std::string::npos) << f.stack;
}

TEST(ChildFailure, WithoutAnErrorFileTheTracebacksLastLineNamesTheException) {
  std::string output =
      "step 1 loss 4.1\nTraceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n"
      "    main()\ntorch.distributed.DistBackendError: [1] is setting up NCCL communicator\n";
  ChildFailure f = DescribeChildFailure("", output, "pid 9 exited with code 1");
  EXPECT_EQ(f.exception_type, "torch.distributed.DistBackendError");
  EXPECT_EQ(f.message, "[1] is setting up NCCL communicator (pid 9 exited with code 1)");
  EXPECT_NE(f.stack.find("Traceback"), std::string::npos);
}

TEST(ChildFailure, ACrashWithoutATracebackIsTheExitWithTheLastLines) {
  testing::TempDir tmp;
  ChildFailure f = DescribeChildFailure(ErrorFile(tmp, "not json"), "loading\nSegmentation fault\n",
                                        "pid 3 killed by signal 11 (SIGSEGV)");
  EXPECT_EQ(f.exception_type, "");
  EXPECT_EQ(f.message, "pid 3 killed by signal 11 (SIGSEGV)");
  EXPECT_EQ(f.stack, "loading\nSegmentation fault");
  // A line that only looks like an exception, outside a traceback, is not one.
  f = DescribeChildFailure("", "ValueError: printed by the program\n", "pid 3 exited with code 2");
  EXPECT_EQ(f.exception_type, "");
}

TEST(ChildFailure, LastLinesKeepsWholeLinesWithinTheBudget) {
  EXPECT_EQ(LastLines("a\nb\nc\nd\n", 2, 100), "c\nd");
  EXPECT_EQ(LastLines("aaaa\nbbbb\ncccc", 10, 9), "bbbb\ncccc");
  std::string one_long_line(100, 'x');
  EXPECT_EQ(LastLines(one_long_line, 3, 10).size(), 10u);
  EXPECT_EQ(LastLines("", 3, 10), "");
}

// A message of any length: parsed in one pass (a backtracking regex on a 30,000-character line
// overflowed dtrun's stack), reported with its head and tail, the exception's type kept.
TEST(ChildFailure, AHugeMessageKeepsItsTypeHeadAndTail) {
  testing::TempDir tmp;
  for (size_t size : {size_t{30'000}, size_t{1} << 20, size_t{100} << 20}) {
    std::string message = "ValueError: START" + std::string(size, 'x') + "END";
    std::string json = "{\"message\": {\"message\": \"" + message + "\", \"extraInfo\": {\"py_callstack\": \"" +
                       "Traceback (most recent call last):\\n  File \\\"t.py\\\", line 1\\n" + message + "\"}}}";
    absl::Time start = absl::Now();
    ChildFailure f = DescribeChildFailure(ErrorFile(tmp, json), "", "pid 4 exited with code 1");
    EXPECT_EQ(f.exception_type, "ValueError") << size;
    EXPECT_EQ(f.message.rfind("START", 0), 0u) << size;
    EXPECT_NE(f.message.find("END (pid 4 exited with code 1)"), std::string::npos) << size;
    EXPECT_NE(f.message.find("bytes cut"), std::string::npos) << size;
    EXPECT_LT(f.message.size(), 8u << 10) << size;
    EXPECT_LT(f.stack.size(), 20u << 10) << size;
    EXPECT_NE(f.stack.find("END"), std::string::npos) << size;
    EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << size;  // one pass, not a backtracking crawl
  }
  // The same line without an error file: the output's last line.
  std::string line = "Traceback (most recent call last):\nKeyError: " + std::string(30'000, 'k') + "\n";
  ChildFailure f = DescribeChildFailure("", line, "pid 5 exited with code 1");
  EXPECT_EQ(f.exception_type, "KeyError");
  EXPECT_LT(f.message.size(), 8u << 10);
  std::string k;
  EXPECT_TRUE(SplitException("KeyError: " + std::string(1'000'000, 'k'), &k, &line));
  EXPECT_EQ(k, "KeyError");
  EXPECT_FALSE(SplitException(std::string(1'000'000, 'a') + "Error:x", &k, &line));  // no ": "
}

// Bytes that are not UTF-8, in the error file or the output: replaced, so the coordinator (whose
// protobuf strings must be UTF-8) takes the report.
TEST(ChildFailure, InvalidUtf8IsReplacedEverywhere) {
  testing::TempDir tmp;
  std::string bad = "caf\xC3 \xFF\xFE na\xEF\xBF";
  ChildFailure f = DescribeChildFailure(ErrorFile(tmp, "{\"message\": \"ValueError: " + bad + "\"}"), "",
                                        "pid 6 exited with code 1");
  EXPECT_EQ(f.exception_type, "ValueError");
  EXPECT_TRUE(IsValidUtf8(f.message)) << f.message;
  EXPECT_NE(f.message.find("caf"), std::string::npos);
  // Python's json.dump of text decoded with surrogateescape: a lone surrogate's escape.
  f = DescribeChildFailure(ErrorFile(tmp, R"({"message": "OSError: bad name caf\udcc3\udca9 \\udcff"})"), "",
                           "pid 6 exited with code 1");
  EXPECT_EQ(f.exception_type, "OSError");
  EXPECT_NE(f.message.find("bad name caf"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("\\udcff"), std::string::npos) << f.message;  // an escaped backslash stays text
  f = DescribeChildFailure("", "Traceback (most recent call last):\n  File \"x\xFF.py\"\nValueError: \xFE" + bad + "\n",
                           "pid 6 exited with code 1");
  EXPECT_EQ(f.exception_type, "ValueError");
  EXPECT_TRUE(IsValidUtf8(f.message)) << f.message;
  EXPECT_TRUE(IsValidUtf8(f.stack)) << f.stack;
}

TEST(HeadAndTailUtf8, KeepsBothEndsAtCharacterBoundaries) {
  EXPECT_EQ(HeadAndTailUtf8("short", 100), "short");
  std::string text = "αβγ" + std::string(1000, 'x') + "ωψχ";
  std::string kept = HeadAndTailUtf8(text, 40);
  EXPECT_TRUE(IsValidUtf8(kept)) << kept;
  EXPECT_EQ(kept.rfind("αβγ", 0), 0u);
  EXPECT_EQ(kept.substr(kept.size() - 6), "ωψχ");
  EXPECT_NE(kept.find("bytes cut"), std::string::npos);
  for (size_t max = 1; max < 20; ++max) EXPECT_TRUE(IsValidUtf8(HeadAndTailUtf8("€€€€€€€€€€€€€€€€", max))) << max;
}

// A LibTorch program's checkpoint writer commits what it saved: plain files with size and SHA-256.
TEST(ManifestOfDirectory, ListsPlainFilesWithSizesAndDigestsAndRefusesAnythingElse) {
  testing::TempDir tmp;
  std::string dir = tmp.Sub("round");
  std::ofstream(JoinPath(dir, "model.pt")) << "weights";
  std::ofstream(JoinPath(dir, "step.txt")) << "10\n";
  absl::StatusOr<v1::Manifest> m = ManifestOfDirectory(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->files_size(), 2);
  EXPECT_EQ(m->files(0).name(), "model.pt");
  EXPECT_EQ(m->files(0).size(), 7);
  EXPECT_EQ(m->files(0).sha256(), Sha256Hex("weights"));
  EXPECT_EQ(m->files(1).name(), "step.txt");
  ASSERT_EQ(::mkdir(JoinPath(dir, "optimizer").c_str(), 0755), 0);
  m = ManifestOfDirectory(dir);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("optimizer is not a plain file"), std::string::npos) << m.status();
  m = ManifestOfDirectory(tmp.Sub("empty"));
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("saved nothing"), std::string::npos) << m.status();
}

// A published checkpoint's files: all found at their sizes when opened, each hashed only when its
// reader verifies it. A rank that resumes a ZeRO-1 share reads (and hashes) its own share, so
// another rank's damaged share does not stop it, and its own does.
TEST(CheckpointFiles, OpeningChecksEverySizeAndVerifyHashesOnlyTheFileNamed) {
  testing::TempDir tmp;
  std::string dir = tmp.Sub("step-10");
  std::ofstream(JoinPath(dir, "mine.pt")) << "my share";
  std::ofstream(JoinPath(dir, "theirs.pt")) << "their share";
  absl::StatusOr<v1::Manifest> m = ManifestOfDirectory(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  nlohmann::json files = nlohmann::json::array();
  for (const v1::ManifestFile& f : m->files()) {
    files.push_back({{"name", f.name()}, {"size", f.size()}, {"sha256", f.sha256()}});
  }
  std::ofstream(JoinPath(dir, "manifest.json")) << nlohmann::json{{"step", 10}, {"files", files}}.dump();
  absl::StatusOr<CheckpointFiles> opened = CheckpointFiles::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->names(), (std::vector<std::string>{"mine.pt", "theirs.pt"}));
  EXPECT_EQ(opened->total_bytes(), 8 + 11);
  // The other share's bytes change, not its size.
  std::ofstream(JoinPath(dir, "theirs.pt")) << "THEIR SHARE";
  opened = CheckpointFiles::Open(dir);
  ASSERT_TRUE(opened.ok()) << "sizes only: " << opened.status();
  EXPECT_TRUE(opened->Verify("mine.pt").ok());
  absl::Status theirs = opened->Verify("theirs.pt");
  EXPECT_EQ(theirs.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(theirs.message()), ::testing::HasSubstr("theirs.pt does not match its manifest"));
  EXPECT_EQ(opened->Verify("unlisted.pt").code(), absl::StatusCode::kDataLoss);
  absl::StatusOr<int64_t> whole = VerifyCheckpointDirectory(dir);
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kDataLoss) << "dtctl's --verify hashes every file";
  // A file of another size, or missing, refuses the whole checkpoint at once.
  std::ofstream(JoinPath(dir, "theirs.pt")) << "short";
  opened = CheckpointFiles::Open(dir);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(opened.status().message()), ::testing::HasSubstr("5 bytes on disk but 11 in its manifest"));
  ASSERT_EQ(::unlink(JoinPath(dir, "theirs.pt").c_str()), 0);
  opened = CheckpointFiles::Open(dir);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(opened.status().message()), ::testing::HasSubstr("theirs.pt is missing"));
}

// A program started outside dtrun is told what is missing and how to start it.
TEST(AttachToDtrun, OutsideDtrunNamesWhatIsMissing) {
  for (const char* name : {"DT_RUN_ID", "DT_COORDINATOR", "DT_RUN_TOKEN", "DT_GENERATION", "DT_INCARNATION",
                           "DT_TIMEOUTS", "DT_EXPERIMENT_DIR", "RANK", "WORLD_SIZE"}) {
    ::unsetenv(name);
  }
  ::setenv("RANK", "one", 1);
  absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::AttachToDtrun();
  ::unsetenv("RANK");
  ASSERT_EQ(agent.status().code(), absl::StatusCode::kFailedPrecondition) << agent.status();
  std::string message(agent.status().message());
  for (const char* name : {"DT_COORDINATOR", "DT_RUN_ID", "DT_INCARNATION", "WORLD_SIZE", "RANK (not a number)"}) {
    EXPECT_NE(message.find(name), std::string::npos) << name << " in " << message;
  }
  EXPECT_NE(message.find("dtctl submit --exec"), std::string::npos) << message;
}

// The signal came with the time limit when the job's end (exported by the batch script) is
// within the grace plus the minute Slurm may signal early; a preemption any time before that.
TEST(TimeLimit, TheSignalWithinTheGraceOfTheJobsEndIsTheTimeLimit) {
  absl::Time end = absl::FromUnixSeconds(1'800'000'000);
  ::setenv("DT_JOB_END_TIME", "1800000000", 1);
  ::setenv("DT_PREEMPT_GRACE", "120", 1);
  EXPECT_TRUE(NearTheJobsTimeLimit(end - absl::Seconds(120)));
  EXPECT_TRUE(NearTheJobsTimeLimit(end - absl::Seconds(179)));   // Slurm's early minute
  EXPECT_FALSE(NearTheJobsTimeLimit(end - absl::Seconds(200)));  // a preemption
  ::setenv("DT_JOB_END_TIME", "", 1);                            // no time limit
  EXPECT_FALSE(NearTheJobsTimeLimit(end));
  ::unsetenv("DT_JOB_END_TIME");
  ::unsetenv("DT_PREEMPT_GRACE");
  EXPECT_FALSE(NearTheJobsTimeLimit(end));
}

}  // namespace
}  // namespace dt::run
