// strata doctor: a health check of the ranks before (or between) runs, DLRover-style. Every rank
// times a matmul and checks its result against the others' (the same seeded inputs must give the
// same bits); pairs of ranks (0-1, 2-3, ...) time an all-reduce between them, and all ranks one
// all-reduce together. Rank 0 prints each rank's figures next to the median of all ranks; a rank
// slower than the median by more than kStragglerFactor is named a straggler, one whose result
// differs from the majority's, or that fails, is named faulty (exit status 1).
#include <algorithm>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <iostream>
#include <map>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "commands.h"
#include "common.h"
#include "strata/comm.h"
#include "strata/core/launch_env.h"
#include "strata/core/local_communicator.h"
#include "supervisor.h"

namespace strata::cli {
namespace {

constexpr double kStragglerFactor = 1.5;
constexpr int64_t kMatmulSize = 1024, kMatmulRounds = 10, kReduceElements = 1 << 22, kReduceRounds = 5;

double seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// GFLOP/s of this rank's fp32 matmul on one thread, and a checksum of its result.
std::pair<double, double> matmul_check() {
  at::manual_seed(0);
  const at::Tensor a = at::randn({kMatmulSize, kMatmulSize}), b = at::randn({kMatmulSize, kMatmulSize});
  at::Tensor c = at::matmul(a, b);  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kMatmulRounds; ++i) c = at::matmul(a, b);
  const double flops = 2.0 * kMatmulSize * kMatmulSize * kMatmulSize * kMatmulRounds;
  return {flops / seconds(start) / 1e9, c.sum().item<double>()};
}

// Bus bandwidth (GB/s) of an all-reduce of kReduceElements fp32 over `group`: bytes x 2(n-1)/n per
// second, the figure nccl-tests reports.
double all_reduce_bandwidth(Communicator& group) {
  at::Tensor x = at::ones({kReduceElements});
  group.all_reduce(x, ReduceOp::Sum)->wait();  // warm-up
  group.barrier()->wait();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kReduceRounds; ++i) group.all_reduce(x, ReduceOp::Sum)->wait();
  const double n = group.size(), bytes = 4.0 * kReduceElements * kReduceRounds * 2.0 * (n - 1) / n;
  return bytes / seconds(start) / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int check_ranks(const LaunchEnv& env) {
  ComponentRegistry registry;
  load_plugins(registry);
  const auto* mpi = static_cast<const CommunicatorBackend*>(registry.find(ComponentKind::Communicator, "mpi"));
  if (!mpi) throw UserError("strata doctor needs the mpi communicator plugin (see `strata plugins`)");
  std::shared_ptr<Communicator> world = mpi->world(*local_communicator());
  at::set_num_threads(1);
  const int n = world->size(), rank = world->rank();
  double gflops = 0, checksum = 0, failed = 0;
  try {
    std::tie(gflops, checksum) = matmul_check();
    // Chaos testing: STRATA_FAULT="wrong_matmul RANK" makes that rank's result differ.
    if (const char* fault = std::getenv("STRATA_FAULT"); fault && std::string(fault) == "wrong_matmul " + std::to_string(rank))
      checksum += 1.0;
  } catch (const std::exception& e) {
    failed = 1;
    std::cerr << "strata doctor: rank " << rank << ": matmul failed: " << e.what() << "\n";
  }
  // Pairs 0-1, 2-3, ...: every rank splits alike; an odd last rank forms a group of one.
  std::vector<int> pair{rank - rank % 2};
  if (pair[0] + 1 < n) pair.push_back(pair[0] + 1);
  auto pair_group = world->split(pair);
  const double pair_bw = pair_group->size() > 1 ? all_reduce_bandwidth(*pair_group) : 0.0;
  const double world_bw = n > 1 ? all_reduce_bandwidth(*world) : 0.0;
  at::Tensor mine = at::tensor(std::vector<double>{gflops, checksum, failed, pair_bw}, at::kDouble);
  at::Tensor all = at::empty({n, 4}, at::kDouble);
  world->all_gather(all, mine)->wait();
  if (rank != 0) return 0;

  std::vector<double> rates, pairs;
  std::map<double, int> checksums;
  for (int r = 0; r < n; ++r) {
    rates.push_back(all[r][0].item<double>());
    if (all[r][3].item<double>() > 0) pairs.push_back(all[r][3].item<double>());
    if (all[r][2].item<double>() == 0) ++checksums[all[r][1].item<double>()];
  }
  // The result most ranks computed; with no strict majority every rank that disagrees is named.
  double majority = 0;
  int votes = 0;
  for (const auto& [sum, count] : checksums)
    if (count > votes) majority = sum, votes = count;
  const bool has_majority = 2 * votes > static_cast<int>(n) || checksums.size() == 1;
  const double rate_median = median(rates), pair_median = median(pairs);
  std::printf("strata doctor: %d ranks (%s); fp32 matmul %ldx%ld on one thread per rank, all-reduce of %ld MiB\n", n,
              env.launcher.c_str(), static_cast<long>(kMatmulSize), static_cast<long>(kMatmulSize),
              static_cast<long>(kReduceElements * 4 >> 20));
  std::printf("%-6s %14s %10s %18s %10s  %s\n", "rank", "matmul GFLOP/s", "of median", "pair bus GB/s", "of median", "verdict");
  int faulty = 0, stragglers = 0;
  for (int r = 0; r < n; ++r) {
    const double rate = all[r][0].item<double>(), bw = all[r][3].item<double>();
    std::string verdict = "ok";
    if (all[r][2].item<double>() != 0) verdict = "FAULTY: matmul failed", ++faulty;
    else if (all[r][1].item<double>() != majority || !has_majority)
      verdict = has_majority ? "FAULTY: matmul result differs from the other ranks'" : "FAULTY: matmul results disagree, no majority",
      ++faulty;
    else if (rate * kStragglerFactor < rate_median || (bw > 0 && bw * kStragglerFactor < pair_median))
      verdict = "STRAGGLER: slower than the median by more than 1.5x", ++stragglers;
    char pair_text[64] = "                 -          -";  // the odd last rank has no pair
    if (bw > 0) std::snprintf(pair_text, sizeof pair_text, "%18.3f %9.2fx", bw, bw / pair_median);
    std::printf("%-6d %14.2f %9.2fx %s  %s\n", r, rate, rate / rate_median, pair_text, verdict.c_str());
  }
  std::printf("all ranks: all-reduce bus bandwidth %.3f GB/s\n", world_bw);
  std::printf("%s\n", faulty ? "result: faulty ranks found" : stragglers ? "result: healthy, with stragglers" : "result: healthy");
  // Under mpirun a rank's non-zero exit makes mpirun abort and report; the verdict goes to the
  // launching process through a file instead (run_doctor).
  const char* result = std::getenv("STRATA_DOCTOR_RESULT");
  if (!result) return faulty ? 1 : 0;
  if (faulty) std::ofstream(result) << "1";
  return 0;
}

}  // namespace

int run_doctor(const Args& args) {
  allow_only(args, {"-n", "--ranks"});
  const LaunchEnv env = detect_launch_env();
  if (args.ranks > 1 && env.world_size == 1) {
    char pattern[] = "/tmp/strata-doctor-XXXXXX";
    const int fd = ::mkstemp(pattern);
    if (fd < 0) throw UserError("cannot create a temporary file: " + std::string(std::strerror(errno)));
    ::close(fd);
    ::setenv("STRATA_DOCTOR_RESULT", pattern, 1);
    const int status = run_under_mpirun(args.argc, args.argv, AttemptOptions{args.ranks}).status;
    std::ifstream in(pattern);
    const bool faulty = in.get() == '1';
    std::remove(pattern);
    return status != 0 ? status : faulty ? 1 : 0;
  }
  if (args.ranks > 1 && args.ranks != env.world_size)
    throw UserError("-n " + std::to_string(args.ranks) + " but the launcher started " + std::to_string(env.world_size) + " ranks");
  return check_ranks(env);
}

}  // namespace strata::cli
