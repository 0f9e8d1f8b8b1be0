// dtctl logs' pure parts: a rank's lines timed by dtslot's times file or their own ISO time,
// merged across ranks in time order, and lines every rank printed folded into one.
#include <gtest/gtest.h>

#include <fstream>

#include "client/dtctl/logs.h"
#include "common/fs.h"
#include "tests/test_util.h"

namespace dt::ctl {
namespace {

TEST(DtctlLogs, ReadsTimesAndIsoTimes) {
  EXPECT_EQ(ParseLogTimes("12 1000\nbad\n30 2000\n"),
            (std::vector<std::pair<int64_t, int64_t>>{{12, 1000}, {30, 2000}}));
  EXPECT_EQ(LeadingIsoMicros("2026-11-27T10:19:52.230Z I dttrainer rank 0] ready"), int64_t{1795774792230000});
  EXPECT_FALSE(LeadingIsoMicros("step 1 loss 4.19").has_value());
  EXPECT_FALSE(LeadingIsoMicros("2026-11-27 not a time").has_value());
}

// Each line takes the time of the chunk that brought it; a line with its own time keeps it; a
// line without either takes its predecessor's; a rank's order never changes.
TEST(DtctlLogs, ARanksLinesAreTimedByTheirChunks) {
  testing::TempDir tmp;
  std::string log = JoinPath(tmp.path(), "rank-0.log");
  std::ofstream(log) << "header\nfirst\nsecond\n2026-11-27T10:19:52.230Z own time\nlast";
  // "header\n" (7 bytes) came before any record; "first\nsecond\n" in one chunk ending at 20.
  std::ofstream(log + ".times") << "20 5000\n60 4000\n";
  RankLogReader reader(0, log);
  std::vector<TimedLine> lines = reader.Read(/*final=*/false);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].text, "header");
  EXPECT_EQ(lines[0].micros, 5000);  // the next chunk's time: written just before it
  EXPECT_EQ(lines[1].micros, 5000);
  EXPECT_EQ(lines[2].micros, 5000);
  EXPECT_EQ(lines[3].text, "2026-11-27T10:19:52.230Z own time");
  EXPECT_EQ(lines[3].micros, 1795774792230000);
  EXPECT_TRUE(reader.Read(false).empty());  // "last" has no newline yet
  std::vector<TimedLine> rest = reader.Read(/*final=*/true);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].text, "last");
  EXPECT_EQ(rest[0].micros, 1795774792230000);  // never before its predecessor
  EXPECT_TRUE(reader.Read(true).empty());       // nothing is read twice
  std::ofstream(log, std::ios::app) << " more\n";
  std::vector<TimedLine> added = reader.Read(true);
  ASSERT_EQ(added.size(), 1u);
  EXPECT_EQ(added[0].text, " more");
}

TEST(DtctlLogs, MergesRanksByTimeKeepingEachRanksOrder) {
  std::vector<TimedLine> merged =
      MergeByTime({{{0, 10, "a"}, {0, 30, "c"}, {0, 30, "d"}}, {{1, 20, "b"}, {1, 30, "e"}, {1, 40, "f"}}});
  std::string order;
  for (const auto& l : merged) order += l.text;
  EXPECT_EQ(order, "abcdef");
}

TEST(DtctlLogs, FoldsLinesEveryRankPrinted) {
  std::vector<TimedLine> lines = {{0, 1, "loading"}, {1, 1, "loading"}, {2, 1, "loading"}, {1, 2, "only one"},
                                  {0, 3, "epoch"},   {2, 3, "epoch"},   {0, 4, "epoch"},   {1, 5, "epoch"}};
  std::vector<std::string> out;
  for (const PrintedLine& p : FoldRepeated(lines, 3)) out.push_back(FormatPrinted(p));
  EXPECT_EQ(out, (std::vector<std::string>{"[ranks 0-2] loading", "[rank 1] only one", "[ranks 0-2] epoch",
                                           "[rank 0] epoch"}));
  // A line only some ranks printed names them; past the window nothing joins it.
  lines = {{0, 1, "x"}, {2, 2, "x"}, {1, 3, "y"}, {1, 4, "x"}};
  out.clear();
  for (const PrintedLine& p : FoldRepeated(lines, 3, /*window=*/2)) out.push_back(FormatPrinted(p));
  EXPECT_EQ(out, (std::vector<std::string>{"[ranks 0,2] x", "[rank 1] y", "[rank 1] x"}));
}

}  // namespace
}  // namespace dt::ctl
