// Background work that must not slow what a user waits on.
#pragma once

namespace dt {

// The nice value of background threads: CFS gives a thread of nice 10 about a tenth of a core
// against one of nice 0, so where cores are short the background work takes the time left over.
inline constexpr int kBackgroundNice = 10;

// Lowers the calling thread's priority to kBackgroundNice (Linux applies nice per thread; threads
// it starts afterwards inherit it). Failure is harmless: the work runs at normal priority.
void YieldToForegroundWork();

}  // namespace dt
