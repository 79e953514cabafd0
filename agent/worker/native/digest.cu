// The outputs' digest in one pass (worker/digests.py's formula, bit for bit): per 8-byte word w at word position p,
// for each lane l, z = (w ^ (p * MIX1 + LANE_l)) * MIX0, sum_l += (z ^ (z >> 32)) * MIX1, all mod 2^64. One read of
// the outputs where the torch formula takes ten passes over twice their size: 2 ms a call for 128 MiB of outputs
// on an H100, and 0.2 ms for decode's small ones (bench/call_cost.py). Compiled to PTX (digest_ptx.h) for timer.c.
#define MIX0 0xBF58476D1CE4E5B9ull
#define MIX1 0x94D049BB133111EBull
#define LANE0 0x9E3779B97F4A7C15ull
#define LANE1 0xD1B54A32D192ED03ull

extern "C" __global__ void optagent_digest(const unsigned long long *words, unsigned long long n,
                                           unsigned long long *sums) {
    unsigned long long a0 = 0, a1 = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long w = words[i];
        unsigned long long salt = i * MIX1;
        unsigned long long z0 = (w ^ (salt + LANE0)) * MIX0, z1 = (w ^ (salt + LANE1)) * MIX0;
        a0 += (z0 ^ (z0 >> 32)) * MIX1;
        a1 += (z1 ^ (z1 >> 32)) * MIX1;
    }
    for (int off = 16; off > 0; off >>= 1) {
        a0 += __shfl_down_sync(0xffffffffu, a0, off);
        a1 += __shfl_down_sync(0xffffffffu, a1, off);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(sums, a0);
        atomicAdd(sums + 1, a1);
    }
}
