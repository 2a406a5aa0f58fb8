// strata run: train with a strategy, here or on N local ranks started through mpirun.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "strata/core/flash_checkpoint.h"
#include "strata/core/launch_env.h"
#include "strata/core/run_directory.h"
#include "strata/core/trainer.h"
#include "strategy_input.h"
#include "oom_kills.h"
#include "supervisor.h"

namespace strata::cli {

namespace {

namespace fs = std::filesystem;

// Forwards mpirun's standard error line by line, except its closing report (a block framed by
// dashed lines) when the ranks said what went wrong themselves: that report repeats it once per
// rank with mpirun's advice around it, when the run was stopped by Ctrl-C or SIGTERM, or when it
// names a rank killed by a signal (cause(), which the supervisor says on one line). Otherwise it
// is all there is, so it is printed.
class StderrFilter {
 public:
  void line(const std::string& text) {
    if (text.rfind("-----", 0) == 0) in_block_ = !in_block_, held_.push_back(text);
    else if (in_block_ || !held_.empty()) held_.push_back(text);
    else std::cerr << text << "\n";
  }
  void finish(bool ranks_reported) {
    if (!ranks_reported)
      for (const auto& l : held_) std::cerr << l << "\n";
  }
  // What mpirun's report says failed: "rank 1 exited on signal 9 (Killed)", or empty.
  std::string cause() const {
    for (const auto& l : held_) {
      const size_t rank = l.find("process rank "), signal = l.find("exited on signal ");
      if (rank == std::string::npos || signal == std::string::npos) continue;
      const std::string number = l.substr(rank + 13, l.find(' ', rank + 13) - rank - 13);
      std::string how = l.substr(signal);
      while (!how.empty() && (how.back() == '.' || how.back() == ' ')) how.pop_back();
      return "rank " + number + " " + how;
    }
    return {};
  }

 private:
  bool in_block_ = false;
  std::vector<std::string> held_;
};

// The errors ranks wrote to `dir` (see main.cpp), each distinct message once with the ranks
// that reported it (an internal error also names where the first of them wrote its full trace).
// Returns the exit status they call for (2 for bad input, 1 otherwise, 0 for none) and, in
// `cause`, the first message, for events.jsonl.
int report_rank_errors(const fs::path& dir, int64_t ranks, std::string& cause) {
  std::map<std::string, std::set<int>> by_message;  // "kind\tmessage" -> ranks
  std::map<std::string, std::string> trace;         // "kind\tmessage" -> the first rank's trace file
  for (int64_t r = 0; r < ranks; ++r) {
    std::ifstream in(dir / ("rank_" + std::to_string(r)));
    std::string kind, message, where;
    if (in && std::getline(in, kind) && std::getline(in, message)) {
      by_message[kind + "\t" + message].insert(static_cast<int>(r));
      if (std::getline(in, where) && !where.empty()) trace.emplace(kind + "\t" + message, where);
    }
  }
  int status = 0;
  for (const auto& [key, who] : by_message) {
    const std::string kind = key.substr(0, key.find('\t')), message = key.substr(key.find('\t') + 1);
    std::string where;
    if (static_cast<int64_t>(who.size()) != ranks) {
      for (int r : who) where += (where.empty() ? " (rank " : ",") + std::to_string(r);
      where += ")";
    }
    const auto traced = trace.find(key);
    std::cerr << "strata: " << (kind == "user" ? "error" : "internal error") << where << ": " << message
              << (traced != trace.end() ? " (full trace: " + traced->second + ")" : "") << "\n";
    if (cause.empty()) cause = (kind == "user" ? "error" : "internal error") + where + ": " + message;
    status = std::max(status, kind == "user" ? 2 : 1);
  }
  return status;
}

// Chaos testing: STRATA_FAULT's "slow_persist SECONDS" makes every persist of a flash snapshot
// pause that long before publishing, so a test can kill a rank while one is in flight.
double persist_pause_for_fault_injection() {
  const char* fault = std::getenv("STRATA_FAULT");
  if (!fault) return 0;
  std::istringstream faults(fault);
  for (std::string one; std::getline(faults, one, ';');) {
    std::istringstream in(one);
    std::string kind;
    double seconds = 0;
    if (in >> kind >> seconds && kind == "slow_persist") return seconds;
  }
  return 0;
}

// A TCP port free on this host now, for the c10d store of ranks started here (the kernel picks
// it; another process could take it before rank 0 binds, which the rendezvous then reports).
int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;  // before close(), which may set it
  if (fd >= 0) ::close(fd);
  if (!ok) throw UserError("cannot find a free TCP port for the c10d store: " + std::string(std::strerror(error)));
  return ntohs(address.sin_port);
}

}  // namespace

namespace {
// Ctrl-C and SIGTERM (a scheduler's preemption, `kill`) both stop a run gracefully: counted, as
// a second one under the supervisor stops at once.
volatile std::sig_atomic_t interrupted = 0;
void note_interrupt(int) { interrupted = interrupted + 1; }

// The supervisor's (and strata doctor's) Ctrl-C and SIGTERM: counted, not fatal, and unblocked, as
// a launcher may start us with them blocked (pending ones are then delivered here).
void count_interrupts() {
  struct sigaction action {};
  action.sa_handler = note_interrupt;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  sigset_t these;
  sigemptyset(&these);
  sigaddset(&these, SIGINT);
  sigaddset(&these, SIGTERM);
  ::sigprocmask(SIG_UNBLOCK, &these, nullptr);
}

// Ctrl-C's handler runs on a stack of its own: delivered on the thread's stack, the signal frame
// overwrote memory below the stack pointer of the oneDNN GEMM it interrupted (a heap corrupted in
// sgemm_nocopy_driver, about 1 interrupt in 6).
void catch_interrupt_on_own_stack() {
  static std::vector<char> stack(1 << 16);
  stack_t ss{};
  ss.ss_sp = stack.data();
  ss.ss_size = stack.size();
  ::sigaltstack(&ss, nullptr);
  struct sigaction action {};
  action.sa_handler = note_interrupt;
  action.sa_flags = SA_ONSTACK | SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

// `mpirun -np N ... strata ARGS`: this command's own arguments without -n (each rank is one
// process), with --resume in place of --overwrite when the attempt resumes.
std::vector<std::string> mpirun_words(int argc, char** argv, const AttemptOptions& options) {
  std::vector<std::string> words{"mpirun", "-np", std::to_string(options.ranks), "--oversubscribe", "--bind-to", "none"};
  if (::geteuid() == 0) words.push_back("--allow-run-as-root");
  words.push_back(std::filesystem::read_symlink("/proc/self/exe").string());
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-n" || arg == "--ranks") {
      ++i;
      continue;
    }
    if (arg == "--simulate-nodes") {  // the supervisor's option; the ranks learn their node from the environment
      ++i;
      continue;
    }
    if (arg.rfind("--ranks=", 0) == 0 || arg.rfind("--simulate-nodes=", 0) == 0) continue;
    if (options.resume && (arg == "--overwrite" || arg == "--resume")) continue;
    words.push_back(arg);
  }
  if (options.resume) words.push_back("--resume");
  return words;
}

// The temporary directories of one attempt (rank errors, progress files) name the supervisor
// that made them; one killed (SIGKILL) before it could remove them leaves them behind, and the
// next `strata run -n N` on this machine removes those whose supervisor is gone.
constexpr const char* kSupervisorPidFile = "supervisor_pid";

// This process's pid namespace: a pid means something only inside its own (containers may share
// /dev/shm and /tmp without sharing pids).
std::string pid_namespace() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/ns/pid", ec).string();
}

void mark_as_ours(const fs::path& dir) { std::ofstream(dir / kSupervisorPidFile) << ::getpid() << " " << pid_namespace() << "\n"; }

void remove_orphaned_attempt_dirs() {
  std::error_code ec;
  for (const char* parent : {"/dev/shm", "/tmp"})
    for (const auto& entry : fs::directory_iterator(parent, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("strata-progress-", 0) != 0 && name.rfind("strata-errors-", 0) != 0) continue;
      std::ifstream owner(entry.path() / kSupervisorPidFile);
      long pid = 0;
      std::string space;
      if (!(owner >> pid >> space) || pid <= 0 || space != pid_namespace()) continue;  // not ours to judge
      if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), ec);
    }
}

}  // namespace

// Runs `mpirun -np N strata run ...` (the same arguments but -n; with `resume`, --resume instead
// of --overwrite) and waits for it. Local
// launches oversubscribe (more ranks than cores is fine for tests) and do not bind ranks to
// cores; as root, mpirun needs to be told that is intended. Ranks write their errors to a
// directory instead of standard error, so an error every rank hits is reported once.
AttemptResult run_under_mpirun(int argc, char** argv, const AttemptOptions& options) {
  const int64_t ranks = options.ranks;
  std::vector<std::string> words = mpirun_words(argc, argv, options);
  std::vector<char*> exec_args;
  for (auto& w : words) exec_args.push_back(w.data());
  exec_args.push_back(nullptr);

  remove_orphaned_attempt_dirs();
  char pattern[] = "/tmp/strata-errors-XXXXXX";
  if (!::mkdtemp(pattern)) throw UserError("cannot create a temporary directory: " + std::string(std::strerror(errno)));
  const fs::path errors(pattern);
  mark_as_ours(errors);
  // Progress files for hang detection, in shared memory where there is some.
  char progress_pattern[] = "/dev/shm/strata-progress-XXXXXX";
  char fallback_pattern[] = "/tmp/strata-progress-XXXXXX";
  const char* progress_dir = ::mkdtemp(progress_pattern);
  if (!progress_dir) progress_dir = ::mkdtemp(fallback_pattern);
  if (!progress_dir) throw UserError("cannot create a directory for progress files: " + std::string(std::strerror(errno)));
  const fs::path progress(progress_dir);
  mark_as_ours(progress);
  // The ranks all run on this host: with [parallel] backend = "c10d" they meet at a store here
  // unless the caller named one.
  const bool name_a_store = !std::getenv("MASTER_ADDR");
  const std::string store_port = name_a_store ? std::to_string(free_local_port()) : "";
  const OomKillCount oom_kills_before = read_oom_kills();
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw UserError("cannot create a pipe: " + std::string(std::strerror(errno)));
  const pid_t child = ::fork();
  if (child == 0) {
    // A process group of its own: the terminal's Ctrl-C reaches the supervisor alone, which stops
    // the ranks gracefully (StopRelay). No terminal input (a background group reading it would be
    // stopped), and mpirun ends its ranks when the supervisor dies, even by SIGKILL.
    ::setpgid(0, 0);
    if (const int null = ::open("/dev/null", O_RDONLY); null >= 0) ::dup2(null, STDIN_FILENO), ::close(null);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    ::setenv("STRATA_ERROR_DIR", errors.c_str(), 1);
    ::setenv("STRATA_RESTART_COUNT", std::to_string(options.attempt).c_str(), 1);
    ::setenv("STRATA_PROGRESS_DIR", progress.c_str(), 1);
    // OpenMPI's shared-memory transport keeps its segments in the attempt's directory rather than
    // /dev/shm itself: ranks killed by a signal cannot remove theirs, and the supervisor removes
    // the directory after every attempt (and a later run after a killed supervisor).
    ::setenv("OMPI_MCA_btl_vader_backing_directory", progress.c_str(), 0);
    if (!options.flash_dir.empty()) ::setenv("STRATA_FLASH_DIR", options.flash_dir.c_str(), 1);
    if (!options.slots.empty()) {
      std::string slots;
      for (int s : options.slots) {
        if (!slots.empty()) slots += ",";
        slots += std::to_string(s);
      }
      ::setenv(kSlotsEnv, slots.c_str(), 1);
    }
    if (name_a_store) ::setenv("MASTER_ADDR", "127.0.0.1", 1), ::setenv("MASTER_PORT", store_port.c_str(), 1);
    ::execvp("mpirun", exec_args.data());
    std::fprintf(stderr, "strata: error: cannot start mpirun (is openmpi-bin installed?): %s\n", std::strerror(errno));
    ::_exit(2);
  }
  ::close(pipe_fds[1]);
  ::setpgid(child, child);  // as the child does, whichever runs first
  // Ctrl-C or SIGTERM: the ranks stop after one agreed step and save it; a second stops them at
  // once. Either way the run is reported and not restarted. (Not reset per attempt: one that
  // came during a restart's backoff, or before the first, stops the next attempt after its first
  // step.) run_train counts them from before it plans; strata doctor from here.
  count_interrupts();
  StopRelay stops(progress, static_cast<int>(ranks), static_cast<int>(child), interrupted);
  HangWatch hangs(progress, static_cast<int>(ranks), options.hang_timeout, options.start_timeout, static_cast<int>(child));
  StderrFilter filter;
  std::string pending;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    pending.append(buffer, static_cast<size_t>(n));
    for (size_t end; (end = pending.find('\n')) != std::string::npos; pending.erase(0, end + 1)) filter.line(pending.substr(0, end));
  }
  if (!pending.empty()) filter.line(pending);
  ::close(pipe_fds[0]);
  int wait_status = 0;
  while (::waitpid(child, &wait_status, 0) < 0 && errno == EINTR) {
  }
  std::string reported_cause;
  const int reported = report_rank_errors(errors, ranks, reported_cause);
  // mpirun's report is not shown where the ranks reported their errors, where a stop was asked for
  // (no report of how the ranks exited is needed) or where it names a rank killed by a signal (the
  // supervisor's own line names it, the OOM killer too).
  const std::string signalled = name_oom_kill(filter.cause(), oom_kills_before, read_oom_kills());
  filter.finish(reported != 0 || interrupted != 0 || !signalled.empty());
  std::error_code ignored;
  fs::remove_all(errors, ignored);
  AttemptResult result{reported ? reported : WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 1,
                       signalled.empty() ? reported_cause : signalled, interrupted != 0, {}};
  result.cause_shown = reported != 0 && signalled.empty();
  hangs.finish(result);
  fs::remove_all(progress, ignored);
  return result;
}


namespace {

// The notes of a run whose ranks no supervisor of ours watches (one process, torchrun, srun): the
// keys nothing reads, and the keys only `strata run -n N`'s supervisor honours.
void note_unsupervised(const LoadedPlan& loaded, const LaunchEnv& env) {
  for (const std::string& note : loaded.unread_notes) std::cerr << "strata: note: " << note << "\n";
  const Config& job = loaded.plan.job;
  const bool torchrun = env.launcher == "torchrun", others = env.world_size > 1;
  // Restarting needs a process outside the ranks: `strata run -n N` is one, a rank is not.
  if (job.get_int("max_restarts") > 0)
    std::cerr << "strata: note: [job] max_restarts applies under `strata run -n N`; "
              << (torchrun ? "under torchrun, torchrun --max-restarts restarts the ranks (they resume)"
                  : others ? "ranks started by another launcher are not restarted"
                           : "a run in this process is not restarted")
              << "\n";
  if (job.get_string("health_check") != "off")
    std::cerr << "strata: note: [job] health_check applies under `strata run -n N`; this run is not checked (run `strata doctor` "
                 "before it)\n";
  for (const char* watch : {"hang_timeout", "start_timeout"})
    if (job.entry(watch).value != job_schema().find(watch)->default_value)
      std::cerr << "strata: note: [job] " << watch << " applies under `strata run -n N`, whose supervisor watches the ranks; "
                << (torchrun ? "torchrun's own timeouts watch these" : others ? "ranks started by another launcher are not watched" : "this process is not watched")
                << "\n";
}

}  // namespace

int run_train(const Args& args) {
  allow_only(args, {"--set", "--disable", "--out", "--resume", "--overwrite", "-n", "--ranks", "--simulate-nodes"});
  if (args.resume && args.overwrite) throw UserError("--resume continues the run in the directory, --overwrite replaces it: give one");
  const LaunchEnv env = detect_launch_env();
  if (args.simulate_nodes > 0 && (args.ranks < 2 || env.world_size > 1))
    throw UserError("--simulate-nodes needs `strata run -n N` (its supervisor places the ranks)");
  if (args.simulate_nodes > 0 && args.ranks % args.simulate_nodes != 0)
    throw UserError("--simulate-nodes " + std::to_string(args.simulate_nodes) + " does not divide -n " + std::to_string(args.ranks) +
                    " into equal nodes");
  if (args.simulate_nodes > 0) ::setenv(kSimulatedNodesEnv, std::to_string(args.simulate_nodes).c_str(), 1);
  if (args.ranks > 1 && env.world_size == 1) {
    // Ctrl-C or SIGTERM from here on is counted, not fatal: one that comes before the ranks start
    // ends the supervisor with a line and status 130 (not a silent 143), one after stops them.
    count_interrupts();
    // Check the strategy and claim the run directory once here, so that bad input is reported
    // once and starts no ranks; the claim (its lock) lasts until the ranks are done.
    ComponentRegistry registry;
    LoadedPlan checked;
    if (!load_plan(args, args.ranks, registry, checked)) return 2;
    for (const std::string& note : checked.unread_notes) std::cerr << "strata: note: " << note << "\n";
    const fs::path out_dir = args.out_dir.empty() ? fs::path(checked.plan.job.get_string("run_dir")) : fs::path(args.out_dir);
    if (checked.plan.job.get_int("flash_every") > 0 && checked.plan.job.get_int("snapshot_replicas") > 0) {
      // Replicas need other nodes: refused here, before any rank starts, as the ranks would.
      const int64_t nodes = std::max<int64_t>(1, args.simulate_nodes);
      std::vector<int64_t> node_of(static_cast<size_t>(args.ranks));
      for (int64_t r = 0; r < args.ranks; ++r) node_of[static_cast<size_t>(r)] = r / (args.ranks / nodes);
      replica_receivers(node_of, checked.plan.job.get_int("snapshot_replicas"));
    }
    const RunDirectoryClaim claim(out_dir, args.resume, args.overwrite);
    ::setenv(kRunDirectoryClaimedEnv, "1", 1);
    // The ranks' standard output is a pipe or pseudo-terminal of mpirun's; whether progress bars
    // belong there is decided by ours.
    ::setenv(kStdoutIsTerminalEnv, ::isatty(STDOUT_FILENO) ? "1" : "0", 1);
    const Config& job = checked.plan.job;
    SupervisorOptions supervision{out_dir, job.get_int("max_restarts"), job.get_float("restart_backoff"), args.ranks, job.get_int("min_ranks")};
    if (job.get_int("flash_every") > 0) {
      supervision.flash_dir = flash_directory(out_dir);
      supervision.checkpoint_every = job.get_int("checkpoint_every");
      supervision.keep_checkpoints = job.get_int("keep_checkpoints");
      supervision.persist_at_end = job.get_bool("checkpoint_at_end");
      supervision.first_attempt_resumes = args.resume;
      supervision.simulated_nodes = args.simulate_nodes;
      supervision.persist_pause = persist_pause_for_fault_injection();
    }
    supervision.health_check = job.get_string("health_check");
    if (interrupted != 0) {
      std::cerr << "strata: interrupted before the ranks started: no rank ran, no checkpoint in " << out_dir.string() << " changed\n";
      return 130;
    }
    return supervise(supervision, [&](bool resume, int attempt, const std::vector<int>& slots) {
      const auto ranks = static_cast<int64_t>(slots.size());
      if (ranks != args.ranks) {  // elastic: the strategy must plan at the smaller world
        ComponentRegistry smaller_registry;
        LoadedPlan smaller;
        if (!load_plan(args, ranks, smaller_registry, smaller))
          return AttemptResult{2, "the strategy does not plan at " + std::to_string(ranks) + " ranks", false, {}};
        const int64_t replicas = job.get_int("flash_every") > 0 ? job.get_int("snapshot_replicas") : 0;
        const char* nodes = std::getenv(kSimulatedNodesEnv);  // the nodes left, after a node shrink
        if (const std::string why = replica_nodes_problem(nodes ? std::atoi(nodes) : 1, replicas); !why.empty()) {
          std::cerr << "strata: error: " << why << "; continue with `strata run -n " << ranks << " " << (out_dir / "strategy.toml").string()
                    << " --out " << out_dir.string() << " --resume --set job.snapshot_replicas=0`\n";
          return AttemptResult{2, why, false, {}};
        }
      }
      return run_under_mpirun(args.argc, args.argv,
                              AttemptOptions{ranks, resume, attempt, job.get_float("hang_timeout"), job.get_float("start_timeout"),
                                             supervision.flash_dir.string(), slots});
    });
  }
  if (args.ranks > 1 && args.ranks != env.world_size)
    throw UserError("-n " + std::to_string(args.ranks) + " but the launcher started " + std::to_string(env.world_size) + " ranks");
  // A rank of our supervisor's mpirun ends with it: a supervisor killed outright makes mpirun end
  // its ranks (run_under_mpirun), and one that outlives mpirun would write into a run directory
  // the next run may already hold.
  if (std::getenv(kRunDirectoryClaimedEnv)) {
    const pid_t launcher = ::getppid();
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) return 1;  // it ended before the request took hold
  }
  ComponentRegistry registry;
  LoadedPlan loaded;
  if (!load_plan(args, env.world_size, registry, loaded)) return 2;
  // Under `strata run -n N` its supervisor printed the notes, once; else rank 0 prints them.
  if (env.rank == 0 && !std::getenv(kRunDirectoryClaimedEnv)) note_unsupervised(loaded, env);
  // A worker group that torchelastic restarted (torchrun --max-restarts) continues the run from
  // its newest checkpoint, whatever the first attempt was told (the Trainer sees to it).
  const bool restarted = restarted_by_torchelastic(env);
  const RunOptions options{args.out_dir, args.resume || restarted, args.overwrite && !restarted, {}};
  const fs::path out_dir = args.out_dir.empty() ? fs::path(loaded.plan.job.get_string("run_dir")) : fs::path(args.out_dir);
  const bool leader = env.rank == 0;
  const ParallelLayout& l = loaded.plan.layout;
  if (leader) std::cout << "strata: " << (options.resume ? "continuing" : "training") << " in " << out_dir.string() << ": "
                        << "world " << l.world_size << " (data " << l.mesh.data << " x tensor " << l.mesh.tensor << " x pipeline " << l.mesh.pipeline
                        << " x context " << l.mesh.context << "), strategy " << loaded.plan.file << ", " << loaded.plan.job.get_int("steps")
                        << " steps\n" << std::flush;
  Trainer trainer(loaded.plan, loaded.order, registry, options);
  // Ctrl-C or SIGTERM in a single process stops before the next step and saves it. Ranks stop
  // together (a rank alone cannot take a collective checkpoint): under our supervisor at its
  // request; started by another launcher (torchrun, srun, mpirun), at the signal any of them got,
  // agreed at the next logging step (Trainer::run).
  const bool single = env.world_size == 1, supervised = std::getenv(kRunDirectoryClaimedEnv) != nullptr;
  const bool catches = single || !supervised;
  if (catches) interrupted = 0, catch_interrupt_on_own_stack();
  const RunSummary summary = trainer.run([&] { return catches && interrupted != 0; });
  if (catches) ::signal(SIGINT, SIG_DFL), ::signal(SIGTERM, SIG_DFL);
  // The supervisor tells the ranks how many simulated nodes the job has now (it may have shrunk).
  const char* simulated = std::getenv(kSimulatedNodesEnv);
  const std::string nodes = env.world_size > 1 && simulated && std::atoi(simulated) > 0 ? "--simulate-nodes " + std::string(simulated) + " " : "";
  const std::string ranks = env.world_size > 1 ? "-n " + std::to_string(env.world_size) + " " + nodes : "";
  const std::string resume = "strata run " + ranks + (out_dir / "strategy.toml").string() + " --out " + out_dir.string() + " --resume";
  if (trainer.completed_steps() < trainer.total_steps()) {
    trainer.save();
    // Under the supervisor it says so, once.
    if (leader && !supervised)
      std::cout << "strata: interrupted at step " << trainer.completed_steps() << " of " << trainer.total_steps()
                << " (checkpoint saved); continue with `" << resume << "`\n";
    return 130;
  }
  if (leader) {
    std::ostringstream line;
    line.precision(5);
    // A resume of a finished run computes no step: no loss to report, and more steps are the way on.
    if (summary.first_step > summary.last_step)
      line << "strata: done: the checkpoint of step " << summary.last_step << " ends the run ([job] steps = " << trainer.total_steps()
           << "); nothing was trained";
    else line << "strata: done: step " << summary.last_step << ", loss " << summary.last_loss;
    if (trainer.metrics().val_loss && summary.first_step <= summary.last_step) line << ", val_loss " << *trainer.metrics().val_loss;
    if (loaded.plan.job.get_bool("checkpoint_at_end")) {
      line << "; checkpoint in " << (out_dir / "checkpoints").string() << "; `strata report " << out_dir.string()
           << "` charts it, `strata ckpt export " << out_dir.string() << " DIR` exports it for transformers, and `" << resume
           << " --set job.steps=N` trains on";
    } else {
      line << "; no checkpoint at the end ([job] checkpoint_at_end = false); `strata report " << out_dir.string() << "` charts it";
    }
    std::cout << line.str() << "\n";
  }
  return 0;
}

}  // namespace strata::cli
