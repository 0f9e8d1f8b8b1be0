// Where the data that ships with dt (data/: the GPT-2 tokenizer files, a small corpus) lives:
// installed under <prefix>/share/dt/data beside the binaries, or in the source tree of a build.
#pragma once

#include <optional>
#include <string>

namespace dt {

// gpt2/ holding encoder.json and vocab.bpe in the first of: <dir of this executable>/../share/dt/data
// (installed), <dir of this executable>/../../data (build/bin of a source tree), and the source
// tree this binary was built from. Resolved to a real path.
std::optional<std::string> FindDefaultTokenizerDir();

}  // namespace dt
