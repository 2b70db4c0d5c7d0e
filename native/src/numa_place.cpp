#include "numa_place.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <string>

#include "driver.hpp"
#include "env.hpp"
#include "log.hpp"

namespace cmt {
namespace {

constexpr int kMpolDefault = 0, kMpolPreferred = 1;  // <linux/mempolicy.h>, without the header
constexpr int kMaxNodes = 1024;

std::string read_line(const std::string& path) {
  std::string line;
  if (FILE* f = fopen(path.c_str(), "re")) {
    char buf[4096];
    if (fgets(buf, sizeof buf, f)) line = buf;
    fclose(f);
  }
  while (!line.empty() && isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

// A sysfs list such as "0-3,8,10-11" into `set`; the count of entries, or -1 if malformed.
int parse_list(const std::string& text, cpu_set_t* set) {
  CPU_ZERO(set);
  int count = 0;
  const char* p = text.c_str();
  while (*p) {
    char* end = nullptr;
    long a = strtol(p, &end, 10);
    if (end == p || a < 0) return -1;
    long b = a;
    p = end;
    if (*p == '-') {
      b = strtol(p + 1, &end, 10);
      if (end == p + 1 || b < a) return -1;
      p = end;
    }
    for (long i = a; i <= b && i < CPU_SETSIZE; ++i) CPU_SET(static_cast<int>(i), set);
    count += static_cast<int>(b - a + 1);
    if (*p == ',') ++p;
    else if (*p) return -1;
  }
  return count;
}

// The sysfs name of a PCI device: the driver says "00000000:1A:00.0", sysfs "0000:1a:00.0".
std::string sysfs_bus_id(const char* driver_id) {
  std::string id(driver_id);
  size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4) id = id.substr(colon - 4);
  for (char& c : id) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return id;
}

const cpu_set_t& home_cpus() {  // where the process's threads may run: the main thread's mask
  static const cpu_set_t home = [] {
    cpu_set_t s;
    CPU_ZERO(&s);
    if (sched_getaffinity(getpid(), sizeof s, &s) != 0) CPU_ZERO(&s);
    return s;
  }();
  return home;
}

}  // namespace

bool numa_one_node() {
  const std::string root = env().test_sysfs.empty() ? "/sys" : env().test_sysfs;
  cpu_set_t nodes;
  return parse_list(read_line(root + "/devices/system/node/online"), &nodes) < 2;
}

NumaPlace numa_place_for(CUdevice dev) {
  NumaPlace place;
  const Driver& d = driver();
  const std::string root = env().test_sysfs.empty() ? "/sys" : env().test_sysfs;
  char bus[32] = {};
  if (!d.cuDeviceGetPCIBusId || d.cuDeviceGetPCIBusId(bus, sizeof bus, dev) != CUDA_SUCCESS) return place;
  if (numa_one_node()) return place;
  const std::string node_text = read_line(root + "/bus/pci/devices/" + sysfs_bus_id(bus) + "/numa_node");
  char* end = nullptr;
  const long node = strtol(node_text.c_str(), &end, 10);
  if (node_text.empty() || *end || node < 0 || node >= kMaxNodes) return place;
  cpu_set_t cpus;
  if (parse_list(read_line(root + "/devices/system/node/node" + std::to_string(node) + "/cpulist"), &cpus) <= 0) {
    return place;
  }
  CPU_AND(&place.cpus, &cpus, &home_cpus());
  if (CPU_COUNT(&place.cpus) == 0) {
    log::debug_once(0x6e75, "the GPU's NUMA node has none of the CPUs this process may use; threads are not placed");
    return place;
  }
  place.node = static_cast<int>(node);
  log::write(log::Level::Debug, "GPU %s is on NUMA node %ld: its copy threads and staging go there", bus, node);
  return place;
}

bool numa_move_setup_thread(const NumaPlace& place) {
  if (!place.placed()) return true;
  unsigned long mask[kMaxNodes / (8 * sizeof(unsigned long))] = {};
  mask[place.node / (8 * sizeof(unsigned long))] |= 1UL << (place.node % (8 * sizeof(unsigned long)));
  const bool moved = sched_setaffinity(0, sizeof place.cpus, &place.cpus) == 0;
  // Preferred, not bound: a full node still gives memory from another rather than failing.
  const bool memory = syscall(SYS_set_mempolicy, kMpolPreferred, mask, kMaxNodes) == 0;
  if (!moved || !memory) log::debug_once(0x6e76, "the setup thread could not be placed on the GPU's NUMA node");
  return moved && memory;
}

void numa_follow(const NumaPlace* place, int* current) {
  const int want = place && place->placed() ? place->node : -1;
  if (want == *current) return;
  const cpu_set_t& cpus = want >= 0 ? place->cpus : home_cpus();
  if (CPU_COUNT(&cpus) && sched_setaffinity(0, sizeof cpus, &cpus) == 0) *current = want;
}

void numa_worker_start() { syscall(SYS_set_mempolicy, kMpolDefault, nullptr, 0); }

}  // namespace cmt
