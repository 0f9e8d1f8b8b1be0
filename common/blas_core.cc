#include "common/blas_core.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dt {
namespace {

using CoreName = char* (*)();

std::string CoreOf(void* handle) {
  auto name = reinterpret_cast<CoreName>(::dlsym(handle, "openblas_get_corename"));
  if (name == nullptr) return "";
  const char* core = name();
  return core != nullptr ? core : "";
}

}  // namespace

CpuFeatures ThisCpuFeatures() {
  // GCC's cpu model checks the CPUID bits and, for AVX and AVX-512, that the kernel saves their
  // registers (XGETBV): a hidden feature reads false.
  __builtin_cpu_init();
  CpuFeatures f;
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512cd = __builtin_cpu_supports("avx512cd");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  return f;
}

std::string OpenBlasCoreFor(const CpuFeatures& f) {
  bool avx512 = f.avx512f && f.avx512cd && f.avx512bw && f.avx512dq && f.avx512vl && f.avx2 && f.fma;
  if (avx512 && f.avx512bf16) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (f.avx2 && f.fma) return "Haswell";
  return "";
}

bool IsModernOpenBlasCore(absl::string_view core) {
  for (absl::string_view modern : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"}) {
    if (absl::EqualsIgnoreCase(core, modern)) return true;
  }
  return false;
}

std::string OpenBlasCoreOverride(absl::string_view picked, const CpuFeatures& features) {
  if (picked.empty() || IsModernOpenBlasCore(picked)) return "";
  return OpenBlasCoreFor(features);
}

std::string OpenBlasPickedCore() {
  // Already loaded (dttrainer links it through LibTorch): ask that copy, which is the one in use.
  if (void* loaded = ::dlopen("libblas.so.3", RTLD_LAZY | RTLD_NOLOAD)) {
    std::string core = CoreOf(loaded);
    ::dlclose(loaded);
    return core;
  }
  // Never unloaded: OpenBLAS and its OpenMP runtime keep a few bytes for the life of the process,
  // which an unloaded library would leave to LeakSanitizer as leaks of an unknown module.
  void* opened = ::dlopen("libblas.so.3", RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE);
  if (opened == nullptr) return "";
  std::string core = CoreOf(opened);
  ::dlclose(opened);
  return core;
}

std::string OpenBlasCoreToSet() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  const char* switch_value = std::getenv("DT_OPENBLAS_CORETYPE");
  if (switch_value != nullptr && absl::EqualsIgnoreCase(switch_value, "off")) return "";
  CpuFeatures features = ThisCpuFeatures();
  if (OpenBlasCoreFor(features).empty()) return "";  // nothing better to offer: no need to ask
  return OpenBlasCoreOverride(OpenBlasPickedCore(), features);
}

std::string OpenBlasCoreNotice(const std::string& core) {
  return absl::StrCat("OpenBLAS picks ", OpenBlasPickedCore(), " kernels on this CPU, older than it runs: ",
                      "the processes started here get OPENBLAS_CORETYPE=", core,
                      " (set OPENBLAS_CORETYPE to choose, DT_OPENBLAS_CORETYPE=off to keep OpenBLAS's pick)");
}

void RestartWithBetterOpenBlasCore(char** argv) {
  std::string core = OpenBlasCoreToSet();
  if (core.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  ::unsetenv("OPENBLAS_CORETYPE");  // not started again: the children get the launcher's choice
}

}  // namespace dt
