// Which OpenBLAS kernels dt gives the processes it starts (common/blas_core.h).
#include "common/blas_core.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>

namespace dt {
namespace {

CpuFeatures Avx2() {
  CpuFeatures f;
  f.avx2 = f.fma = true;
  return f;
}

CpuFeatures Avx512() {
  CpuFeatures f = Avx2();
  f.avx512f = f.avx512cd = f.avx512bw = f.avx512dq = f.avx512vl = true;
  return f;
}

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    value ? ::setenv(name, value->c_str(), 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(OpenBlasCore, TheMostCapableKernelsTheCpusInstructionSetsRun) {
  CpuFeatures bf16 = Avx512();
  bf16.avx512bf16 = true;
  EXPECT_EQ(OpenBlasCoreFor(bf16), "Cooperlake");
  EXPECT_EQ(OpenBlasCoreFor(Avx512()), "SkylakeX");
  EXPECT_EQ(OpenBlasCoreFor(Avx2()), "Haswell");
  // AVX-512 with a part missing (or hidden by a VM) is not SkylakeX's: its kernels use them all.
  CpuFeatures partial = Avx512();
  partial.avx512vl = false;
  EXPECT_EQ(OpenBlasCoreFor(partial), "Haswell");
  CpuFeatures no_fma = Avx2();
  no_fma.fma = false;
  EXPECT_EQ(OpenBlasCoreFor(no_fma), "");  // older than Haswell: OpenBLAS's pick stands
  EXPECT_EQ(OpenBlasCoreFor(CpuFeatures{}), "");
}

TEST(OpenBlasCore, OnlyAPickOlderThanTheCpuIsReplaced) {
  CpuFeatures bf16 = Avx512();
  bf16.avx512bf16 = true;
  // Debian 12's OpenBLAS on an Emerald Rapids VM: Prescott's SSE3 kernels.
  EXPECT_EQ(OpenBlasCoreOverride("Prescott", bf16), "Cooperlake");
  EXPECT_EQ(OpenBlasCoreOverride("Sandybridge", Avx2()), "Haswell");
  // A CPU OpenBLAS knows keeps its pick, whatever dt would choose.
  for (const char* known : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SAPPHIRERAPIDS", "excavator"}) {
    EXPECT_TRUE(IsModernOpenBlasCore(known)) << known;
    EXPECT_EQ(OpenBlasCoreOverride(known, bf16), "") << known;
  }
  // Not OpenBLAS (the reference BLAS, BLIS, MKL): nothing to set.
  EXPECT_EQ(OpenBlasCoreOverride("", bf16), "");
  // An old CPU: nothing better to give.
  EXPECT_EQ(OpenBlasCoreOverride("Prescott", CpuFeatures{}), "");
}

TEST(OpenBlasCore, TheUsersChoiceAndTheSwitchOffAreLeftAlone) {
  {
    ScopedEnv user("OPENBLAS_CORETYPE", "Haswell");
    ScopedEnv on("DT_OPENBLAS_CORETYPE", std::nullopt);
    EXPECT_EQ(OpenBlasCoreToSet(), "");
  }
  {
    ScopedEnv user("OPENBLAS_CORETYPE", "");  // set, even empty: the user's
    EXPECT_EQ(OpenBlasCoreToSet(), "");
  }
  {
    ScopedEnv unset("OPENBLAS_CORETYPE", std::nullopt);
    ScopedEnv off("DT_OPENBLAS_CORETYPE", "off");
    EXPECT_EQ(OpenBlasCoreToSet(), "");
  }
}

TEST(OpenBlasCore, ThisMachinesBlasIsOpenBlasAndItsPickIsKeptOrBettered) {
  // scripts/setup.sh installs libopenblas0-openmp as libblas.so.3.
  std::string picked = OpenBlasPickedCore();
  ASSERT_FALSE(picked.empty()) << "libblas.so.3 is not OpenBLAS here";
  ScopedEnv unset("OPENBLAS_CORETYPE", std::nullopt);
  ScopedEnv on("DT_OPENBLAS_CORETYPE", std::nullopt);
  std::string set = OpenBlasCoreToSet();
  if (IsModernOpenBlasCore(picked)) {
    EXPECT_EQ(set, "") << "OpenBLAS picked " << picked;
  } else {
    EXPECT_EQ(set, OpenBlasCoreFor(ThisCpuFeatures())) << "OpenBLAS picked " << picked;
  }
}

}  // namespace
}  // namespace dt
