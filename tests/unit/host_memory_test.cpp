// [job] host_memory (strata/core/host_memory.h): with "keep", a block a tensor frees serves the
// next tensor of its size without faulting its pages in again.
#include <sys/resource.h>

#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "strata/core/host_memory.h"
#include "strata/errors.h"

namespace strata {
namespace {

long minor_faults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Minor faults of `rounds` steps after a first one, each step allocating and writing 20 tensors
// of 4 MiB (1024 pages each) and freeing them, as a step's activations come and go.
long faults_of_steps(int rounds) {
  auto step = [] {
    std::vector<at::Tensor> activations;
    for (int i = 0; i < 20; ++i) activations.push_back(at::empty({1 << 20}, at::kFloat).fill_(1.0f));
  };
  step();
  const long before = minor_faults();
  for (int r = 0; r < rounds; ++r) step();
  return minor_faults() - before;
}

// With glibc's defaults the heap's free top is trimmed back to the system after each step, so
// each step faults a third or more of its pages in again (36834 of 102400 here); kept, about a
// tenth (10240).
TEST(HostMemory, KeptMemoryServesTheNextStepWithFewerFaults) {
  configure_host_memory("keep");
  const long faults = faults_of_steps(5);
  EXPECT_LT(faults, 5 * 20 * 1024 / 4) << "the steps after the first faulted their pages in again";
}

TEST(HostMemory, UnknownModeIsRefused) {
  EXPECT_THROW(configure_host_memory("hoard"), UserError);
  EXPECT_NO_THROW(configure_host_memory("return"));
}

}  // namespace
}  // namespace strata
