#include "strata/core/process_memory.h"

#include "strata/errors.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace strata {

double resident_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

namespace {
double cap = 0;  // cap_allocations's bytes

// A "Name:  N kB" line of /proc/self/status, in bytes (0 where it is missing).
double status_bytes(const std::string& field) {
  const std::string format = field + ": %lf kB";
  double kib = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, format.c_str(), &kib) == 1) break;
    std::fclose(f);
  }
  return kib * 1024.0;
}
}  // namespace

double peak_resident_bytes() { return status_bytes("VmHWM"); }

double allocated_bytes() { return status_bytes("VmData"); }

double cap_allocations(double bytes) {
#ifdef __GLIBC__
  // glibc raises its mmap threshold (to 32 MiB) as large blocks are freed, so later ones come from
  // the heap, whose freed space stays mapped and counted: fixed at 256 KiB, each larger block is
  // mapped for itself and unmapped when freed, so the cap counts what is live.
  ::mallopt(M_MMAP_THRESHOLD, 256 << 10);
  ::mallopt(M_TRIM_THRESHOLD, 256 << 10);
#endif
  const double limit = allocated_bytes() + bytes;
  struct rlimit current {};
  ::getrlimit(RLIMIT_DATA, &current);
  struct rlimit wanted = current;
  wanted.rlim_cur = static_cast<rlim_t>(limit);
  if (current.rlim_max != RLIM_INFINITY && wanted.rlim_cur > current.rlim_max) wanted.rlim_cur = current.rlim_max;
  if (::setrlimit(RLIMIT_DATA, &wanted) != 0)
    throw UserError("[job] rank_memory_limit_mb: the system refused the data limit (" + std::string(std::strerror(errno)) + ")");
  cap = bytes;
  return static_cast<double>(wanted.rlim_cur);
}

double allocation_cap() { return cap; }

bool is_allocation_failure(const std::string& what) {
  // libtorch's allocator, the C++ runtime, the system, and oneDNN (which reports a primitive whose
  // scratch memory could not be allocated only as a primitive that could not run).
  return what.find("can't allocate memory") != std::string::npos || what.find("std::bad_alloc") != std::string::npos ||
         what.find("Cannot allocate memory") != std::string::npos || what.find("could not execute a primitive") != std::string::npos;
}

void release_free_memory() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

}  // namespace strata
