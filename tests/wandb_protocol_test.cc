// file_stream bodies as the W&B SDK sends them. The history lines are written as text, not built as
// JSON objects: they must read back as the objects nlohmann would have written, whatever the names
// and values, and the body must stay one valid JSON document.
#include "coordinator/wandb/wandb_protocol.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"

namespace dt::wandb {
namespace {

struct TestRow {
  int64_t step;
  double time, runtime;
  std::vector<NamedValue> values;
};

nlohmann::json Number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// The body as it was built with a JSON object per line: what W&B received before.
nlohmann::json Expected(const std::vector<std::string>& names, const std::vector<TestRow>& rows, int64_t offset,
                        const std::string& summary) {
  nlohmann::json lines = nlohmann::json::array();
  for (const TestRow& r : rows) {
    nlohmann::json line = nlohmann::json::object();
    for (const NamedValue& v : r.values) line[names[v.name]] = Number(v.value);
    line["_step"] = r.step;
    line["_timestamp"] = r.time;
    line["_runtime"] = r.runtime;
    lines.push_back(line);
  }
  return {{"complete", false},
          {"files",
           {{"wandb-history.jsonl", {{"offset", offset}, {"content", lines}}},
            {"wandb-summary.json", {{"offset", 0}, {"content", {summary}}}}}}};
}

// The line as nlohmann writes it with the keys in the order HistoryContent writes them: the row's
// values (the reserved names left out), then _step, _timestamp, _runtime.
nlohmann::ordered_json OrderedLine(const std::vector<std::string>& names, const TestRow& r) {
  nlohmann::ordered_json line = nlohmann::ordered_json::object();
  for (const NamedValue& v : r.values) {
    const std::string& name = names[v.name];
    if (name == "_step" || name == "_timestamp" || name == "_runtime") continue;
    line[name] = std::isfinite(v.value) ? nlohmann::ordered_json(v.value) : nlohmann::ordered_json(nullptr);
  }
  line["_step"] = r.step;
  line["_timestamp"] = r.time;
  line["_runtime"] = r.runtime;
  return line;
}

TEST(FileStreamBody, HistoryLinesReadBackAsTheObjectsNlohmannWritesForAnyNameAndValue) {
  const double inf = std::numeric_limits<double>::infinity();
  // Names ingest refuses but JSON must carry (a quote, a backslash, UTF-8, a tab), and the three
  // W&B reserves for its own fields.
  const std::vector<std::string> names = {"loss", "we\"ird\\name", "\xc3\xbc/metric", "_step",
                                          "lr",   "tab\there",     "_timestamp",      "_runtime"};
  const std::vector<TestRow> rows = {
      {1, 1700000000.25, 0.5, {{0, 2.5}, {1, 1e-5}, {2, 100.0}, {4, 0.1}}},
      {2, 1700000001.125, 1.375, {{0, std::nan("")}, {1, inf}, {2, -inf}, {3, 7.0}, {5, -0.0}, {6, 1.0}, {7, 2.0}}},
      {3, 1700000002.0, 2.0, {}},
      {4, 1700000003.5, 3.5, {{4, 1e300}, {0, 5e-324}, {2, 123456789.125}, {5, -2.2250738585072014e-308}}},
  };
  HistoryContent history(names);
  for (const TestRow& r : rows) history.AddLine(r.step, r.time, r.runtime, r.values);
  ASSERT_EQ(history.lines(), 4);
  const std::string summary = R"({"loss":2.5,"_step":4})";
  const std::string body = FileStreamBody(7, history, summary, std::nullopt);

  nlohmann::json got = nlohmann::json::parse(body, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << "not one JSON document: " << body;
  nlohmann::json want = Expected(names, rows, 7, summary);
  nlohmann::json& content = got["files"]["wandb-history.jsonl"]["content"];
  ASSERT_EQ(content.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_TRUE(content[i].is_string()) << "a history line is a JSON string: " << content[i];
    const std::string text = content[i].get<std::string>();
    nlohmann::json line = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(line.is_discarded()) << "line " << i << " is not JSON: " << text;
    EXPECT_EQ(line, want["files"]["wandb-history.jsonl"]["content"][i]) << "line " << i << ": " << text;
    // Byte for byte what nlohmann writes for the same keys in the same order: every number's text too.
    EXPECT_EQ(text, OrderedLine(names, rows[i]).dump());
    for (const char* reserved : {"\"_step\"", "\"_timestamp\"", "\"_runtime\""}) {
      std::vector<absl::string_view> around = absl::StrSplit(text, reserved);
      EXPECT_EQ(around.size(), 2u) << "a metric named " << reserved << " must not give the line a second key: " << text;
    }
    content[i] = line;
  }
  EXPECT_EQ(got, want);
}

TEST(FileStreamBody, ABodyWithoutHistoryIsTheSdksFinalPostByteForByte) {
  const std::string summary = R"({"loss":1.25,"_wandb":{"runtime":12}})";
  nlohmann::json files = {{"wandb-summary.json", {{"offset", 0}, {"content", {summary}}}}};
  EXPECT_EQ(FileStreamBody(3, HistoryContent({}), summary, 0),
            nlohmann::json({{"files", files}, {"complete", true}, {"exitcode", 0}}).dump());
  EXPECT_EQ(FileStreamBody(3, HistoryContent({}), summary, std::nullopt),
            nlohmann::json({{"files", files}, {"complete", false}}).dump());
  EXPECT_EQ(FileStreamBody(3, HistoryContent({}), std::nullopt, 1),
            nlohmann::json({{"files", nlohmann::json::object()}, {"complete", true}, {"exitcode", 1}}).dump());
}

}  // namespace
}  // namespace dt::wandb
