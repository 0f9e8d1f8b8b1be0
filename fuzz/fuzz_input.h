// Splits a fuzzer's bytes into typed values: a small FuzzedDataProvider of our own, so the replay
// build (gcc, no clang headers) compiles the same targets. Exhausted input yields zeros and "".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dt::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return size_ == 0; }

  uint8_t Byte() {
    if (size_ == 0) return 0;
    --size_;
    return *data_++;
  }

  bool Bool() { return Byte() & 1; }

  // A value in [min, max] from up to 8 bytes.
  int64_t Int(int64_t min, int64_t max) {
    uint64_t range = static_cast<uint64_t>(max) - static_cast<uint64_t>(min);
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && (range >> shift) != 0 && size_ > 0; shift += 8) {
      v = (v << 8) | Byte();
    }
    if (range != UINT64_MAX) v %= range + 1;
    return static_cast<int64_t>(static_cast<uint64_t>(min) + v);
  }

  // Up to `max_len` bytes, ended by a backslash that is not followed by another (as libFuzzer's
  // ConsumeRandomLengthString does, so mutations can grow and shrink one field).
  std::string String(size_t max_len) {
    std::string out;
    while (size_ > 0 && out.size() < max_len) {
      char c = static_cast<char>(Byte());
      if (c == '\\' && size_ > 0) {
        char next = static_cast<char>(Byte());
        if (next != '\\') break;
      }
      out.push_back(c);
    }
    return out;
  }

  std::string Rest() {
    std::string out(reinterpret_cast<const char*>(data_), size_);
    data_ += size_;
    size_ = 0;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

}  // namespace dt::fuzz
