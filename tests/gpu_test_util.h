// What the GPU tests share: SKIP_WITHOUT_GPU() skips the calling test, saying why, where no CUDA device is usable
// (CI has none), so a GPU test never passes silently without running.
#pragma once
#ifdef LOWBIT_WITH_CUDA
#include <gtest/gtest.h>

#include <string>

#include "backend_cuda/common/common.h"

#define SKIP_WITHOUT_GPU()                                                          \
  do {                                                                              \
    std::string why;                                                                \
    if (!::lowbit::cuda::device_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why; \
  } while (0)
#endif
