// What a fuzz target asserts: a broken property aborts with the reason, which libFuzzer records
// as a crash (and the replay test as a failure) with the input that broke it.
#pragma once

#include <stdlib.h>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "common/utf8.h"

namespace dt::fuzz {

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property broken: %s\n", what.c_str());
  std::abort();
}

// A new directory under /tmp for one target's files ("dt-<name>-fuzz-XXXXXX").
inline std::string MakeScratchDir(const std::string& name) {
  std::string tmpl = "/tmp/dt-" + name + "-fuzz-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "fuzz: cannot make a scratch directory\n");
    std::abort();
  }
  return tmpl;
}

inline void Check(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

// A refusal a person can act on: not OK means a message, valid UTF-8, of bounded size.
inline void CheckRefusal(const absl::Status& s, const std::string& where) {
  if (s.ok()) return;
  Check(!s.message().empty(), where + ": an error without a message (" + s.ToString() + ")");
  Check(IsValidUtf8(s.message()), where + ": an error message that is not UTF-8: " + absl::CHexEscape(s.message()));
  Check(s.message().size() <= 70 * 1024, where + ": an error message over 70 KiB");
}

}  // namespace dt::fuzz
