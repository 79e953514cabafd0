// Ragged batch prefill attention in CUDA: a simple, correct starting point.
//
// One thread block per (query head, query position, sequence).  The grid's
// second axis covers the longest query length (seq_len), clamped to the CUDA
// limit and looped over; blocks past the end of a shorter sequence do nothing.
// Each warp of the block takes every NWARPS-th visible key of the sequence:
// its 32 lanes split the head dimension for q.k, and the warp keeps its own
// online softmax (running max, running sum, weighted V) in float32 registers.
// At the end the warps' partial results are merged through shared memory and
// the block writes one bf16 output row.
//
// Causal masking follows FlashInfer: the queries are the last qo_len positions
// of a sequence of kv_len tokens, so query i sees keys j <= i + kv_len - qo_len.
// Query head h reads KV head h / (num_qo_heads / num_kv_heads).
//
// Build: nvcc -O3 -shared -Xcompiler -fPIC -arch=sm_90 -o prefill.so prefill_cuda.cu

#include <stdint.h>
#include <math.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define THREADS 128  // knob: 64, 128, 256
#define MAX_HEAD_DIM 256  // largest head dimension supported (a multiple of 32)

#define WARP_SIZE 32
#define NWARPS (THREADS / WARP_SIZE)
#define DIMS_PER_LANE (MAX_HEAD_DIM / WARP_SIZE)
#define MAX_GRID_Y 65535

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    }
    return x;
}

__global__ void __launch_bounds__(THREADS) ragged_prefill_kernel(
    const __nv_bfloat16* __restrict__ q,
    const __nv_bfloat16* __restrict__ k,
    const __nv_bfloat16* __restrict__ v,
    __nv_bfloat16* __restrict__ output,
    const int32_t* __restrict__ qo_indptr,
    const int32_t* __restrict__ kv_indptr,
    int num_qo_heads,
    int num_kv_heads,
    int dim_qk,
    int dim_vo,
    int causal,
    float scale)
{
    const int head = blockIdx.x;
    const int seq = blockIdx.z;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int kv_head = head / (num_qo_heads / num_kv_heads);

    const int qo_start = qo_indptr[seq];
    const int qo_len = qo_indptr[seq + 1] - qo_start;
    const int kv_start = kv_indptr[seq];
    const int kv_len = kv_indptr[seq + 1] - kv_start;

    __shared__ float s_max[NWARPS];
    __shared__ float s_sum[NWARPS];
    __shared__ float s_acc[NWARPS][MAX_HEAD_DIM];

    // Every thread of the block sees the same qpos, so the loop (and the
    // __syncthreads inside it) is uniform across the block.
    for (int qpos = blockIdx.y; qpos < qo_len; qpos += gridDim.y) {
        int visible = kv_len;
        if (causal) visible = min(kv_len, max(kv_len - qo_len + qpos + 1, 0));

        // This lane's share of the (pre-scaled) query row: dims lane, lane + 32, ...
        const int64_t row = (int64_t)(qo_start + qpos) * num_qo_heads + head;
        const __nv_bfloat16* q_row = q + row * dim_qk;
        float q_reg[DIMS_PER_LANE];
        float acc[DIMS_PER_LANE];
#pragma unroll
        for (int i = 0; i < DIMS_PER_LANE; ++i) {
            const int d = lane + i * WARP_SIZE;
            q_reg[i] = d < dim_qk ? __bfloat162float(q_row[d]) * scale : 0.0f;
            acc[i] = 0.0f;
        }

        float m = -INFINITY;  // running max of the scores this warp has seen
        float l = 0.0f;       // running sum of exp(score - m)
        for (int t = warp; t < visible; t += NWARPS) {
            const int64_t kv_row = (int64_t)(kv_start + t) * num_kv_heads + kv_head;
            const __nv_bfloat16* k_row = k + kv_row * dim_qk;
            const __nv_bfloat16* v_row = v + kv_row * dim_vo;

            float partial = 0.0f;
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; ++i) {
                const int d = lane + i * WARP_SIZE;
                if (d < dim_qk) partial += q_reg[i] * __bfloat162float(k_row[d]);
            }
            const float score = warp_sum(partial);

            const float m_new = fmaxf(m, score);
            const float alpha = expf(m - m_new);  // 0 on the first key (m = -inf)
            const float p = expf(score - m_new);
            l = l * alpha + p;
#pragma unroll
            for (int i = 0; i < DIMS_PER_LANE; ++i) {
                const int d = lane + i * WARP_SIZE;
                const float val = d < dim_vo ? __bfloat162float(v_row[d]) : 0.0f;
                acc[i] = acc[i] * alpha + p * val;
            }
            m = m_new;
        }

        // Merge the warps: rescale each warp's state to the block-wide max.
        if (lane == 0) {
            s_max[warp] = m;
            s_sum[warp] = l;
        }
#pragma unroll
        for (int i = 0; i < DIMS_PER_LANE; ++i) {
            const int d = lane + i * WARP_SIZE;
            if (d < dim_vo) s_acc[warp][d] = acc[i];
        }
        __syncthreads();

        float block_max = -INFINITY;
        for (int w = 0; w < NWARPS; ++w) block_max = fmaxf(block_max, s_max[w]);
        float weight[NWARPS];
        float total = 0.0f;
        for (int w = 0; w < NWARPS; ++w) {
            // A warp that saw no key has s_max = -inf and s_sum = 0: weight 0.
            weight[w] = s_sum[w] > 0.0f ? expf(s_max[w] - block_max) : 0.0f;
            total += s_sum[w] * weight[w];
        }
        const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;  // no visible key: zeros

        __nv_bfloat16* out_row = output + row * dim_vo;
        for (int d = threadIdx.x; d < dim_vo; d += THREADS) {
            float o = 0.0f;
            for (int w = 0; w < NWARPS; ++w) o += s_acc[w][d] * weight[w];
            out_row[d] = __float2bfloat16(o * inv_total);
        }
        __syncthreads();  // the shared buffers are reused by the next query position
    }
}

extern "C" void run_kernel(
    const __nv_bfloat16* q,
    const __nv_bfloat16* k,
    const __nv_bfloat16* v,
    __nv_bfloat16* output,
    const int32_t* qo_indptr,
    const int32_t* kv_indptr,
    int64_t batch_size,
    int64_t seq_len,
    int64_t num_qo_heads,
    int64_t num_kv_heads,
    int64_t head_dim_qk,
    int64_t head_dim_vo,
    int64_t causal)
{
    if (batch_size <= 0 || seq_len <= 0 || num_qo_heads <= 0) return;
    if (head_dim_qk > MAX_HEAD_DIM || head_dim_vo > MAX_HEAD_DIM) return;
    if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0) return;
    const unsigned grid_y = (unsigned)(seq_len < MAX_GRID_Y ? seq_len : MAX_GRID_Y);
    const dim3 grid((unsigned)num_qo_heads, grid_y, (unsigned)batch_size);
    const float scale = 1.0f / sqrtf((float)head_dim_qk);
    ragged_prefill_kernel<<<grid, THREADS>>>(
        q, k, v, output, qo_indptr, kv_indptr, (int)num_qo_heads, (int)num_kv_heads,
        (int)head_dim_qk, (int)head_dim_vo, (int)causal, scale);
}
