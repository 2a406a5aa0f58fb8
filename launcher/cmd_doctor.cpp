// strata doctor: a health check of the ranks before (or between) runs, DLRover-style. Every rank
// times a matmul and checks its result against the others' (the same seeded inputs must give the
// same bits); pairs of ranks (0-1, 2-3, ...) time an all-reduce between them, and all ranks one
// all-reduce together. Rank 0 prints each rank's figures next to the median of all ranks; a rank
// slower than the median by more than kStragglerFactor is named a straggler, one whose result
// differs from the majority's, or that fails, is named faulty (exit status 1). `strata run -n N`
// with [job] health_check runs it before every start (check_health) and may exclude those ranks.
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
#include <sstream>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "commands.h"
#include "strata/core/cpu_features.h"
#include "strata/core/process_memory.h"
#include "common.h"
#include "strata/comm.h"
#include "strata/core/launch_env.h"
#include "strata/core/local_communicator.h"
#include "supervisor.h"

namespace strata::cli {
namespace {

constexpr double kStragglerFactor = 1.5;
constexpr int64_t kMatmulSize = 1024, kMatmulRounds = 10, kReduceElements = 1 << 22, kReduceRounds = 5;

// Chaos testing: whether STRATA_FAULT (faults separated by ';') holds "KIND SLOT" for this slot:
// wrong_matmul (the result differs) or slow_matmul (three times slower).
bool doctor_fault(const std::string& kind, int slot) {
  const char* fault = std::getenv("STRATA_FAULT");
  if (!fault) return false;
  std::istringstream faults(fault);
  for (std::string one; std::getline(faults, one, ';');) {
    std::istringstream in(one);
    std::string k;
    int s = -1;
    if (in >> k >> s && k == kind && s == slot) return true;
  }
  return false;
}

// GFLOP/s of this rank's fp32 matmul on one thread, and a checksum of its result.
std::pair<double, double> matmul_check(int slot) {
  at::manual_seed(0);
  const at::Tensor a = at::randn({kMatmulSize, kMatmulSize}), b = at::randn({kMatmulSize, kMatmulSize});
  at::Tensor c = at::matmul(a, b);  // warm-up
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < kMatmulRounds; ++i) c = at::matmul(a, b);
  if (doctor_fault("slow_matmul", slot)) std::this_thread::sleep_for(std::chrono::duration<double>(2 * seconds_since(start)));
  const double flops = 2.0 * kMatmulSize * kMatmulSize * kMatmulSize * kMatmulRounds;
  return {flops / seconds_since(start) / 1e9, c.sum().item<double>()};
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
  return bytes / seconds_since(start) / 1e9;
}

// Seconds per all-reduce of one float over `group` as training sees it: between collectives every
// rank computes (a few small matmuls), and the time the rounds take beyond that compute is the
// latency. When ranks share cores this includes waiting for a peer to be scheduled, which an
// idle ping-pong does not show (on 2 cores, 4 ranks: about 40 us idle, milliseconds loaded).
double all_reduce_latency(Communicator& group) {
  const at::Tensor a = at::randn({128, 128}), b = at::randn({128, 128});
  at::Tensor x = at::ones({1}), c;
  constexpr int kRounds = 100, kMatmuls = 4;
  auto compute = [&] {
    for (int m = 0; m < kMatmuls; ++m) c = at::matmul(a, b);
  };
  for (int i = 0; i < 10; ++i) compute(), group.all_reduce(x, ReduceOp::Sum)->wait();  // warm-up
  group.barrier()->wait();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) compute();
  const double compute_s = seconds_since(start);
  group.barrier()->wait();
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) compute(), group.all_reduce(x, ReduceOp::Sum)->wait();
  const double total_s = seconds_since(start);
  // The slowest rank's figure: a collective ends when the last rank arrives.
  at::Tensor latency = at::tensor(std::vector<double>{std::max(0.0, total_s - compute_s) / kRounds}, at::kDouble);
  group.all_reduce(latency, ReduceOp::Max)->wait();
  return latency.item<double>();
}

int check_ranks(const LaunchEnv& env) {
  ComponentRegistry registry;
  load_plugins(registry);
  const auto* mpi = static_cast<const CommunicatorBackend*>(registry.find(ComponentKind::Communicator, "mpi"));
  if (!mpi) throw UserError("strata doctor needs the mpi communicator plugin (see `strata plugins`)");
  std::shared_ptr<Communicator> world = mpi->world(*local_communicator());
  // What a rank holds before any model or data: libtorch, the plugins, the MPI library and its
  // shared-memory segments. strata tune adds it to every candidate's predicted peak.
  const double start_resident = resident_bytes();
  at::set_num_threads(1);
  const int n = world->size(), rank = world->rank();
  double gflops = 0, checksum = 0, failed = 0;
  try {
    std::tie(gflops, checksum) = matmul_check(env.slot);
    if (doctor_fault("wrong_matmul", env.slot)) checksum += 1.0;
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
  const double world_latency = n > 1 ? all_reduce_latency(*world) : 0.0;
  at::Tensor mine = at::tensor(std::vector<double>{gflops, checksum, failed, pair_bw, static_cast<double>(env.slot), start_resident}, at::kDouble);
  at::Tensor all = at::empty({n, 6}, at::kDouble);
  world->all_gather(all, mine)->wait();
  if (rank != 0) return 0;

  std::vector<double> rates, pairs;
  std::map<double, int> checksums;
  double most_resident = 0;
  for (int r = 0; r < n; ++r) {
    most_resident = std::max(most_resident, all[r][5].item<double>());
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
  // The rank 0 host's CPU and the features that decide Strata's CPU paths (`strata ops` says
  // which path each gets).
  std::printf("CPU: %s (%s)\n", cpu_features().model.c_str(), cpu_features_line().c_str());
  std::printf("%-6s %14s %10s %18s %10s  %s\n", "rank", "matmul GFLOP/s", "of median", "pair bus GB/s", "of median", "verdict");
  int faulty = 0, stragglers = 0;
  std::ostringstream verdicts;  // for the launching process (check_health): "RANK SLOT VERDICT GFLOPS GBPS REASON"
  for (int r = 0; r < n; ++r) {
    const double rate = all[r][0].item<double>(), bw = all[r][3].item<double>();
    std::string verdict = "ok", reason;
    if (all[r][2].item<double>() != 0) verdict = "faulty", reason = "matmul failed", ++faulty;
    else if (all[r][1].item<double>() != majority || !has_majority)
      verdict = "faulty", reason = has_majority ? "matmul result differs from the other ranks'" : "matmul results disagree, no majority",
      ++faulty;
    else if (rate * kStragglerFactor < rate_median || (bw > 0 && bw * kStragglerFactor < pair_median))
      verdict = "straggler", reason = "slower than the median by more than 1.5x", ++stragglers;
    char pair_text[64] = "                 -          -";  // the odd last rank has no pair
    if (bw > 0) std::snprintf(pair_text, sizeof pair_text, "%18.3f %9.2fx", bw, bw / pair_median);
    std::string shown = verdict == "faulty" ? "FAULTY: " + reason : verdict == "straggler" ? "STRAGGLER: " + reason : verdict;
    std::printf("%-6d %14.2f %9.2fx %s  %s\n", r, rate, rate / rate_median, pair_text, shown.c_str());
    verdicts << r << " " << static_cast<int>(all[r][4].item<double>()) << " " << verdict << " " << rate << " " << bw << " " << reason << "\n";
  }
  std::printf("all ranks: all-reduce bus bandwidth %.3f GB/s\n", world_bw);
  std::printf("all ranks: all-reduce latency %.1f us (one float, between small matmuls)\n", world_latency * 1e6);
  std::printf("all ranks: resident memory at start %.1f MiB per rank at most (libtorch, plugins, MPI)\n", most_resident / (1 << 20));
  std::printf("%s\n", faulty ? "result: faulty ranks found" : stragglers ? "result: healthy, with stragglers" : "result: healthy");
  // Under mpirun a rank's non-zero exit makes mpirun abort and report; the verdict goes to the
  // launching process through a file instead (run_doctor).
  const char* result = std::getenv("STRATA_DOCTOR_RESULT");
  if (!result) return faulty ? 1 : 0;
  std::ofstream(result) << verdicts.str();
  return 0;
}

// Runs the doctor under mpirun on `slots.size()` ranks (rank i on slots[i]; `slots` empty: -n
// `ranks` on the default slots) and reads every rank's verdict back.
std::vector<RankHealth> doctor_under_mpirun(int argc, char** argv, int64_t ranks, const std::vector<int>& slots, int& status) {
  char pattern[] = "/tmp/strata-doctor-XXXXXX";
  const int fd = ::mkstemp(pattern);
  if (fd < 0) throw UserError("cannot create a temporary file: " + std::string(std::strerror(errno)));
  ::close(fd);
  ::setenv("STRATA_DOCTOR_RESULT", pattern, 1);
  AttemptOptions options{ranks};
  options.slots = slots;
  status = run_under_mpirun(argc, argv, options).status;
  ::unsetenv("STRATA_DOCTOR_RESULT");
  std::vector<RankHealth> out;
  std::ifstream in(pattern);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    RankHealth h;
    if (!(fields >> h.rank >> h.slot >> h.verdict >> h.gflops >> h.pair_gbps)) continue;
    std::getline(fields >> std::ws, h.reason);
    out.push_back(h);
  }
  std::remove(pattern);
  return out;
}

}  // namespace

std::vector<RankHealth> check_health(const std::vector<int>& slots) {
  std::string self = "strata", doctor = "doctor";
  char* argv[] = {self.data(), doctor.data(), nullptr};
  int status = 0;
  std::vector<RankHealth> health = doctor_under_mpirun(2, argv, static_cast<int64_t>(slots.size()), slots, status);
  if (health.size() != slots.size())
    throw std::runtime_error("the health check (strata doctor) did not report every rank (exit status " + std::to_string(status) + ")");
  return health;
}

int run_doctor(const Args& args) {
  allow_only(args, {"-n", "--ranks"});
  const LaunchEnv env = detect_launch_env();
  if (args.ranks > 1 && env.world_size == 1) {
    int status = 0;
    const std::vector<RankHealth> health = doctor_under_mpirun(args.argc, args.argv, args.ranks, {}, status);
    const bool faulty = std::any_of(health.begin(), health.end(), [](const RankHealth& h) { return h.verdict == "faulty"; });
    return status != 0 ? status : faulty ? 1 : 0;
  }
  if (args.ranks > 1 && args.ranks != env.world_size)
    throw UserError("-n " + std::to_string(args.ranks) + " but the launcher started " + std::to_string(env.world_size) + " ranks");
  return check_ranks(env);
}

}  // namespace strata::cli
