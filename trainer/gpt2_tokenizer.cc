#include "trainer/gpt2_tokenizer.h"

#include <re2/re2.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/crypto.h"
#include "common/fs.h"

namespace dt {
namespace {

// GPT-2's pre-tokenisation: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// RE2 has no lookahead, so the last two alternatives become \s+ and Encode() gives a run of
// whitespace followed by a non-space its last character back (what (?!\S) does). \s is spelled
// out as Python's Unicode whitespace, which RE2's ASCII \s is not.
constexpr char kWhitespace[] =
    R"(\t\n\x{0b}\f\r\x{1c}-\x{1f} \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

std::string Pattern() {
  std::string ws = kWhitespace;
  return absl::StrCat("('s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^", ws, "\\p{L}\\p{N}]+|[", ws, "]+)");
}

// GPT-2's byte→unicode map: printable bytes map to themselves, the rest to 256, 257, ...
std::vector<int> ByteToCodepoint() {
  std::vector<int> map(256, -1);
  auto keep = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  int next = 256;
  for (int b = 0; b < 256; ++b) map[b] = keep(b) ? b : next++;
  return map;
}

void AppendUtf8(int cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes one UTF-8 code point at s[i]; advances i. Returns -1 when malformed.
int NextCodepoint(absl::string_view s, size_t* i) {
  unsigned char c = static_cast<unsigned char>(s[*i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || *i + len > s.size()) {
    ++*i;
    return -1;
  }
  int cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  *i += len;
  return cp;
}

bool IsWhitespaceCodepoint(int cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Length in bytes of the last UTF-8 character of s.
size_t LastCharBytes(absl::string_view s) {
  size_t n = 1;
  while (n < s.size() && (static_cast<unsigned char>(s[s.size() - n]) & 0xC0) == 0x80) ++n;
  return n;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer() = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Load(const std::string& dir) {
  std::string vocab_path = JoinPath(dir, "encoder.json");
  std::string merges_path = JoinPath(dir, "vocab.bpe");
  if (!ReadFile(vocab_path).ok()) {
    vocab_path = JoinPath(dir, "vocab.json");
    merges_path = JoinPath(dir, "merges.txt");
  }
  absl::StatusOr<std::string> vocab_text = ReadFile(vocab_path);
  absl::StatusOr<std::string> merges_text = ReadFile(merges_path);
  if (!vocab_text.ok() || !merges_text.ok()) {
    return absl::NotFoundError(absl::StrCat("no GPT-2 tokenizer in ", dir,
                                            ": expected encoder.json + vocab.bpe (or vocab.json + merges.txt); "
                                            "pass --tokenizer-dir"));
  }
  std::unique_ptr<Gpt2Tokenizer> tok(new Gpt2Tokenizer());
  nlohmann::json vocab = nlohmann::json::parse(*vocab_text, nullptr, /*allow_exceptions=*/false);
  if (vocab.is_discarded() || !vocab.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(vocab_path, " is not a JSON object of token → id"));
  }
  tok->id_to_token_.resize(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": token ", it.key(), " has no integer id"));
    }
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(vocab.size())) {
      return absl::InvalidArgumentError(absl::StrCat(vocab_path, ": id ", id, " out of range"));
    }
    tok->id_to_token_[id] = it.key();
    tok->token_to_id_[it.key()] = static_cast<int32_t>(id);
  }
  std::vector<int> byte_cp = ByteToCodepoint();
  std::fill(std::begin(tok->byte_of_codepoint_), std::end(tok->byte_of_codepoint_), 0);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(byte_cp[b], &s);
    auto found = tok->token_to_id_.find(s);
    if (found == tok->token_to_id_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(vocab_path, " lacks the token for byte ", b));
    }
    tok->byte_ids_[b] = found->second;
    tok->byte_of_codepoint_[byte_cp[b]] = static_cast<uint8_t>(b);
  }
  int line_no = 0;
  uint64_t rank = 0;
  for (absl::string_view line : absl::StrSplit(*merges_text, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(merges_path, " line ", line_no, ": expected two tokens"));
    }
    auto a = tok->token_to_id_.find(parts[0]);
    auto b = tok->token_to_id_.find(parts[1]);
    auto merged = tok->token_to_id_.find(absl::StrCat(parts[0], parts[1]));
    if (a == tok->token_to_id_.end() || b == tok->token_to_id_.end() || merged == tok->token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(merges_path, " line ", line_no, ": merge of tokens not in ", vocab_path));
    }
    uint64_t key = (static_cast<uint64_t>(a->second) << 32) | static_cast<uint32_t>(b->second);
    tok->merges_.emplace(key, (rank++ << 32) | static_cast<uint32_t>(merged->second));
  }
  auto eos = tok->token_to_id_.find("<|endoftext|>");
  tok->eos_id_ = eos == tok->token_to_id_.end() ? -1 : eos->second;
  tok->fingerprint_ = Sha256Hex(absl::StrCat(*vocab_text, "\n--\n", *merges_text));
  tok->pattern_ = std::make_unique<re2::RE2>(Pattern());
  if (!tok->pattern_->ok()) return absl::InternalError("GPT-2 pre-tokenisation pattern does not compile");
  return tok;
}

void Gpt2Tokenizer::EncodeWord(absl::string_view word, std::vector<int32_t>* out) {
  auto cached = cache_.find(word);
  if (cached != cache_.end()) {
    out->insert(out->end(), cached->second.begin(), cached->second.end());
    return;
  }
  std::vector<int32_t> parts;
  parts.reserve(word.size());
  for (unsigned char c : word) parts.push_back(byte_ids_[c]);
  // Merge the lowest-ranked adjacent pair until none is in the merge table.
  while (parts.size() > 1) {
    uint64_t best = UINT64_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      uint64_t key = (static_cast<uint64_t>(parts[i]) << 32) | static_cast<uint32_t>(parts[i + 1]);
      auto m = merges_.find(key);
      if (m != merges_.end() && m->second < best) {
        best = m->second;
        at = i;
      }
    }
    if (best == UINT64_MAX) break;
    int32_t merged = static_cast<int32_t>(best & 0xFFFFFFFF);
    int32_t left = parts[at], right = parts[at + 1];
    // Merge every occurrence of this pair, left to right (as the reference does).
    std::vector<int32_t> next;
    next.reserve(parts.size());
    for (size_t i = 0; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == left && parts[i + 1] == right) {
        next.push_back(merged);
        i += 2;
      } else {
        next.push_back(parts[i++]);
      }
    }
    parts.swap(next);
  }
  if (cache_.size() < (1u << 20)) cache_.emplace(std::string(word), parts);
  out->insert(out->end(), parts.begin(), parts.end());
}

std::vector<int32_t> Gpt2Tokenizer::Encode(absl::string_view text) {
  std::vector<int32_t> ids;
  re2::StringPiece input(text.data(), text.size());
  re2::StringPiece match;
  while (!input.empty()) {
    size_t before = input.size();
    if (!RE2::Consume(&input, *pattern_, &match) || match.empty()) {
      // Not reachable for valid UTF-8 (every character matches some alternative); for invalid
      // bytes, encode one byte on its own so nothing is lost.
      EncodeWord(absl::string_view(input.data(), 1), &ids);
      input.remove_prefix(1);
      continue;
    }
    absl::string_view word(match.data(), match.size());
    // (?!\S): a whitespace run followed by a non-space leaves its last character to the next word.
    if (!input.empty() && input.size() < before && word.size() > 1) {
      size_t i = 0;
      bool all_space = true;
      while (i < word.size() && all_space) all_space = IsWhitespaceCodepoint(NextCodepoint(word, &i));
      size_t j = 0;
      absl::string_view rest(input.data(), input.size());
      bool next_is_space = IsWhitespaceCodepoint(NextCodepoint(rest, &j));
      if (all_space && !next_is_space) {
        size_t last = LastCharBytes(word);
        if (last < word.size()) {
          input = re2::StringPiece(word.data() + word.size() - last, input.size() + last);
          word.remove_suffix(last);
        }
      }
    }
    EncodeWord(word, &ids);
  }
  return ids;
}

absl::StatusOr<std::string> Gpt2Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside 0..", vocab_size() - 1));
    }
    const std::string& token = id_to_token_[id];
    for (size_t i = 0; i < token.size();) {
      int cp = NextCodepoint(token, &i);
      if (cp >= 0 && cp < 324) {
        out.push_back(static_cast<char>(byte_of_codepoint_[cp]));
      }
    }
  }
  return out;
}

}  // namespace dt
