// Which kernels OpenBLAS runs, for the processes dt starts.
//
// OpenBLAS built for many CPUs (Debian's libopenblas0-openmp) picks its kernels ("core") at load
// time from the CPU's family and model number. A model newer than the library falls back to
// Prescott's SSE3 kernels: Debian 12's OpenBLAS 0.3.21 on an Emerald Rapids VM (Intel family 6,
// model 207, AVX-512 with BF16) picks Prescott, and sgemm runs 3-7x slower than with its
// Cooperlake kernels (12 against 35 GFLOPS for GPT-2's output layer, one thread), a tiny GPT-2
// training step 2x slower (1.1-1.3 s against 0.59 s). PyTorch and torchrun inherit the same
// choice. dt picks the core from the instruction sets the CPU and the kernel enable instead, and
// gives it to the processes it starts as OPENBLAS_CORETYPE — only where OpenBLAS's own pick is of
// an older generation than the CPU, never over a user's OPENBLAS_CORETYPE, and not at all with
// DT_OPENBLAS_CORETYPE=off.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace dt {

// The instruction sets that decide which OpenBLAS kernels a CPU runs (as the CPU and the kernel
// enable them: a VM may hide some).
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512cd = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
};

CpuFeatures ThisCpuFeatures();

// The most capable OpenBLAS core whose kernels these features run: "Cooperlake" (AVX-512 with
// BF16), "SkylakeX" (AVX-512), "Haswell" (AVX2 and FMA), or "" for an older CPU, where OpenBLAS's
// own pick stands.
std::string OpenBlasCoreFor(const CpuFeatures& features);

// Whether `core` (as openblas_get_corename names it) runs AVX2-generation kernels or later: a pick
// dt leaves alone (OpenBLAS knew the CPU; its tuning for it may be finer than dt's choice).
bool IsModernOpenBlasCore(absl::string_view core);

// The core to give the processes started here, given what OpenBLAS picks by itself (`picked`;
// empty when the BLAS is not OpenBLAS) and the CPU's features: empty to leave OpenBLAS's pick.
std::string OpenBlasCoreOverride(absl::string_view picked, const CpuFeatures& features);

// What OpenBLAS picks in this process: the loaded library's when one is (dttrainer, through
// LibTorch), otherwise libblas.so.3's, opened for the question (about 4 ms; it stays mapped).
// Empty when the BLAS is not OpenBLAS or cannot be opened.
std::string OpenBlasPickedCore();

// The OPENBLAS_CORETYPE for the processes dt starts here: empty when OPENBLAS_CORETYPE is set
// (the user's choice, or dt's own from the launcher), DT_OPENBLAS_CORETYPE is "off", or
// OpenBlasCoreOverride leaves OpenBLAS's pick.
std::string OpenBlasCoreToSet();

// The log line of a launcher that gives its children `core` (OpenBlasCoreToSet's answer).
std::string OpenBlasCoreNotice(const std::string& core);

// For a program that links OpenBLAS (which chose its kernels when it was loaded, before main):
// when OpenBlasCoreToSet has a core for it, starts the program again (execv of /proc/self/exe
// with `argv`) with OPENBLAS_CORETYPE set; the second start finds it set and carries on. Returns
// only when nothing needs changing, or when the exec failed (OpenBLAS's pick then stands).
// dt's launchers set the variable themselves, so only a process started otherwise (srun's tasks
// of a Slurm run, a user's own launcher) pays the second start, on a CPU OpenBLAS does not know.
void RestartWithBetterOpenBlasCore(char** argv);

}  // namespace dt
