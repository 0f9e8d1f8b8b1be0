// GPT-2 BPE on arbitrary bytes: every id is in the vocabulary and decoding gives the input back,
// byte for byte (byte-level BPE loses nothing, valid UTF-8 or not).
#include <cstdint>
#include <memory>

#include "fuzz/fuzz_check.h"
#include "trainer/gpt2_tokenizer.h"

namespace {

dt::Gpt2Tokenizer& Tokenizer() {
  static dt::Gpt2Tokenizer* tokenizer = [] {
    auto t = dt::Gpt2Tokenizer::Load(DT_SOURCE_DIR "/data/gpt2");
    if (!t.ok()) dt::fuzz::Fail("cannot load the tokenizer: " + t.status().ToString());
    return t->release();
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  std::string text(reinterpret_cast<const char*>(data), size);
  dt::Gpt2Tokenizer& t = Tokenizer();
  std::vector<int32_t> ids = t.Encode(text);
  for (int32_t id : ids) dt::fuzz::Check(id >= 0 && id < t.vocab_size(), "an id outside the vocabulary");
  absl::StatusOr<std::string> back = t.Decode(ids);
  dt::fuzz::Check(back.ok(), "decoding its own ids failed: " + back.status().ToString());
  dt::fuzz::Check(*back == text, "decode(encode(text)) != text");
  return 0;
}
