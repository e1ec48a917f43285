// Experiment: the int8 GEMV's memory access pattern without its compute. Does the [P, n, W] plane layout (per warp
// instruction: 8 rows x 64 contiguous bytes) limit the bandwidth, against an item-major layout (512 contiguous bytes per
// instruction), at 2 / 4 / 8 ring stages? nvcc -O3 -arch=sm_90a -std=c++17 membench.cu -o membench
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void waitg() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

constexpr int B = 3;
constexpr int kItemBytes = 2 * B * 32 * 16;   // 3 KB

// layout 0: planes [B, n, W]; layout 1: item-major [tile][group][h][j][lane] uint4
template <int kStages, int kLayout, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) stream(const uint32_t* __restrict__ p, int64_t n, int64_t W, uint32_t* out) {
  extern __shared__ __align__(16) unsigned char sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t G = W / 16, tiles = n / 16;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm)) + warp * kStages * kItemBytes;
  // the warp's items in order
  int64_t it_tile = blockIdx.x, it_gi = warp;
  auto issue = [&](int stage) {
    if (it_tile < tiles) {
      const uint32_t st = base + stage * kItemBytes;
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < B; ++j) {
          const uint32_t* src;
          if (kLayout == 0) src = p + (j * n + it_tile * 16 + g + 8 * h) * W + 16 * it_gi + 4 * t;
          else src = p + ((it_tile * G + it_gi) * kItemBytes + ((h * B + j) * 32 + lane) * 16) / 4;
          cp16(st + ((h * B + j) * 32 + lane) * 16, src);
        }
    }
    commit();
    it_gi += kWarps;
    if (it_gi >= G) { it_gi = warp; it_tile += gridDim.x; }
  };
  for (int s = 0; s + 1 < kStages; ++s) issue(s);
  uint32_t acc = 0;
  int stage = 0, istage = kStages - 1;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x)
    for (int64_t gi = warp; gi < G; gi += kWarps) {
      __syncwarp();
      issue(istage);
      istage = istage + 1 == kStages ? 0 : istage + 1;
      waitg<kStages - 1>();
      __syncwarp();
      const uint32_t st = base + stage * kItemBytes;
      for (int q = 0; q < 2 * B; ++q) {
        uint32_t v;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(st + (q * 32 + lane) * 16));
        acc ^= v;
      }
      stage = stage + 1 == kStages ? 0 : stage + 1;
    }
  waitg<0>();
  if (acc == 0x12345678u) out[0] = acc;
}

__global__ void readall(const uint4* __restrict__ p, int64_t n4, uint32_t* out) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
    uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

template <typename F>
float time_med(F f, int iters) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> ts;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a); f(i); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1000);
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  struct Shape { int64_t n, k; } shapes[] = {{12288, 4096}, {22016, 4096}, {4096, 11008}, {28672, 8192}};
  uint32_t* out; cudaMalloc(&out, 4);
  for (auto sh : shapes) {
    const int64_t W = sh.k / 32, bytes = B * sh.n * W * 4;
    const int copies = std::max<int64_t>(2, (256ll << 20) / bytes + 1);
    std::vector<uint32_t*> bufs(copies);
    for (auto& b : bufs) { cudaMalloc(&b, bytes); cudaMemset(b, 1, bytes); }
    printf("%lldx%lld 3-bit: %.1f MB, %d copies rotated\n", (long long)sh.n, (long long)sh.k, bytes / 1e6, copies);
    float t = time_med([&](int i) { readall<<<sms * 8, 512>>>(reinterpret_cast<const uint4*>(bufs[i % copies]), bytes / 16, out); }, 30);
    printf("  plain read (grid-stride uint4):      %7.1f us  %6.2f TB/s\n", t, bytes / t / 1e6);
    auto run = [&](auto kern, int stages, int warps, const char* name) {
      const size_t smem = (size_t)warps * stages * kItemBytes;
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      int per_sm = 0; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, warps * 32, smem);
      const int64_t tiles = sh.n / 16;
      per_sm = std::min<int64_t>(std::min(per_sm, 4), (tiles + sms - 1) / sms);
      const int grid = per_sm * sms;
      float tt = time_med([&](int i) { kern<<<grid, warps * 32, smem>>>(bufs[i % copies], sh.n, W, out); }, 30);
      printf("  %-36s %7.1f us  %6.2f TB/s  (%d CTAs/SM)\n", name, tt, bytes / tt / 1e6, per_sm);
    };
    run(stream<2, 0, 4>, 2, 4, "planes, 2 stages, 4 warps");
    run(stream<4, 0, 4>, 4, 4, "planes, 4 stages, 4 warps");
    run(stream<8, 0, 4>, 8, 4, "planes, 8 stages, 4 warps");
    run(stream<2, 0, 8>, 2, 8, "planes, 2 stages, 8 warps");
    run(stream<2, 1, 4>, 2, 4, "item-major, 2 stages, 4 warps");
    run(stream<4, 1, 4>, 4, 4, "item-major, 4 stages, 4 warps");
    run(stream<8, 1, 4>, 8, 4, "item-major, 8 stages, 4 warps");
    for (auto& b : bufs) cudaFree(b);
  }
  cudaError_t e = cudaDeviceSynchronize();
  printf("%s\n", cudaGetErrorString(e));
}
