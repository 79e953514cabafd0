// MLA decode (DeepSeek latent attention over a paged cache) in CUDA: a simple, correct start.
//
// One thread block per (head, sequence).  Each warp takes every NWARPS-th
// cached token of the sequence: it looks the token's page up in the block
// table, computes the score q_nope.c + q_pe.k_pe with its 32 lanes splitting
// the 576 values of the row, and keeps its own online softmax (running max,
// running sum, weighted latent row) in float32 registers.  At the end the
// warps' partial results are merged through shared memory and the block writes
// the head's bf16 output row.
//
// Every head re-reads the sequence's cache rows (from L2 after the first); a
// fast kernel lets one block serve many heads, since all heads share the rows,
// and splits long sequences over several blocks.
//
// Build: nvcc -O3 -shared -Xcompiler -fPIC -arch=sm_90 -o mla.so mla_cuda.cu

#include <stdint.h>
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define THREADS 128  // knob: 64, 128, 256
#define MAX_RANK 512  // largest kv_lora_rank supported (a multiple of 32)
#define MAX_ROPE 64   // largest qk_rope_dim supported (a multiple of 32)

#define WARP_SIZE 32
#define NWARPS (THREADS / WARP_SIZE)
#define RANK_PER_LANE (MAX_RANK / WARP_SIZE)
#define ROPE_PER_LANE (MAX_ROPE / WARP_SIZE)

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    }
    return x;
}

__global__ void __launch_bounds__(THREADS) mla_decode_kernel(
    const __nv_bfloat16* __restrict__ q_nope,
    const __nv_bfloat16* __restrict__ q_pe,
    const __nv_bfloat16* __restrict__ kv_cache,
    __nv_bfloat16* __restrict__ output,
    const int32_t* __restrict__ cache_seqlens,
    const int32_t* __restrict__ block_table,
    int64_t table_stride,  // block-table entries per sequence
    int num_heads,
    int rank,
    int rope,
    int page_size,
    float scale)
{
    const int head = blockIdx.x;
    const int batch = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int width = rank + rope;
    const int seqlen = cache_seqlens[batch];

    // This lane's share of the (pre-scaled) query: latent dims lane, lane + 32, ...
    const int64_t row = (int64_t)batch * num_heads + head;
    float qn[RANK_PER_LANE];
    float qp[ROPE_PER_LANE];
    float acc[RANK_PER_LANE];
#pragma unroll
    for (int i = 0; i < RANK_PER_LANE; ++i) {
        const int d = lane + i * WARP_SIZE;
        qn[i] = d < rank ? __bfloat162float(q_nope[row * rank + d]) * scale : 0.0f;
        acc[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < ROPE_PER_LANE; ++i) {
        const int d = lane + i * WARP_SIZE;
        qp[i] = d < rope ? __bfloat162float(q_pe[row * rope + d]) * scale : 0.0f;
    }

    float m = -INFINITY;  // running max of the scores this warp has seen
    float l = 0.0f;       // running sum of exp(score - m)
    const int32_t* table = block_table + (int64_t)batch * table_stride;

    for (int t = warp; t < seqlen; t += NWARPS) {
        const int64_t page = table[t / page_size];
        const __nv_bfloat16* kv_row = kv_cache + (page * page_size + t % page_size) * width;

        float c[RANK_PER_LANE];
        float partial = 0.0f;
#pragma unroll
        for (int i = 0; i < RANK_PER_LANE; ++i) {
            const int d = lane + i * WARP_SIZE;
            c[i] = d < rank ? __bfloat162float(kv_row[d]) : 0.0f;
            partial += qn[i] * c[i];
        }
#pragma unroll
        for (int i = 0; i < ROPE_PER_LANE; ++i) {
            const int d = lane + i * WARP_SIZE;
            if (d < rope) partial += qp[i] * __bfloat162float(kv_row[rank + d]);
        }
        const float score = warp_sum(partial);

        const float m_new = fmaxf(m, score);
        const float alpha = expf(m - m_new);  // 0 on the first token (m = -inf)
        const float p = expf(score - m_new);
        l = l * alpha + p;
#pragma unroll
        for (int i = 0; i < RANK_PER_LANE; ++i) acc[i] = acc[i] * alpha + p * c[i];
        m = m_new;
    }

    // Merge the warps: rescale each warp's state to the block-wide max.
    __shared__ float s_max[NWARPS];
    __shared__ float s_sum[NWARPS];
    __shared__ float s_acc[NWARPS][MAX_RANK];
    if (lane == 0) {
        s_max[warp] = m;
        s_sum[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < RANK_PER_LANE; ++i) {
        const int d = lane + i * WARP_SIZE;
        if (d < rank) s_acc[warp][d] = acc[i];
    }
    __syncthreads();

    float block_max = -INFINITY;
    for (int w = 0; w < NWARPS; ++w) block_max = fmaxf(block_max, s_max[w]);
    float weight[NWARPS];
    float total = 0.0f;
    for (int w = 0; w < NWARPS; ++w) {
        // A warp that saw no token has s_max = -inf and s_sum = 0: weight 0.
        weight[w] = s_sum[w] > 0.0f ? expf(s_max[w] - block_max) : 0.0f;
        total += s_sum[w] * weight[w];
    }
    const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;  // empty cache: zeros

    __nv_bfloat16* out_row = output + row * rank;
    for (int d = threadIdx.x; d < rank; d += THREADS) {
        float o = 0.0f;
        for (int w = 0; w < NWARPS; ++w) o += s_acc[w][d] * weight[w];
        out_row[d] = __float2bfloat16(o * inv_total);
    }
}

extern "C" void run_kernel(
    const __nv_bfloat16* q_nope,
    const __nv_bfloat16* q_pe,
    const __nv_bfloat16* kv_cache,
    __nv_bfloat16* output,
    const int32_t* cache_seqlens,
    const int32_t* block_table,
    int64_t batch_size,
    int64_t max_seqlen,
    int64_t num_heads,
    int64_t kv_lora_rank,
    int64_t qk_rope_dim,
    int64_t page_block_size,
    int64_t num_blocks)
{
    (void)max_seqlen;  // each sequence's length comes from cache_seqlens
    if (batch_size <= 0 || num_heads <= 0) return;
    if (kv_lora_rank > MAX_RANK || qk_rope_dim > MAX_ROPE) return;
    const int64_t table_stride = num_blocks / batch_size;
    const dim3 grid((unsigned)num_heads, (unsigned)batch_size);
    const float scale = 1.0f / sqrtf((float)(kv_lora_rank + qk_rope_dim));
    mla_decode_kernel<<<grid, THREADS>>>(
        q_nope, q_pe, kv_cache, output, cache_seqlens, block_table, table_stride, (int)num_heads,
        (int)kv_lora_rank, (int)qk_rope_dim, (int)page_block_size, scale);
}
