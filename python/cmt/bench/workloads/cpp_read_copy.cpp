// The read-then-copy loader of many C++ inference servers: std::ifstream::read of each tensor of a
// safetensors file into one reused pageable buffer, then a cudaMemcpy of it to the GPU. Built at run
// time by cpp_read_copy.py; under `cmt run` its pageable copies go through cmt's engine.
//   usage: cpp_read_copy PLAN   (PLAN: the file's path; data start, data size, checksum; then one
//                                "begin end" line per tensor, offsets in the data section)
// Prints one JSON line: the seconds of the loop, bytes, and whether the GPU's bytes match the checksum
// (sum of the data section's little-endian 32-bit words times their 1-based index, mod 2^64); exit 1
// if they do not.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

static bool ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return e == cudaSuccess;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PLAN\n", argv[0]);
    return 2;
  }
  std::ifstream plan(argv[1]);
  std::string path;
  uint64_t start = 0, size = 0, want = 0, b = 0, e = 0;
  std::getline(plan, path);
  plan >> start >> size >> want;
  std::vector<std::pair<uint64_t, uint64_t>> tensors;
  uint64_t largest = 0;
  while (plan >> b >> e) {
    tensors.emplace_back(b, e);
    largest = std::max(largest, e - b);
  }
  if (path.empty() || tensors.empty() || size == 0) {
    std::fprintf(stderr, "%s: not a plan\n", argv[1]);
    return 2;
  }
  // The context and the model's allocation come before the timer, as in a server that knows the
  // model's size from its header.
  char* dev = nullptr;
  if (!ok(cudaMalloc(&dev, size), "cudaMalloc")) return 1;
  std::vector<char> buf(largest);  // one pageable buffer, reused for every tensor

  auto t0 = std::chrono::steady_clock::now();
  std::ifstream f(path, std::ios::binary);
  for (const auto& [begin, end] : tensors) {
    const auto n = static_cast<std::streamsize>(end - begin);
    f.seekg(static_cast<std::streamoff>(start + begin));
    f.read(buf.data(), n);
    if (f.gcount() != n) {
      std::fprintf(stderr, "%s: short read at %" PRIu64 "\n", path.c_str(), start + begin);
      return 1;
    }
    if (!ok(cudaMemcpy(dev + begin, buf.data(), end - begin, cudaMemcpyHostToDevice), "cudaMemcpy")) return 1;
  }
  if (!ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The check, untimed: the GPU's bytes back in 64 MiB pieces.
  const uint64_t piece = 64ull << 20;
  std::vector<uint32_t> back(piece / 4);
  uint64_t sum = 0, index = 1;
  for (uint64_t off = 0; off < size; off += piece) {
    const uint64_t n = std::min(piece, size - off);
    back[(n - 1) / 4] = 0;  // a last word short of 4 bytes counts as zero-padded
    if (!ok(cudaMemcpy(back.data(), dev + off, n, cudaMemcpyDeviceToHost), "cudaMemcpy back")) return 1;
    for (uint64_t i = 0; i < (n + 3) / 4; ++i) sum += static_cast<uint64_t>(back[i]) * index++;
  }
  std::printf("{\"seconds\": %.6f, \"bytes\": %" PRIu64 ", \"tensors\": %zu, \"checksum_ok\": %s}\n", seconds,
              size, tensors.size(), sum == want ? "true" : "false");
  cudaFree(dev);
  return sum == want ? 0 : 1;
}
