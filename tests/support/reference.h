// The PyTorch reference runs (../shared/reference) are this project's external truth: a test
// that needs them fails when they are missing, so CI can never pass by skipping them. A
// checkout without them on purpose sets WEFT_SKIP_GOLDEN=1 and the tests skip, saying so.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#define WEFT_REQUIRE_REFERENCE(dir)                                                         \
  do {                                                                                      \
    if (!std::filesystem::exists(dir)) {                                                    \
      const char* skip_ = std::getenv("WEFT_SKIP_GOLDEN");                                  \
      if (skip_ && std::strcmp(skip_, "1") == 0)                                            \
        GTEST_SKIP() << "reference folder missing (WEFT_SKIP_GOLDEN=1): " << (dir);        \
      FAIL() << "reference folder missing: " << (dir)                                       \
             << " (the PyTorch runs of ../shared/reference; set WEFT_SKIP_GOLDEN=1 to skip)"; \
    }                                                                                       \
  } while (0)
