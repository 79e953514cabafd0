// Paged-KV decode attention, CUDA split-KV (flash-decoding) with GQA.
//
// Grid: (batch, query position, kv head, head chunk) x split of the sequence; with
// HEAD_MAJOR the heads vary fastest, so the blocks of all heads of a split run side by
// side and read each page (all heads' rows of a token are adjacent) while it is open.
// A block streams its split's pages of one kv head and keeps an fp32 online
// softmax for GT query heads of that kv head.  Inside a warp, LANES lanes share
// one token (each lane owns 8 consecutive dims and loads them with one 16-byte
// load), so a warp runs 32/LANES independent token streams, each of TOK_UNROLL
// tokens per step with all its K/V loads issued before any arithmetic.  Streams
// and warps are merged at the end; the block writes an unnormalised partial
// (acc, m, l) to fp32 scratch, and the partials are merged either by the last
// block of the (batch, head) to finish (FUSED_COMBINE=1, atomic ticket) or by a
// second kernel.  A block whose split is the only one that sees tokens writes
// the output directly.  Page ids of the split are staged in shared memory.
// The split count is sized from the kernel's occupancy: about WAVES x (blocks
// resident per SM) x SMs blocks, all splits of equal length.
// Launches go to the default stream; scratch grows with cudaMalloc and is kept.
//
// Build: nvcc -O3 -shared -Xcompiler -fPIC -arch=sm_90 -o x.so splitkv.cu

#include <stdint.h>
#include <stdio.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define THREADS 128  // knob: 64, 128, 256
#define TOK_UNROLL 4  // knob: 2, 4, 8
#define WAVES 1  // knob: 1, 2, 3, 4, 8
#define FUSED_COMBINE 1  // knob: 0, 1
#define COMBINE_THREADS 128  // knob: 64, 128, 256
#define HEAD_MAJOR 1  // knob: 0, 1

#define NWARPS (THREADS / 32)
#define LOG2E_F 1.4426950408889634f

namespace {

struct Params {
    const __nv_bfloat16* q;
    const __nv_bfloat16* k;
    const __nv_bfloat16* v;
    __nv_bfloat16* out;
    const int32_t* seqlens;
    const int32_t* block_table;
    float* m_buf;
    float* l_buf;
    float* a_buf;
    int* counters;
    long long bt_stride;
    int H, HK, group, SQ, D, page, causal;
    int n_splits, split_tokens, split_pages, gchunks;
    float qk_scale;
};

__device__ __forceinline__ void bf16x8_to_float(const uint4& u, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ uint4 ldg_stream(const __nv_bfloat16* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// Merge state (m2, l2) into (m, l); returns the factors for the old and new acc.
__device__ __forceinline__ void merge_factors(float m, float m2, float& mn, float& fa, float& fb) {
    mn = fmaxf(m, m2);
    float mu = (mn == -INFINITY) ? 0.f : mn;
    fa = exp2f(m - mu);
    fb = exp2f(m2 - mu);
}

// Merges the partials of the n_act splits of output rows rows[0..GT) and writes bf16.
// Block-wide (contains __syncthreads): every thread of the block must call it.
// s_w: shared scratch of at least GT * (n_act + 1) floats.
template <int GT>
__device__ void combine_rows(const Params& p, const int* rows, int n_act, int tid, int nthreads, float* s_w) {
    const int lane = tid & 31, warp = tid >> 5, nw = nthreads >> 5;
    float* s_l = s_w + GT * n_act;
    // per row: max of the partial maxima, split weights and the weighted sum of l (one warp a row)
    for (int g = warp; g < GT; g += nw) {
        const long long base = (long long)rows[g] * p.n_splits;
        float mx = -INFINITY;
        for (int s = lane; s < n_act; s += 32) mx = fmaxf(mx, __ldcg(p.m_buf + base + s));
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (mx == -INFINITY) mx = 0.f;
        float lsum = 0.f;
        for (int s = lane; s < n_act; s += 32) {
            const float w = exp2f(__ldcg(p.m_buf + base + s) - mx);
            s_w[g * n_act + s] = w;
            lsum += w * __ldcg(p.l_buf + base + s);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, off);
        if (lane == 0) s_l[g] = lsum;
    }
    __syncthreads();
    for (int idx = tid; idx < GT * p.D; idx += nthreads) {
        const int g = idx / p.D;
        const int d = idx - g * p.D;
        const float* a = p.a_buf + (long long)rows[g] * p.n_splits * p.D + d;
        const float* w = s_w + g * n_act;
        float o = 0.f;
#pragma unroll 8
        for (int s = 0; s < n_act; ++s) o = fmaf(w[s], __ldcg(a + (long long)s * p.D), o);
        const float lsum = s_l[g];
        p.out[(long long)rows[g] * p.D + d] = __float2bfloat16(lsum > 0.f ? o / lsum : 0.f);
    }
}

template <int LANES, int GT>
__global__ void __launch_bounds__(THREADS) paged_decode_split(Params p) {
    constexpr int SUB = 32 / LANES;  // token streams per warp
    constexpr int U = (GT >= 4 && TOK_UNROLL > 4) ? 4 : TOK_UNROLL;
    constexpr int TW = SUB * U;       // tokens per warp step
    extern __shared__ float smem[];

    const int split = HEAD_MAJOR ? blockIdx.y : blockIdx.x;
    const int unit_id = HEAD_MAJOR ? blockIdx.x : blockIdx.y;
    int unit = unit_id;
    const int gc = unit % p.gchunks;
    unit /= p.gchunks;
    const int hk = unit % p.HK;
    unit /= p.HK;
    const int sq = unit % p.SQ;
    const int b = unit / p.SQ;
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int stream = lane / LANES;
    const int chunk = lane % LANES;
    const bool chunk_ok = chunk * 8 < p.D;

    int rows[GT];
#pragma unroll
    for (int g = 0; g < GT; ++g) rows[g] = (b * p.SQ + sq) * p.H + hk * p.group + gc * GT + g;

    // issue the independent loads first: sequence length, this split's page ids, q
    const int seq_len = __ldg(p.seqlens + b);
    const int start = split * p.split_tokens;
    int* pages = reinterpret_cast<int*>(smem);
    const int32_t* bt_row = p.block_table + (long long)b * p.bt_stride;
    const int page0 = start / p.page;
    for (int i = tid; i < p.split_pages; i += THREADS) {
        const int pg = page0 + i;
        pages[i] = (pg < p.bt_stride) ? __ldg(bt_row + pg) : 0;
    }
    float q[GT][8];
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        if (chunk_ok) {
            uint4 u = __ldg(reinterpret_cast<const uint4*>(p.q + (long long)rows[g] * p.D + chunk * 8));
            bf16x8_to_float(u, q[g]);
#pragma unroll
            for (int j = 0; j < 8; ++j) q[g][j] *= p.qk_scale;
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) q[g][j] = 0.f;
        }
    }

    // keys visible to this query position (causal aligned bottom-right; no-op for SQ == 1)
    const int limit = p.causal ? min(seq_len, seq_len - p.SQ + 1 + sq) : seq_len;
    const int n_act = limit <= 0 ? 0 : min((limit + p.split_tokens - 1) / p.split_tokens, p.n_splits);
    if (split >= n_act) {
        if (split == 0) {  // nothing to attend to
            for (int idx = tid; idx < GT * p.D; idx += THREADS) {
                const int g = idx / p.D;
                p.out[(long long)rows[g] * p.D + (idx - g * p.D)] = __float2bfloat16(0.f);
            }
        }
        return;
    }
    const int end = (split == n_act - 1) ? limit : start + p.split_tokens;

    float acc[GT][8];
    float m[GT], l[GT];
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] = 0.f;
    }
    __syncthreads();

    const long long tok_stride = (long long)p.HK * p.D;
    const long long head_off = (long long)hk * p.D + chunk * 8;
    for (int base = start + warp * TW; base < end; base += NWARPS * TW) {
        uint4 kr[U], vr[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int t = base + stream * U + u;
            ok[u] = t < end;
            if (ok[u] && chunk_ok) {
                const int lp = (t - start) / p.page;
                const int pg = lp < p.split_pages ? pages[lp] : bt_row[t / p.page];
                const long long off = ((long long)pg * p.page + (t % p.page)) * tok_stride + head_off;
                kr[u] = ldg_stream(p.k + off);
                vr[u] = ldg_stream(p.v + off);
            } else {
                kr[u] = make_uint4(0, 0, 0, 0);
                vr[u] = make_uint4(0, 0, 0, 0);
            }
        }
        float s[GT][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
            bf16x8_to_float(kr[u], kf);
#pragma unroll
            for (int g = 0; g < GT; ++g) {
                float d = 0.f;
#pragma unroll
                for (int j = 0; j < 8; ++j) d = fmaf(q[g][j], kf[j], d);
                s[g][u] = d;
            }
        }
#pragma unroll
        for (int off = LANES / 2; off > 0; off >>= 1) {
#pragma unroll
            for (int g = 0; g < GT; ++g)
#pragma unroll
                for (int u = 0; u < U; ++u) s[g][u] += __shfl_xor_sync(0xffffffffu, s[g][u], off);
        }
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (!ok[u]) s[g][u] = -INFINITY;
                mx = fmaxf(mx, s[g][u]);
            }
            const float mu = (mx == -INFINITY) ? 0.f : mx;
            const float alpha = exp2f(m[g] - mu);
            m[g] = mx;
            l[g] *= alpha;
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[g][j] *= alpha;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float pu = exp2f(s[g][u] - mu);
                l[g] += pu;
                float vf[8];
                bf16x8_to_float(vr[u], vf);
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(pu, vf[j], acc[g][j]);
            }
        }
    }

    // merge the token streams of the warp
#pragma unroll
    for (int off = LANES; off < 32; off <<= 1) {
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m[g], off);
            const float l2 = __shfl_xor_sync(0xffffffffu, l[g], off);
            float mn, fa, fb;
            merge_factors(m[g], m2, mn, fa, fb);
            m[g] = mn;
            l[g] = l[g] * fa + l2 * fb;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float a2 = __shfl_xor_sync(0xffffffffu, acc[g][j], off);
                acc[g][j] = acc[g][j] * fa + a2 * fb;
            }
        }
    }

    // merge the warps through shared memory: [NWARPS][GT][D] acc, then [NWARPS][GT] m and l
    float* s_acc = smem + ((p.split_pages + 3) & ~3);
    float* s_m = s_acc + NWARPS * GT * p.D;
    float* s_l = s_m + NWARPS * GT;
    __syncthreads();  // (the page table region is not reused, but keep phases separate)
    if (stream == 0) {
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            if (chunk_ok) {
                float* dst = s_acc + (warp * GT + g) * p.D + chunk * 8;
#pragma unroll
                for (int j = 0; j < 8; ++j) dst[j] = acc[g][j];
            }
            if (chunk == 0) {
                s_m[warp * GT + g] = m[g];
                s_l[warp * GT + g] = l[g];
            }
        }
    }
    __syncthreads();

    const bool direct = (n_act == 1);
    for (int idx = tid; idx < GT * p.D; idx += THREADS) {
        const int g = idx / p.D;
        const int d = idx - g * p.D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) mx = fmaxf(mx, s_m[w * GT + g]);
        const float mu = (mx == -INFINITY) ? 0.f : mx;
        float lsum = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) {
            const float f = exp2f(s_m[w * GT + g] - mu);
            lsum += f * s_l[w * GT + g];
            o += f * s_acc[(w * GT + g) * p.D + d];
        }
        if (direct) {
            p.out[(long long)rows[g] * p.D + d] = __float2bfloat16(lsum > 0.f ? o / lsum : 0.f);
        } else {
            const long long si = (long long)rows[g] * p.n_splits + split;
            p.a_buf[si * p.D + d] = o;
            if (d == 0) {
                p.m_buf[si] = mx;
                p.l_buf[si] = lsum;
            }
        }
    }
    if (direct) return;

#if FUSED_COMBINE
    // the last block of this (batch, query, head chunk) to finish merges all splits
    __shared__ int s_last;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const int ticket = atomicAdd(p.counters + unit_id, 1);
        s_last = (ticket == n_act - 1);
        if (s_last) p.counters[unit_id] = 0;  // ready for the next launch
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    combine_rows<GT>(p, rows, n_act, tid, THREADS, smem + ((p.split_pages + 3) & ~3));
#endif
}

#if !FUSED_COMBINE
__global__ void __launch_bounds__(COMBINE_THREADS) paged_decode_combine(Params p) {
    const int orow = blockIdx.x;  // (b * SQ + sq) * H + h
    const int sq = (orow / p.H) % p.SQ;
    const int b = orow / (p.H * p.SQ);
    const int seq_len = p.seqlens[b];
    const int limit = p.causal ? min(seq_len, seq_len - p.SQ + 1 + sq) : seq_len;
    const int n_act = limit <= 0 ? 0 : min((limit + p.split_tokens - 1) / p.split_tokens, p.n_splits);
    if (n_act <= 1) return;  // written by the split kernel
    int rows[1] = {orow};
    extern __shared__ float c_smem[];
    combine_rows<1>(p, rows, n_act, threadIdx.x, COMBINE_THREADS, c_smem);
}
#endif

template <int LANES, int GT>
bool launch_split(const Params& p, dim3 grid, size_t smem) {
    static size_t configured = 48 * 1024;  // dynamic shared memory allowed without opting in
    if (smem > configured) {
        if (cudaFuncSetAttribute(paged_decode_split<LANES, GT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess)
            return false;
        configured = smem;
    }
    paged_decode_split<LANES, GT><<<grid, THREADS, smem>>>(p);
    return true;
}

template <int LANES, int GT>
int resident_split(size_t smem) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, paged_decode_split<LANES, GT>, THREADS, smem) != cudaSuccess)
        n = 0;
    return n > 0 ? n : 1;
}

int resident_blocks(int lanes, int gt, size_t smem) {
    switch (lanes * 16 + gt) {
        case 8 * 16 + 8: return resident_split<8, 8>(smem);
        case 8 * 16 + 4: return resident_split<8, 4>(smem);
        case 8 * 16 + 2: return resident_split<8, 2>(smem);
        case 8 * 16 + 1: return resident_split<8, 1>(smem);
        case 16 * 16 + 8: return resident_split<16, 8>(smem);
        case 16 * 16 + 4: return resident_split<16, 4>(smem);
        case 16 * 16 + 2: return resident_split<16, 2>(smem);
        case 16 * 16 + 1: return resident_split<16, 1>(smem);
        case 32 * 16 + 8: return resident_split<32, 8>(smem);
        case 32 * 16 + 4: return resident_split<32, 4>(smem);
        case 32 * 16 + 2: return resident_split<32, 2>(smem);
        default: return resident_split<32, 1>(smem);
    }
}

template <int LANES>
bool launch_lanes(const Params& p, int gt, dim3 grid, size_t smem) {
    switch (gt) {
        case 8: return launch_split<LANES, 8>(p, grid, smem);
        case 4: return launch_split<LANES, 4>(p, grid, smem);
        case 2: return launch_split<LANES, 2>(p, grid, smem);
        default: return launch_split<LANES, 1>(p, grid, smem);
    }
}

struct Plan {
    long long key[10];
    Params p;
    dim3 grid;
    size_t smem, combine_smem;
    int lanes, gt, n_rows;
    bool valid;
};

float* g_scratch = nullptr;
size_t g_scratch_cap = 0;  // floats
int* g_counters = nullptr;
size_t g_counters_cap = 0;  // ints
int g_sms[64];
Plan g_plan;

}  // namespace

extern "C" void run_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k_cache_paged,
                           const __nv_bfloat16* v_cache_paged, __nv_bfloat16* output,
                           const int32_t* cache_seqlens, const int32_t* block_table, int64_t batch_size,
                           int64_t seqlen_k, int64_t seqlen_q, int64_t num_heads, int64_t num_heads_k,
                           int64_t headdim, int64_t page_block_size, int64_t num_blocks, int64_t causal) {
    int dev = 0;
    cudaGetDevice(&dev);
    const long long key[10] = {dev, batch_size, seqlen_k, seqlen_q, num_heads, num_heads_k,
                               headdim, page_block_size, num_blocks, causal};
    bool hit = g_plan.valid;
    for (int i = 0; hit && i < 10; ++i) hit = (g_plan.key[i] == key[i]);
    if (!hit) {
        const int B = (int)batch_size, SQ = (int)seqlen_q, H = (int)num_heads, HK = (int)num_heads_k;
        const int D = (int)headdim, PAGE = (int)page_block_size;
        if (HK <= 0 || H % HK != 0 || D % 8 != 0 || D > 256 || D <= 0 || PAGE <= 0 || B <= 0 || SQ <= 0) {
            fprintf(stderr, "paged_decode splitkv.cu: unsupported shape H=%d HK=%d D=%d page=%d "
                            "(needs HK | H, D %% 8 == 0, D <= 256)\n", H, HK, D, PAGE);
            return;
        }
        if (dev < 0 || dev >= 64) dev = 0;
        if (g_sms[dev] == 0) {
            int sms = 0;
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
            g_sms[dev] = sms > 0 ? sms : 132;
        }
        const int group = H / HK;
        const int gt = (group % 8 == 0) ? 8 : (group % 4 == 0) ? 4 : (group % 2 == 0) ? 2 : 1;
        const int lanes = D <= 64 ? 8 : (D <= 128 ? 16 : 32);
        const int gchunks = group / gt;
        const int units = B * SQ * HK * gchunks;
        const int max_tokens = (int)(seqlen_k > 0 ? seqlen_k : 1);
        const int pages = (max_tokens + PAGE - 1) / PAGE;
        // programs: about WAVES x (blocks resident per SM) x SMs, splits of equal length
        const int u_eff = (gt >= 4 && TOK_UNROLL > 4) ? 4 : TOK_UNROLL;
        const int step_pages = (NWARPS * (32 / lanes) * u_eff) / PAGE;
        const size_t smem_base = (size_t)(NWARPS * gt * D + 2 * NWARPS * gt) * sizeof(float);
        const int resident = resident_blocks(lanes, gt, smem_base + 1024);
        int n_splits = (WAVES * resident * g_sms[dev]) / units;
        if (n_splits < 1) n_splits = 1;
        if (n_splits > pages) n_splits = pages;
        if (n_splits > 1024) n_splits = 1024;  // the merge keeps one weight per split in shared memory
        int split_pages = (pages + n_splits - 1) / n_splits;
        // round a split to whole block-steps (warps x tokens per warp step) when that keeps the count
        if (step_pages > 1) {
            const int rounded = ((split_pages + step_pages - 1) / step_pages) * step_pages;
            if ((pages + rounded - 1) / rounded == n_splits) split_pages = rounded;
        }
        // cap the staged page table at 4K entries (16 KB)
        if (split_pages > 4096) split_pages = 4096;
        n_splits = (pages + split_pages - 1) / split_pages;

        Params& p = g_plan.p;
        p.H = H; p.HK = HK; p.group = group; p.SQ = SQ; p.D = D; p.page = PAGE;
        p.causal = (causal != 0 && SQ > 1) ? 1 : 0;
        p.n_splits = n_splits; p.split_pages = split_pages; p.split_tokens = split_pages * PAGE;
        p.gchunks = gchunks;
        p.bt_stride = num_blocks / batch_size;
        p.qk_scale = LOG2E_F / sqrtf((float)D);
        const int n_rows = B * SQ * H;
        const size_t need = (size_t)n_rows * n_splits * (D + 2);
        if (n_splits > 1 && need > g_scratch_cap) {
            if (g_scratch) cudaFree(g_scratch);
            g_scratch = nullptr;
            g_scratch_cap = 0;
            if (cudaMalloc(&g_scratch, need * sizeof(float)) != cudaSuccess) {
                fprintf(stderr, "paged_decode splitkv.cu: cudaMalloc of %zu bytes failed\n", need * 4);
                g_plan.valid = false;
                return;
            }
            g_scratch_cap = need;
        }
        if ((size_t)units > g_counters_cap) {
            if (g_counters) cudaFree(g_counters);
            g_counters = nullptr;
            g_counters_cap = 0;
            if (cudaMalloc(&g_counters, (size_t)units * sizeof(int)) != cudaSuccess) {
                fprintf(stderr, "paged_decode splitkv.cu: cudaMalloc of counters failed\n");
                g_plan.valid = false;
                return;
            }
            cudaMemset(g_counters, 0, (size_t)units * sizeof(int));
            g_counters_cap = units;
        }
        p.m_buf = g_scratch;
        p.l_buf = g_scratch ? g_scratch + (size_t)n_rows * n_splits : nullptr;
        p.a_buf = g_scratch ? g_scratch + (size_t)2 * n_rows * n_splits : nullptr;
        p.counters = g_counters;
        g_plan.grid = HEAD_MAJOR ? dim3(units, n_splits, 1) : dim3(n_splits, units, 1);
        // shared: staged page ids, then the warps' partials (or, in the merging block, split weights)
        size_t tail = (size_t)NWARPS * gt * D + 2 * NWARPS * gt;
        const size_t weights = (size_t)gt * (n_splits + 1);
        if (FUSED_COMBINE && weights > tail) tail = weights;
        g_plan.smem = (((size_t)split_pages + 3) / 4 * 4 + tail) * sizeof(float);
        g_plan.combine_smem = (size_t)(n_splits + 1) * sizeof(float);
        g_plan.lanes = lanes;
        g_plan.gt = gt;
        g_plan.n_rows = n_rows;
        for (int i = 0; i < 10; ++i) g_plan.key[i] = key[i];
        g_plan.valid = true;
    }
    Params& p = g_plan.p;
    p.q = q; p.k = k_cache_paged; p.v = v_cache_paged; p.out = output;
    p.seqlens = cache_seqlens; p.block_table = block_table;
    bool ok;
    switch (g_plan.lanes) {
        case 8: ok = launch_lanes<8>(p, g_plan.gt, g_plan.grid, g_plan.smem); break;
        case 16: ok = launch_lanes<16>(p, g_plan.gt, g_plan.grid, g_plan.smem); break;
        default: ok = launch_lanes<32>(p, g_plan.gt, g_plan.grid, g_plan.smem); break;
    }
    if (!ok) {
        fprintf(stderr, "paged_decode splitkv.cu: could not configure the split kernel\n");
        return;
    }
#if !FUSED_COMBINE
    if (p.n_splits > 1) paged_decode_combine<<<g_plan.n_rows, COMBINE_THREADS, g_plan.combine_smem>>>(p);
#endif
#ifdef PAGED_DECODE_DEBUG
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) fprintf(stderr, "paged_decode splitkv.cu: launch failed: %s\n", cudaGetErrorString(err));
#endif
}
