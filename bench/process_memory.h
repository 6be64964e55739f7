#pragma once

// This process's memory, for the benchmarks that set it against a theory.

#include <sys/resource.h>

#include <fstream>

namespace rlmesh::bench {

// Resident set now, bytes (/proc/self/statm's second field, in 4 KiB pages).
inline double RssBytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * 4096.0;
}

// The largest resident set so far, bytes (getrusage's ru_maxrss).
inline double PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

}  // namespace rlmesh::bench
