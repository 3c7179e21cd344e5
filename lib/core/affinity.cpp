// Cores as sets and lists, and thread binding (affinity.h), on Linux's affinity calls.
#include "lib/core/affinity.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "lib/core/check.h"

namespace hn::detail {
namespace {

thread_local bool library_thread = false;

// Cores CPU_SETSIZE and above cannot be named in a cpu_set_t.
int machine_cores() {
  return static_cast<int>(
      std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), CPU_SETSIZE));
}

}  // namespace

std::vector<int> allowed_cores() {
  std::vector<int> cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int core = 0; core < CPU_SETSIZE; ++core)
      if (CPU_ISSET(core, &set)) cores.push_back(core);
  }
  if (cores.empty()) {
    for (int core = 0; core < machine_cores(); ++core)
      cores.push_back(core);
  }
  return cores;
}

std::string format_cores(const std::vector<int>& cores) {
  std::string text;
  for (std::size_t i = 0; i < cores.size();) {
    std::size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1)
      ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cores[i]);
    if (j > i) text += '-' + std::to_string(cores[j]);
    i = j + 1;
  }
  return text;
}

std::vector<int> parse_cores(const std::string& text, const std::string& what) {
  const int limit = std::max(machine_cores(), allowed_cores().back() + 1);
  const auto number = [&](const std::string& part) {
    HN_CHECK(!part.empty() && part.size() <= 6 &&
                 std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }),
             "{}: '{}' is not a list of cores such as 0-5,8", what, text);
    const int core = std::atoi(part.c_str());
    HN_CHECK(core < limit, "{}: core {} in '{}' is beyond this machine's {} (0-{})", what, core,
             text, limit, limit - 1);
    return core;
  };
  std::vector<int> cores;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = text.substr(start, comma - start);
    const std::size_t dash = part.find('-');
    if (dash == std::string::npos) {
      cores.push_back(number(part));
    } else {
      const int first = number(part.substr(0, dash)), last = number(part.substr(dash + 1));
      HN_CHECK(first <= last, "{}: range '{}' in '{}' runs backwards", what, part, text);
      for (int core = first; core <= last; ++core)
        cores.push_back(core);
    }
    start = comma + 1;
  }
  std::sort(cores.begin(), cores.end());
  cores.erase(std::unique(cores.begin(), cores.end()), cores.end());
  return cores;
}

std::vector<std::vector<int>> share_cores(const std::vector<int>& allowed, int teams,
                                          int reserved) {
  std::vector<std::vector<int>> shares;
  if (allowed.empty() || teams <= 0) return shares;
  const int usable = std::max(1, static_cast<int>(allowed.size()) - std::max(0, reserved));
  const int each = std::max(1, usable / teams);
  for (int t = 0; t < teams; ++t) {
    const int first = std::min(t * each, usable - 1);
    const int last = std::min(first + each, usable);
    shares.emplace_back(allowed.begin() + first, allowed.begin() + last);
  }
  return shares;
}

bool bind_this_thread(const std::vector<int>& cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int core : cores)
    if (core >= 0 && core < CPU_SETSIZE) CPU_SET(core, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

bool on_library_thread() {
  return library_thread;
}

void mark_library_thread() {
  library_thread = true;
}

}  // namespace hn::detail
