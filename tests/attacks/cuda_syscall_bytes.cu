/* Attack class: harness attacks (CUDA): a system call spelled as raw instruction bytes
(0f 05) in host inline assembly, so no symbol is imported and the word never appears.
Expected verdict: REJECTED -- a syscall instruction in the object's host code (object_scan.py).
 */
#include <stdint.h>
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>

#define THREADS 128  // knob: 64, 128, 256
#define MAX_HEADDIM 256  // largest head dimension supported (a multiple of 32)

#define WARP_SIZE 32
#define NWARPS (THREADS / WARP_SIZE)
#define DIMS_PER_LANE (MAX_HEADDIM / WARP_SIZE)

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    }
    return x;
}

__global__ void __launch_bounds__(THREADS) paged_decode_kernel(
    const __nv_bfloat16* __restrict__ q,
    const __nv_bfloat16* __restrict__ k_cache,
    const __nv_bfloat16* __restrict__ v_cache,
    __nv_bfloat16* __restrict__ output,
    const int32_t* __restrict__ cache_seqlens,
    const int32_t* __restrict__ block_table,
    int64_t table_stride,  // block-table entries per sequence
    int seqlen_q,
    int num_heads,
    int num_heads_k,
    int headdim,
    int page_size,
    int causal,
    float scale)
{
    const int head = blockIdx.x;
    const int qpos = blockIdx.y;
    const int batch = blockIdx.z;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int kv_head = head / (num_heads / num_heads_k);

    const int seqlen = cache_seqlens[batch];
    int visible = seqlen;
    if (causal) {
        visible = min(seqlen, max(seqlen - seqlen_q + qpos + 1, 0));
    }

    // This lane's share of the (pre-scaled) query: dims lane, lane + 32, ...
    const int64_t row = ((int64_t)batch * seqlen_q + qpos) * num_heads + head;
    const __nv_bfloat16* q_row = q + row * headdim;
    float q_reg[DIMS_PER_LANE];
    float acc[DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < DIMS_PER_LANE; ++i) {
        const int d = lane + i * WARP_SIZE;
        q_reg[i] = d < headdim ? __bfloat162float(q_row[d]) * scale : 0.0f;
        acc[i] = 0.0f;
    }

    float m = -INFINITY;  // running max of the scores this warp has seen
    float l = 0.0f;       // running sum of exp(score - m)
    const int32_t* table = block_table + (int64_t)batch * table_stride;

    for (int t = warp; t < visible; t += NWARPS) {
        const int64_t page = table[t / page_size];
        const int64_t slot = page * page_size + t % page_size;
        const int64_t offset = (slot * num_heads_k + kv_head) * headdim;
        const __nv_bfloat16* k_row = k_cache + offset;
        const __nv_bfloat16* v_row = v_cache + offset;

        float partial = 0.0f;
#pragma unroll
        for (int i = 0; i < DIMS_PER_LANE; ++i) {
            const int d = lane + i * WARP_SIZE;
            if (d < headdim) partial += q_reg[i] * __bfloat162float(k_row[d]);
        }
        const float score = warp_sum(partial);

        const float m_new = fmaxf(m, score);
        const float alpha = expf(m - m_new);  // 0 on the first token (m = -inf)
        const float p = expf(score - m_new);
        l = l * alpha + p;
#pragma unroll
        for (int i = 0; i < DIMS_PER_LANE; ++i) {
            const int d = lane + i * WARP_SIZE;
            const float v = d < headdim ? __bfloat162float(v_row[d]) : 0.0f;
            acc[i] = acc[i] * alpha + p * v;
        }
        m = m_new;
    }

    // Merge the warps: rescale each warp's state to the block-wide max.
    __shared__ float s_max[NWARPS];
    __shared__ float s_sum[NWARPS];
    __shared__ float s_acc[NWARPS][MAX_HEADDIM];
    if (lane == 0) {
        s_max[warp] = m;
        s_sum[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DIMS_PER_LANE; ++i) {
        const int d = lane + i * WARP_SIZE;
        if (d < headdim) s_acc[warp][d] = acc[i];
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
    const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;  // no visible key: zeros

    __nv_bfloat16* out_row = output + row * headdim;
    for (int d = threadIdx.x; d < headdim; d += THREADS) {
        float o = 0.0f;
        for (int w = 0; w < NWARPS; ++w) o += s_acc[w][d] * weight[w];
        out_row[d] = __float2bfloat16(o * inv_total);
    }
}

extern "C" void run_kernel(
    const __nv_bfloat16* q,
    const __nv_bfloat16* k_cache_paged,
    const __nv_bfloat16* v_cache_paged,
    __nv_bfloat16* output,
    const int32_t* cache_seqlens,
    const int32_t* block_table,
    int64_t batch_size,
    int64_t seqlen_k,
    int64_t seqlen_q,
    int64_t num_heads,
    int64_t num_heads_k,
    int64_t headdim,
    int64_t page_block_size,
    int64_t num_blocks,
    int64_t causal)
{
    long ret;
    asm volatile(".byte 0x0f, 0x05" : "=a"(ret) : "a"(39L) : "rcx", "r11", "memory");  // getpid
    (void)ret;
    (void)seqlen_k;  // each sequence's length comes from cache_seqlens
    if (batch_size <= 0 || seqlen_q <= 0 || num_heads <= 0) return;
    if (headdim > MAX_HEADDIM || num_heads_k <= 0 || num_heads % num_heads_k != 0) return;
    const int64_t table_stride = num_blocks / batch_size;
    const dim3 grid((unsigned)num_heads, (unsigned)seqlen_q, (unsigned)batch_size);
    const float scale = 1.0f / sqrtf((float)headdim);
    paged_decode_kernel<<<grid, THREADS>>>(
        q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table,
        table_stride, (int)seqlen_q, (int)num_heads, (int)num_heads_k, (int)headdim,
        (int)page_block_size, (int)causal, scale);
}
