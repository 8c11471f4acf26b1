// The main of the test binaries: gtest's, ended by fsdpx::exit_process, as fsdpx's programs end
// (without LibTorch's static teardown: a test binary runs once per test case, 386 times in make test).
#include <gtest/gtest.h>

#include "fsdpx/framework/runtime/launcher.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  fsdpx::exit_process(RUN_ALL_TESTS());
}
