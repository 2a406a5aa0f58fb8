#include "strata/core/process_memory.h"

#include <unistd.h>

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

double peak_resident_bytes() {
  double kib = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
    std::fclose(f);
  }
  return kib * 1024.0;
}

void release_free_memory() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

}  // namespace strata
