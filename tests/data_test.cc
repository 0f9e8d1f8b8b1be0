// Datasets (formats and errors that name the record), the token cache, the distributed sampler,
// and the learning-rate schedule.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "common/fs.h"
#include "tests/test_util.h"
#include "trainer/dataset.h"
#include "trainer/gpt2_tokenizer.h"
#include "trainer/lr_schedule.h"
#include "trainer/sampler.h"
#include "trainer/token_cache.h"

namespace dt {
namespace {

std::string Write(const testing::TempDir& tmp, const std::string& name, const std::string& content) {
  std::string path = JoinPath(tmp.path(), name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(Dataset, AlpacaJsonUsesThePromptTemplate) {
  testing::TempDir tmp;
  std::string path = Write(tmp, "a.json",
                           R"([{"instruction": "Add.", "input": "1 and 2", "output": "3"},
                               {"instruction": "Greet.", "output": "Hi"}])");
  auto docs = LoadDocuments(path);
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->size(), 2u);
  EXPECT_EQ((*docs)[0],
            "Below is an instruction that describes a task, paired with an input that provides further context. "
            "Write a response that appropriately completes the request.\n\n### Instruction:\nAdd.\n\n"
            "### Input:\n1 and 2\n\n### Response:\n3");
  EXPECT_EQ((*docs)[1],
            "Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\nGreet.\n\n### Response:\nHi");
}

TEST(Dataset, JsonlTextAndPlainText) {
  testing::TempDir tmp;
  auto jsonl = LoadDocuments(Write(tmp, "t.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\"}\n"));
  ASSERT_TRUE(jsonl.ok());
  EXPECT_EQ(*jsonl, (std::vector<std::string>{"one", "two"}));
  auto txt = LoadDocuments(Write(tmp, "t.txt", "To be, or not to be"));
  ASSERT_TRUE(txt.ok());
  EXPECT_EQ(txt->size(), 1u);
}

TEST(Dataset, MalformedInputNamesTheFileAndTheRecord) {
  testing::TempDir tmp;
  struct Case {
    std::string name, content, words;
  } cases[] = {
      {"bad.json", R"([{"instruction": "x", "output": "y"}, {"instruction": "x"}])", "record 1: missing \"output\""},
      {"bad2.json", R"({"instruction": "x"})", "expected a JSON array"},
      {"bad3.json", R"([{"instruction": 5, "output": "y"}])", "record 0: \"instruction\" is not a string"},
      {"bad.jsonl", "{\"text\": \"ok\"}\n{broken\n", "line 2: not valid JSON"},
      {"bad2.jsonl", "{\"text\": \"ok\"}\n{\"prompt\": \"?\"}\n", "line 2: neither"},
      {"empty.json", "[]", "holds no records"},
      {"x.csv", "a,b", "must end in .json"},
  };
  for (const auto& c : cases) {
    std::string path = Write(tmp, c.name, c.content);
    auto r = LoadDocuments(path);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(c.words), std::string::npos) << r.status();
    if (c.name != "x.csv") {
      EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
    }
  }
  EXPECT_EQ(LoadDocuments(JoinPath(tmp.path(), "missing.json")).status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenCache, AlpacaTokenizesInSecondsAndRoundTrips) {
  testing::TempDir tmp;
  auto tok = Gpt2Tokenizer::Load(JoinPath(testing::DataDir(), "gpt2"));
  ASSERT_TRUE(tok.ok());
  std::string dataset = JoinPath(testing::DataDir(), "alpaca_sample.json");
  auto name = TokenCacheName(dataset, (*tok)->fingerprint());
  ASSERT_TRUE(name.ok());
  std::string path = JoinPath(tmp.path(), *name);
  ASSERT_TRUE(BuildTokenCache(dataset, **tok, path).ok());
  auto cache = TokenCache::Open(path);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_GT((*cache)->size(), 300'000);
  // Documents are separated by EOS: 5,000 records, 5,000 EOS tokens.
  int64_t eos = 0;
  for (int64_t i = 0; i < (*cache)->size(); ++i) eos += (**cache)[i] == (*tok)->eos_id();
  EXPECT_EQ(eos, 5000);
  // The first record decodes back to its rendered text.
  std::vector<int32_t> first;
  for (int64_t i = 0; (**cache)[i] != (*tok)->eos_id(); ++i) first.push_back((**cache)[i]);
  auto docs = LoadDocuments(dataset);
  ASSERT_TRUE(docs.ok());
  EXPECT_EQ((*tok)->Decode(first).value(), docs->front());
  // A different tokenizer or a modified dataset gives another cache name.
  EXPECT_NE(*TokenCacheName(dataset, "other"), *name);
}

TEST(Sampler, ShardsAreDisjointCoverTheEpochAndMatchALargerSingleRankBatch) {
  const int64_t n = 103;
  const int world = 3, batch = 4;
  std::vector<DistributedSampler> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(n, world, r, batch, 42);
  DistributedSampler single(n, 1, 0, batch * world, 42);
  EXPECT_EQ(ranks[0].batches_per_epoch(), (n / world) / batch);
  EXPECT_EQ(single.batches_per_epoch(), ranks[0].batches_per_epoch());
  std::set<int64_t> seen;
  for (int64_t b = 0; b < ranks[0].batches_per_epoch(); ++b) {
    std::multiset<int64_t> union_of_ranks;
    for (int r = 0; r < world; ++r) {
      for (int64_t i : ranks[r].Batch(0, b)) {
        EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " seen twice";
        EXPECT_LT(i, n);
        union_of_ranks.insert(i);
      }
    }
    std::vector<int64_t> one = single.Batch(0, b);
    EXPECT_EQ(union_of_ranks, std::multiset<int64_t>(one.begin(), one.end()));
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(ranks[0].batches_per_epoch() * batch * world));
}

// With a global batch, every shape that makes it (ranks x batch x accumulation) sees the same
// samples in each optimizer step, and an epoch is the same whole number of steps for all of them.
TEST(Sampler, AGlobalBatchGivesEveryShapeTheSameSamplesPerStep) {
  const int64_t n = 1003, global = 24;
  struct Shape {
    int world, batch;
  } shapes[] = {{4, 2}, {2, 2}, {1, 8}, {3, 8}};
  std::vector<std::vector<std::multiset<int64_t>>> steps_of_shape;
  for (const Shape& shape : shapes) {
    absl::StatusOr<int> accum = MicroStepsForGlobalBatch(global, shape.batch, shape.world);
    ASSERT_TRUE(accum.ok()) << accum.status();
    EXPECT_EQ(*accum * shape.batch * shape.world, global);
    std::vector<DistributedSampler> ranks;
    for (int r = 0; r < shape.world; ++r) ranks.emplace_back(n, shape.world, r, shape.batch, 5, global);
    EXPECT_EQ(ranks[0].batches_per_epoch(), (n / global) * *accum);
    std::vector<std::multiset<int64_t>> steps;
    for (int64_t b = 0; b < ranks[0].batches_per_epoch(); ++b) {
      if (b % *accum == 0) steps.emplace_back();
      for (auto& rank : ranks) {
        for (int64_t i : rank.Batch(0, b)) steps.back().insert(i);
      }
    }
    steps_of_shape.push_back(steps);
  }
  ASSERT_EQ(steps_of_shape[0].size(), static_cast<size_t>(n / global));
  for (size_t k = 1; k < steps_of_shape.size(); ++k) EXPECT_EQ(steps_of_shape[k], steps_of_shape[0]) << k;

  absl::StatusOr<int> bad = MicroStepsForGlobalBatch(20, 2, 4);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--global-batch-size 20 is not a multiple of --batch-size 2 x 4 rank(s) = 8"),
            std::string::npos)
      << bad.status();
}

// Without --global-batch-size an epoch is cut at whole world x batch: a run of 3 ranks and one
// of 2 cut 1,001 samples at 999 and 1,000, which a resume from one to the other says; with the
// same global batch both cut at the same sample and nothing is said.
TEST(Sampler, AResumeSaysWhenTheEpochIsCutAtAnotherSample) {
  const int64_t n = 1001;
  DistributedSampler three(n, 3, 0, 1, 5), two(n, 2, 0, 1, 5);
  EXPECT_EQ(three.samples_per_epoch(), 999);
  EXPECT_EQ(two.samples_per_epoch(), 1000);
  std::string change = EpochCutChange(three.samples_per_epoch(), two.samples_per_epoch(), 4);
  EXPECT_NE(change.find("cut at 999 samples and this run's at 1000: from sample 999 of epoch 4"), std::string::npos)
      << change;
  DistributedSampler three_global(n, 3, 0, 1, 5, 6), two_global(n, 2, 0, 1, 5, 6);
  EXPECT_EQ(three_global.samples_per_epoch(), two_global.samples_per_epoch());
  EXPECT_EQ(EpochCutChange(three_global.samples_per_epoch(), two_global.samples_per_epoch(), 4), "");
  EXPECT_EQ(EpochCutChange(0, 1000, 4), "");  // a checkpoint that did not record it
}

TEST(Sampler, ReshufflesPerEpochAndIsReproducible) {
  DistributedSampler a(1000, 2, 0, 10, 7), b(1000, 2, 0, 10, 7), c(1000, 2, 0, 10, 8);
  EXPECT_EQ(a.Batch(0, 3), b.Batch(0, 3));
  EXPECT_NE(a.Batch(0, 3), a.Batch(1, 3));
  EXPECT_EQ(a.Batch(5, 0), b.Batch(5, 0));  // any position is reachable directly (resume)
  EXPECT_NE(a.Batch(0, 0), c.Batch(0, 0));
}

TEST(LrSchedule, WarmupThenCosineToTheMinimum) {
  LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.At(1), 0.1);
  EXPECT_DOUBLE_EQ(s.At(10), 1.0);
  EXPECT_NEAR(s.At(60), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(s.At(110), 0.1);
  EXPECT_DOUBLE_EQ(s.At(500), 0.1);
}

}  // namespace
}  // namespace dt
