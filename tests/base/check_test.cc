// WEFT_CHECK and the error hierarchy.
#include <gtest/gtest.h>

#include "base/check.h"
#include "base/env.h"

namespace weft {

TEST(Check, PassesAndFailsWithMessage) {
  EXPECT_NO_THROW(WEFT_CHECK(1 + 1 == 2));
  try {
    int x = 3;
    WEFT_CHECK(x == 4, "x was ", x);
    FAIL() << "expected a throw";
  } catch (const InternalError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("x == 4"), std::string::npos);
    EXPECT_NE(m.find("x was 3"), std::string::npos);
  }
}

TEST(Errors, ConfigErrorNamesField) {
  ConfigError e("train.lr", "must be positive");
  EXPECT_EQ(e.field(), "train.lr");
  EXPECT_EQ(std::string(e.what()), "train.lr: must be positive");
  PeerLostError p(3, "gone");
  EXPECT_EQ(p.peer(), 3);
  EXPECT_TRUE(dynamic_cast<const CommError*>(&p) != nullptr);
}

TEST(Env, ParsesIntegersAndRejectsGarbage) {
  ::setenv("WEFT_TEST_KNOB", "42", 1);
  EXPECT_EQ(env_int("WEFT_TEST_KNOB", 0), 42);
  ::setenv("WEFT_TEST_KNOB", "4x", 1);
  EXPECT_THROW(env_int("WEFT_TEST_KNOB", 0), ConfigError);
  ::unsetenv("WEFT_TEST_KNOB");
  EXPECT_EQ(env_int("WEFT_TEST_KNOB", 7), 7);
}

}  // namespace weft
