#pragma once

// This process's memory, for the benchmarks that set it against a theory.

#include <fstream>
#include <string>

namespace rlmesh::bench {

// Resident set now, bytes (/proc/self/statm's second field, in 4 KiB pages).
inline double RssBytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * 4096.0;
}

// The largest resident set of this program so far, bytes (/proc/self/status
// VmHWM). Not getrusage's ru_maxrss: Linux keeps that across execve, so a
// benchmark started by a large process (a Python driver holding a model)
// would report its parent's peak whenever its own is smaller.
inline double PeakRssBytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmHWM:") {
      long kib = 0;
      f >> kib;
      return static_cast<double>(kib) * 1024.0;
    }
    std::getline(f, key);
  }
  return 0.0;
}

// Resets PeakRssBytes() to the resident set now (Linux's clear_refs "5"), so
// that a phase's own peak can be read after it. False when the kernel
// refuses.
inline bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

}  // namespace rlmesh::bench
