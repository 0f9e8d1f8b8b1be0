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

// The directory holding the `dt` Python package (dt/__init__.py and its generated dt/v1 stubs):
// <dir of this executable>/../share/dt/python (installed) or <dir of this executable>/../python
// (a build tree's bin/). dtrun puts it on its children's PYTHONPATH.
std::optional<std::string> FindDtPythonDir();

}  // namespace dt
