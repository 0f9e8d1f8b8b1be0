// GPT-2 BPE: the ids of the reference tokenizer (golden ids from OpenAI's tiktoken "gpt2"),
// decoding, and the HF file layout.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "tests/test_util.h"
#include "trainer/dataset.h"
#include "trainer/gpt2_tokenizer.h"

namespace dt {
namespace {

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = Gpt2Tokenizer::Load(JoinPath(testing::DataDir(), "gpt2"));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = t->release();
    golden_ = nlohmann::json::parse(testing::Slurp(JoinPath(DT_SOURCE_DIR, "tests/data/gpt2_golden.json")));
  }
  static void TearDownTestSuite() { delete tokenizer_; }
  static Gpt2Tokenizer* tokenizer_;
  static nlohmann::json golden_;
};
Gpt2Tokenizer* TokenizerTest::tokenizer_ = nullptr;
nlohmann::json TokenizerTest::golden_;

TEST_F(TokenizerTest, HelloWorld) {
  EXPECT_EQ(tokenizer_->Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tokenizer_->vocab_size(), 50257);
  EXPECT_EQ(tokenizer_->eos_id(), 50256);
}

TEST_F(TokenizerTest, MatchesTheReferenceOnMixedText) {
  size_t chars = 0;
  for (const auto& c : golden_["texts"]) {
    std::string text = c["text"];
    chars += text.size();
    std::vector<int32_t> want = c["ids"];
    EXPECT_EQ(tokenizer_->Encode(text), want) << "text: " << nlohmann::json(text).dump();
    auto back = tokenizer_->Decode(want);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);  // byte-level BPE round-trips exactly
  }
  EXPECT_GT(chars, 300u);
}

TEST_F(TokenizerTest, MatchesTheReferenceOnRenderedAlpacaRecords) {
  nlohmann::json records = nlohmann::json::parse(testing::Slurp(JoinPath(testing::DataDir(), "alpaca_sample.json")));
  for (const auto& c : golden_["alpaca_records"]) {
    const auto& r = records[c["record"].get<int>()];
    std::string text = RenderAlpaca(r["instruction"], r.value("input", ""), r["output"]);
    std::vector<int32_t> want = c["ids"];
    EXPECT_EQ(tokenizer_->Encode(text), want) << "record " << c["record"];
  }
}

TEST_F(TokenizerTest, DecodeRefusesUnknownIds) {
  auto bad = tokenizer_->Decode({15496, 60000});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("60000"), std::string::npos);
}

TEST(TokenizerFiles, ReadsTheHuggingFaceLayoutAndNamesWhatIsMissing) {
  testing::TempDir tmp;
  std::string src = JoinPath(testing::DataDir(), "gpt2");
  std::filesystem::copy_file(JoinPath(src, "encoder.json"), JoinPath(tmp.path(), "vocab.json"));
  std::filesystem::copy_file(JoinPath(src, "vocab.bpe"), JoinPath(tmp.path(), "merges.txt"));
  auto hf = Gpt2Tokenizer::Load(tmp.path());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  auto missing = Gpt2Tokenizer::Load(JoinPath(tmp.path(), "nope"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("encoder.json"), std::string::npos);
}

}  // namespace
}  // namespace dt
