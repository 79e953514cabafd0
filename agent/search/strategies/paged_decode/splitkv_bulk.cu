// Paged-KV decode attention, CUDA split-KV; for long splits the K/V tiles are streamed
// into shared memory by the Hopper bulk-copy engine (cp.async.bulk, mbarrier completion).
//
// Why: a decode step reads every cached byte once and does almost no arithmetic per
// byte, so its speed is how many bytes are in flight. Loads into registers hold
// registers until they land, which caps the bytes per SM; bulk copies into a ring of
// STAGES shared-memory tiles keep STAGES tiles in flight per block without a register
// (DEEP_STAGES where a grid of few units and splits would leave blocks idle).
// Short or small problems are latency-bound instead, and there lanes load directly.
//
// Grid: (batch, query position, chunk of HC kv heads, chunk of GT query heads per kv
// head) x split of the sequence, the head chunks fastest so that blocks reading the same
// pages run side by side. Bulk path: a block takes HC kv heads of a token at once (whole
// cache rows when HC == HK: all heads of a token are adjacent); a tile is T tokens; warp
// 0 issues the bulk copies (one per page and tensor with whole rows, else one per token
// and tensor of HC*D*2 bytes) and refills a stage once
// every warp is done with it. Register path: HC = 1 and each lane loads its 16 bytes of
// a token straight from the cache. In both, LANES lanes share a token and own 8 dims;
// a stream of lanes serves one kv head (its GT query heads, fp32 online softmax in exp2)
// and takes every NS/HC-th token. Streams of a head are merged through shared memory;
// one split writes the output, several write fp32 partials that the last block of the
// unit to finish merges (atomic ticket; each output is summed over the splits by several
// threads at once), so a call is one launch. The split count fills the GPU: about WAVES x
// (blocks resident per SM) x SMs blocks, splits of at least MIN_SPLIT tokens, at most
// MAX_SPLITS of them.
//
// Build: nvcc -O3 -shared -Xcompiler -fPIC -arch=sm_90a -o x.so splitkv_bulk.cu

#include <stdint.h>
#include <stdio.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "splitkv_bulk.cu needs sm_90 or newer (cp.async.bulk and mbarrier transaction counts)"
#endif

#define THREADS 256  // knob: 128, 256, 512
#define STAGES 3  // knob: 2, 3, 4, 6
// The deep ring: a bulk path whose grid of few units and splits would leave resident
// blocks idle takes wider blocks (one per SM, more warps to consume) with a deeper ring
// of larger stages instead, so that fewer blocks keep as many bytes in flight and are
// consumed as fast (DEEP_STAGES 0: such shapes take the register path).
#define DEEP_STAGES 2  // knob: 0, 2, 3
#define DEEP_STAGE_KB 64  // knob: 32, 64
#define DEEP_THREADS 512  // knob: 256, 512
#define STAGE_KB 32  // knob: 8, 16, 32, 64
#define TOK_UNROLL 4  // knob: 1, 2, 4
#define WAVES 1  // knob: 1, 2, 4
#define MIN_SPLIT 64  // knob: 16, 32, 64, 128, 256
#define MAX_SPLITS 32  // knob: 8, 16, 32, 64, 128
#define MAX_HEADS 8  // knob: 1, 2, 4, 8, 16
#define BULK_MIN_BYTES 2048  // knob: 512, 1024, 2048, 4096, 8192
#define BULK_MIN_SPLIT 512  // knob: 128, 256, 512, 1024, 2048
#define BULK_MIN_FILL 50  // knob: 25, 50, 75, 100
#define PAGE_COPY 1  // knob: 0, 1

#define RING_MAX (STAGES > DEEP_STAGES ? STAGES : DEEP_STAGES)
#define STAGED_SPLITS 32  // the most splits the staged merge takes (its weights: a row of this many)
#define LOG2E_F 1.4426950408889634f

namespace {

struct Params {
    const __nv_bfloat16* q;
    const __nv_bfloat16* k;
    const __nv_bfloat16* v;
    __nv_bfloat16* out;
    const int32_t* seqlens;
    const int32_t* block_table;
    float* a_buf;  // [row][split][D] unnormalised partial outputs
    float* m_buf;  // [row][split] running maxima (log2 domain)
    float* l_buf;  // [row][split] softmax denominators
    int* counters;  // one ticket counter per block unit
    long long bt_stride;
    int H, HK, group, SQ, D, page, causal;
    int HC, hchunks, gchunks, T;
    int n_splits, split_tokens, split_pages, stages;
    int pages_off, stage_off, stage_bytes;  // shared-memory layout, bytes
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

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void bar_expect(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}

// Output row of local row r (kv head r / GT of the chunk, query head r % GT of its group chunk).
// Local row r's output row past the block's first (its row 0's).
__device__ __forceinline__ int row_offset(const Params& p, int r, int GT) { return (r / GT) * p.group + r % GT; }

__device__ __forceinline__ int out_row(const Params& p, int b, int sq, int hc0, int gc, int r, int GT) {
    return (b * p.SQ + sq) * p.H + hc0 * p.group + gc * GT + row_offset(p, r, GT);
}

// Warp 0 queues tile `tile` of the block's token range into stage `st`. Page ids come
// from the staged list; a sequence longer than the planned seqlen_k gives its last split
// more pages than were staged: those are read from the block table (clamped to its row,
// as a missing page cannot be read anyway). With whole cache rows (HC == HK) the tokens
// of one page are adjacent in memory and go in one copy per page and tensor (the copy
// engine's cost is per copy); otherwise one copy per token and tensor.
__device__ __forceinline__ void issue_tile(const Params& p, const int* pages, const int32_t* bt_row, int start,
                                           int end, int hc0, int tile, int st, unsigned char* smem,
                                           uint64_t* bars, int lane) {
    const int t0 = start + tile * p.T;
    const int n = min(p.T, end - t0);
    const uint32_t chunk = (uint32_t)p.HC * p.D * 2;
    if (lane == 0) bar_expect(bars + st, 2u * chunk * n);
    __syncwarp();
    unsigned char* kd = smem + p.stage_off + (size_t)st * p.stage_bytes;
    unsigned char* vd = kd + (size_t)p.T * chunk;
    const bool by_page = PAGE_COPY && p.HC == p.HK;
    const int first_page = t0 / p.page;
    const int n_runs = by_page ? (t0 + n - 1) / p.page - first_page + 1 : n;
    for (int r = lane; r < n_runs; r += 32) {
        const int rs = by_page ? max(t0, (first_page + r) * p.page) : t0 + r;
        const int re = by_page ? min(t0 + n, (first_page + r + 1) * p.page) : rs + 1;
        const int lp = (rs - start) / p.page;
        const long long gp = (long long)(start / p.page) + lp;
        const int pg = lp < p.split_pages ? pages[lp] : __ldg(bt_row + (gp < p.bt_stride ? gp : p.bt_stride - 1));
        const long long row = (long long)pg * p.page + (rs % p.page);
        const long long off = (row * p.HK + hc0) * p.D;
        const size_t j = (size_t)(rs - t0) * chunk;
        bulk_copy(kd + j, p.k + off, chunk * (re - rs), bars + st);
        bulk_copy(vd + j, p.v + off, chunk * (re - rs), bars + st);
    }
}

// The last block of a unit merges the n_act partials of its rows and writes bf16.
// Each thread owns 4 dims of a row and takes every groups-th split; it loads a split's
// maximum, denominator and partial together (none waits on another) and merges them
// online, so the merge costs one round trip per CU splits a thread takes, not a pass for
// the maxima, one for the weights and one for the partials. Block-wide (__syncthreads).
// s_w: 16-byte aligned shared memory of combine_bytes(NT).
__host__ __device__ constexpr size_t combine_bytes(int nt) { return (size_t)nt * (16 + 8); }

template <int NT, int CU>
__device__ void combine(const Params& p, const int* rows, int nrows, int n_act, float* s_w) {
    // CU: splits whose loads a thread has in flight at once
    const int tid = threadIdx.x;
    const int d4 = p.D / 4, items = nrows * d4;
    int groups = items >= NT ? 1 : NT / items;
    if (groups > n_act) groups = n_act;
    float4* s_o = reinterpret_cast<float4*>(s_w);
    float* s_mx = s_w + 4 * NT;
    float* s_l = s_mx + NT;
    const int span = groups == 1 ? NT : items;
    for (int base = 0; base < items; base += NT) {
        const int idx = base + tid % span, grp = groups == 1 ? 0 : tid / span;
        const bool mine = idx < items && grp < groups;
        float mx = -INFINITY, l = 0.f;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        const int r = mine ? idx / d4 : 0, c = mine ? idx - r * d4 : 0;
        if (mine) {
            const long long rb = (long long)rows[r] * p.n_splits;
            const float4* a = reinterpret_cast<const float4*>(p.a_buf + rb * p.D) + c;
            for (int s0 = grp; s0 < n_act; s0 += CU * groups) {
                float ms[CU], ls[CU];
                float4 xs[CU];
#pragma unroll
                for (int u = 0; u < CU; ++u) {
                    const int s = s0 + u * groups;
                    ms[u] = -INFINITY;
                    ls[u] = 0.f;
                    xs[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                    if (s < n_act) {
                        ms[u] = __ldcg(p.m_buf + rb + s);
                        ls[u] = __ldcg(p.l_buf + rb + s);
                        xs[u] = __ldcg(a + (long long)s * d4);
                    }
                }
                float nm = mx;
#pragma unroll
                for (int u = 0; u < CU; ++u) nm = fmaxf(nm, ms[u]);
                const float mu = (nm == -INFINITY) ? 0.f : nm;
                const float alpha = exp2f(mx - mu);
                l *= alpha;
                o.x *= alpha; o.y *= alpha; o.z *= alpha; o.w *= alpha;
#pragma unroll
                for (int u = 0; u < CU; ++u) {
                    const float w = exp2f(ms[u] - mu);
                    l = fmaf(w, ls[u], l);
                    o.x = fmaf(w, xs[u].x, o.x);
                    o.y = fmaf(w, xs[u].y, o.y);
                    o.z = fmaf(w, xs[u].z, o.z);
                    o.w = fmaf(w, xs[u].w, o.w);
                }
                mx = nm;
            }
        }
        if (groups > 1) {  // then items < NT: this loop runs once
            s_o[tid] = o;
            s_mx[tid] = mx;
            s_l[tid] = l;
            __syncthreads();
            if (grp == 0 && mine) {
                float nm = mx;
                for (int g = 1; g < groups; ++g) nm = fmaxf(nm, s_mx[g * items + idx]);
                const float mu = (nm == -INFINITY) ? 0.f : nm;
                const float f0 = exp2f(mx - mu);
                l *= f0;
                o.x *= f0; o.y *= f0; o.z *= f0; o.w *= f0;
                for (int g = 1; g < groups; ++g) {
                    const int j = g * items + idx;
                    const float f = exp2f(s_mx[j] - mu);
                    const float4 x = s_o[j];
                    l = fmaf(f, s_l[j], l);
                    o.x = fmaf(f, x.x, o.x); o.y = fmaf(f, x.y, o.y); o.z = fmaf(f, x.z, o.z); o.w = fmaf(f, x.w, o.w);
                }
            }
        }
        if (grp == 0 && mine) {
            const float inv = l > 0.f ? 1.f / l : 0.f;
            __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(p.out + (long long)rows[r] * p.D + 4 * c);
            dst[0] = __floats2bfloat162_rn(o.x * inv, o.y * inv);
            dst[1] = __floats2bfloat162_rn(o.z * inv, o.w * inv);
        }
    }
}

// Folds a softmax state (maximum om, denominator ol; log2 domain) into (mx, l).
__device__ __forceinline__ void merge_state(float& mx, float& l, float om, float ol) {
    const float nm = fmaxf(mx, om), mu = (nm == -INFINITY) ? 0.f : nm;
    l = l * exp2f(mx - mu) + ol * exp2f(om - mu);
    mx = nm;
}

// The staged merge, for a bulk block whose rows are consecutive output rows (all query
// heads of its kv heads): their partials are then one stretch of a_buf, n_splits per row,
// and the copy engine brings each row's n_act of them into the stages, free now, while a
// warp per row loads its splits' maxima and denominators and turns them into weights (in
// `w`: STAGED_SPLITS + 1 floats a row, the last 1 / denominator). Each thread then sums
// two dims of a row over the splits out of shared memory. The per-thread loads of
// combine() ran at about 50 GB/s on one SM of the H200: a 32-split merge of 8 rows (128 KB)
// took 2.5 us. Block-wide; `bar`: an mbarrier of its own, first use (parity 0).
template <int NT>
__device__ void combine_staged(const Params& p, int row0, int nrows, int n_act, unsigned char* stage, float* w,
                               uint64_t* bar) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t row_bytes = (uint32_t)n_act * p.D * 4;
    if (warp == 0) {
        // the partials were written by plain stores of other blocks (ordered before this
        // block by the ticket); the copy engine reads through the async proxy
        asm volatile("fence.proxy.async.global;" ::: "memory");
        if (lane == 0) bar_expect(bar, row_bytes * (uint32_t)nrows);
        __syncwarp();
        for (int r = lane; r < nrows; r += 32)
            bulk_copy(stage + (size_t)r * row_bytes, p.a_buf + (long long)(row0 + r) * p.n_splits * p.D, row_bytes, bar);
    }
    for (int r = warp; r < nrows; r += NT / 32) {
        const long long rb = (long long)(row0 + r) * p.n_splits;
        float* wr = w + r * (STAGED_SPLITS + 1);
        // online per lane over its splits, then across the warp
        float mx = -INFINITY, l = 0.f;
        for (int s = lane; s < n_act; s += 32) {
            const float ms = __ldcg(p.m_buf + rb + s);
            merge_state(mx, l, ms, __ldcg(p.l_buf + rb + s));
            wr[s] = ms;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float om = __shfl_xor_sync(0xffffffffu, mx, off), ol = __shfl_xor_sync(0xffffffffu, l, off);
            merge_state(mx, l, om, ol);
        }
        const float mu = (mx == -INFINITY) ? 0.f : mx;
        for (int s = lane; s < n_act; s += 32) wr[s] = exp2f(wr[s] - mu);
        if (lane == 0) wr[STAGED_SPLITS] = l > 0.f ? 1.f / l : 0.f;
    }
    __syncthreads();
    bar_wait(bar, 0);
    const int c2n = p.D / 2;
    for (int idx = tid; idx < nrows * c2n; idx += NT) {
        const int r = idx / c2n, c = idx - r * c2n;
        const float* wr = w + r * (STAGED_SPLITS + 1);
        const float2* x = reinterpret_cast<const float2*>(stage + (size_t)r * row_bytes) + c;
        float ox = 0.f, oy = 0.f;
#pragma unroll 8
        for (int s = 0; s < n_act; ++s) {
            const float f = wr[s];
            const float2 v = x[(size_t)s * c2n];
            ox = fmaf(f, v.x, ox);
            oy = fmaf(f, v.y, oy);
        }
        const float inv = wr[STAGED_SPLITS];
        reinterpret_cast<__nv_bfloat162*>(p.out + (long long)(row0 + r) * p.D)[c] = __floats2bfloat162_rn(ox * inv, oy * inv);
    }
}

// One step of a token stream: U tokens' K and V chunks (8 dims per lane) into the
// stream's GT online softmaxes. Tokens with ok[u] false count as -inf scores.
template <int LANES, int GT, int U>
__device__ __forceinline__ void consume(const float (&q)[GT][8], float (&acc)[GT][8], float (&m)[GT], float (&l)[GT],
                                        const uint4 (&kr)[U], const uint4 (&vr)[U], const bool (&ok)[U]) {
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
    // lanes of a stream are consecutive, so xor offsets below LANES stay inside it
#pragma unroll
    for (int off = LANES / 2; off > 0; off >>= 1)
#pragma unroll
        for (int g = 0; g < GT; ++g)
#pragma unroll
            for (int u = 0; u < U; ++u) s[g][u] += __shfl_xor_sync(0xffffffffu, s[g][u], off);
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

__device__ __forceinline__ uint4 ldg_stream(const __nv_bfloat16* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// A stream's tokens 0..n-1 of its range, every nsub-th from `sub`, U per step; load(j, k, v)
// fetches token j's chunks. Every thread makes the same number of steps, masking the
// tokens it does not have: consume's shuffles need whole warps, and the streams of a warp
// own different tokens (a loop bounded per stream hangs on ragged lengths).
template <int LANES, int GT, int U, typename Load>
__device__ __forceinline__ void stream_tokens(int n, int sub, int nsub, bool active, bool chunk_ok,
                                              const float (&q)[GT][8], float (&acc)[GT][8], float (&m)[GT],
                                              float (&l)[GT], const Load& load) {
    for (int j0 = 0; j0 < n; j0 += nsub * U) {
        uint4 kr[U], vr[U];
        bool ok[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = j0 + sub + u * nsub;
            ok[u] = active && j < n;
            kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
            if (ok[u] && chunk_ok) load(j, kr[u], vr[u]);
        }
        consume<LANES, GT, U>(q, acc, m, l, kr, vr, ok);
    }
}

// The last block's merge of the splits: staged where the rows are consecutive and their
// partials fit the stages, else each thread loads its share.
template <int NT, int GT, bool BULK>
__device__ __forceinline__ void merge_splits(const Params& p, unsigned char* smem, int row0, int nrows, int n_act) {
    // the page ids are no longer needed: the weights or the row list go there
    float* w = reinterpret_cast<float*>(smem + p.pages_off);
    if (BULK && p.gchunks == 1 && n_act <= STAGED_SPLITS &&
        (size_t)n_act * nrows * p.D * 4 <= (size_t)p.stages * p.stage_bytes) {
        combine_staged<NT>(p, row0, nrows, n_act, smem + p.stage_off, w, reinterpret_cast<uint64_t*>(smem) + RING_MAX);
        return;
    }
    // the rows of a block with several query-head chunks are not consecutive: a list
    int* rows = reinterpret_cast<int*>(w);
    for (int r = threadIdx.x; r < nrows; r += NT) rows[r] = row0 + row_offset(p, r, GT);
    __syncthreads();
    // 16 splits in flight where shared memory, not registers, bounds the blocks per SM (the
    // bulk rings): one round trip for a 32-split merge of a 512-thread block, not two
    combine<NT, BULK ? 16 : 8>(p, rows, nrows, n_act, reinterpret_cast<float*>(smem + p.stage_off));
}

// BULK: K/V tiles arrive in shared memory by bulk copy; else each lane loads its token
// chunks from global memory into registers (better for short splits and small chunks).
template <int LANES, int GT, bool BULK, int NT>
__global__ void __launch_bounds__(NT) paged_decode_bulk(Params p) {
    constexpr int NS = NT / LANES;  // token streams in the block
    constexpr int U = TOK_UNROLL;
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
    int* pages = reinterpret_cast<int*>(smem + p.pages_off);

    const int unit_id = blockIdx.x, split = blockIdx.y;
    int unit = unit_id;
    const int gc = unit % p.gchunks;
    unit /= p.gchunks;
    const int hcc = unit % p.hchunks;
    unit /= p.hchunks;
    const int sq = unit % p.SQ;
    const int b = unit / p.SQ;
    const int hc0 = hcc * p.HC;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int stream = tid / LANES, chunk = tid % LANES;
    const bool chunk_ok = chunk * 8 < p.D;
    const int hl = stream % p.HC;  // this stream's kv head within the chunk
    const int sub = stream / p.HC, nsub = NS / p.HC;
    const bool active = sub < nsub;  // NS need not be a multiple of HC
    const int nrows = p.HC * GT;

    // The queries and this split's page ids do not depend on the sequence's length: their
    // loads go out together with its load, so a block waits one memory round trip before
    // its first cache load, not three.
    const int32_t* bt_row = p.block_table + (long long)b * p.bt_stride;
    const int page0 = split * p.split_pages;
    uint4 q_raw[GT];
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        const int row = out_row(p, b, sq, hc0, gc, hl * GT + g, GT);
        q_raw[g] = make_uint4(0, 0, 0, 0);
        if (chunk_ok && active) q_raw[g] = __ldg(reinterpret_cast<const uint4*>(p.q + (long long)row * p.D + chunk * 8));
    }
    const int seq_len = __ldg(p.seqlens + b);
#pragma unroll 4
    for (int i = tid; i < p.split_pages; i += NT)
        pages[i] = (page0 + i < p.bt_stride) ? __ldg(bt_row + page0 + i) : 0;

    const int limit = p.causal ? min(seq_len, seq_len - p.SQ + 1 + sq) : seq_len;
    const int n_act = limit <= 0 ? 0 : min((limit + p.split_tokens - 1) / p.split_tokens, p.n_splits);
    if (split >= n_act) {
        if (split == 0) {  // nothing to attend to: zeros
            for (int idx = tid; idx < nrows * p.D; idx += NT) {
                const int r = idx / p.D;
                p.out[(long long)out_row(p, b, sq, hc0, gc, r, GT) * p.D + idx % p.D] = __float2bfloat16(0.f);
            }
        }
        return;
    }
    const int start = split * p.split_tokens;
    const int end = (split == n_act - 1) ? limit : start + p.split_tokens;
    const int n_tiles = (end - start + p.T - 1) / p.T;
    if (BULK) {
        if (tid < p.stages) bar_init(bars + tid, 1);
        if (tid == 0) bar_init(bars + RING_MAX, 1);  // the staged merge's
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (BULK && warp == 0)
        for (int t = 0; t < p.stages && t < n_tiles; ++t)
            issue_tile(p, pages, bt_row, start, end, hc0, t, t, smem, bars, lane);

    float q[GT][8];
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        bf16x8_to_float(q_raw[g], q[g]);
#pragma unroll
        for (int j = 0; j < 8; ++j) q[g][j] *= p.qk_scale;
    }
    float acc[GT][8], m[GT], l[GT];
#pragma unroll
    for (int g = 0; g < GT; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] = 0.f;
    }

    if (BULK) {
        const int row_elems = p.HC * p.D;  // one token's chunk in a tile, in bf16 elements
        const int lane_off = hl * p.D + chunk * 8;
        for (int tile = 0, st = 0, phase = 0; tile < n_tiles; ++tile) {
            bar_wait(bars + st, phase);
            const int n = min(p.T, end - start - tile * p.T);
            const __nv_bfloat16* ks =
                reinterpret_cast<const __nv_bfloat16*>(smem + p.stage_off + (size_t)st * p.stage_bytes);
            const __nv_bfloat16* vs = ks + (size_t)p.T * row_elems;
            stream_tokens<LANES, GT, U>(n, sub, nsub, active, chunk_ok, q, acc, m, l, [&](int j, uint4& k, uint4& v) {
                k = *reinterpret_cast<const uint4*>(ks + (size_t)j * row_elems + lane_off);
                v = *reinterpret_cast<const uint4*>(vs + (size_t)j * row_elems + lane_off);
            });
            __syncthreads();  // every warp is done with this stage: refill it
            if (warp == 0 && tile + p.stages < n_tiles)
                issue_tile(p, pages, bt_row, start, end, hc0, tile + p.stages, st, smem, bars, lane);
            if (++st == p.stages) st = 0, phase ^= 1;
        }
    } else {
        const long long head_off = (long long)(hc0 + hl) * p.D + chunk * 8;
        stream_tokens<LANES, GT, U>(end - start, sub, nsub, active, chunk_ok, q, acc, m, l, [&](int j, uint4& k, uint4& v) {
            const int t = start + j, lp = j / p.page;
            const long long gp = (long long)page0 + lp;
            const int pg = lp < p.split_pages ? pages[lp] : __ldg(bt_row + (gp < p.bt_stride ? gp : p.bt_stride - 1));
            const long long off = ((long long)pg * p.page + (t % p.page)) * p.HK * p.D + head_off;
            k = ldg_stream(p.k + off);
            v = ldg_stream(p.v + off);
        });
    }

    // Merge the streams of each kv head through shared memory (the stages are free now):
    // [NS][GT][D] acc, then [NS][GT] m, l and one maximum per row. A warp per row turns its
    // streams' maxima into weights first, so the per-dimension pass is a weighted sum
    // (weights computed per dimension, as before, made this step 1.3-1.8 us on the H200's
    // bulk cases; 0.4-0.5 us now).
    float* s_acc = reinterpret_cast<float*>(smem + p.stage_off);
    float* s_m = s_acc + NS * GT * p.D;
    float* s_l = s_m + NS * GT;
    float* s_x = s_l + NS * GT;
    if (!BULK) __syncthreads();  // (the bulk loop ends on one)
    if (active) {
#pragma unroll
        for (int g = 0; g < GT; ++g) {
            if (chunk_ok) {
                float4* dst = reinterpret_cast<float4*>(s_acc + (stream * GT + g) * p.D + chunk * 8);
                dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
                dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
            }
            if (chunk == 0) {
                s_m[stream * GT + g] = m[g];
                s_l[stream * GT + g] = l[g];
            }
        }
    }
    __syncthreads();
    // a warp per row, its lanes over the row's streams: entries (k * HC + h) * GT + g, k < nsub
    for (int r = warp; r < nrows; r += NT / 32) {
        const int h = r / GT, g = r % GT;
        float mx = -INFINITY;
        for (int k = lane; k < nsub; k += 32) mx = fmaxf(mx, s_m[(k * p.HC + h) * GT + g]);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float mu = (mx == -INFINITY) ? 0.f : mx;
        float lsum = 0.f;
        for (int k = lane; k < nsub; k += 32) {
            const int sidx = (k * p.HC + h) * GT + g;
            const float f = exp2f(s_m[sidx] - mu);
            s_m[sidx] = f;
            lsum += f * s_l[sidx];
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, off);
        if (lane == 0) {  // the row's k = 0 entry of s_l, which only lane 0 read
            s_l[r] = lsum;
            s_x[r] = mx;
        }
    }
    __syncthreads();
    const bool direct = (n_act == 1);
    const int d4 = p.D / 4;
    for (int idx = tid; idx < nrows * d4; idx += NT) {
        const int r = idx / d4, c = idx - r * d4;
        const int h = r / GT, g = r % GT;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int k = 0; k < nsub; ++k) {
            const int sidx = (k * p.HC + h) * GT + g;
            const float f = s_m[sidx];
            const float4 x = reinterpret_cast<const float4*>(s_acc + sidx * p.D)[c];
            o.x = fmaf(f, x.x, o.x); o.y = fmaf(f, x.y, o.y); o.z = fmaf(f, x.z, o.z); o.w = fmaf(f, x.w, o.w);
        }
        const int row = out_row(p, b, sq, hc0, gc, r, GT);
        const float lsum = s_l[r];
        if (direct) {
            const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
            __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(p.out + (long long)row * p.D + 4 * c);
            dst[0] = __floats2bfloat162_rn(o.x * inv, o.y * inv);
            dst[1] = __floats2bfloat162_rn(o.z * inv, o.w * inv);
        } else {
            const long long si = (long long)row * p.n_splits + split;
            reinterpret_cast<float4*>(p.a_buf + si * p.D)[c] = o;
            if (c == 0) {
                p.m_buf[si] = s_x[r];
                p.l_buf[si] = lsum;
            }
        }
    }
    if (direct) return;

    // One thread fences for the block, as a grid barrier does: the barrier orders every
    // thread's partial stores before thread 0's fence and ticket, and the last block's
    // loads after its fence. A fence in every thread cost ~0.4 us each time on the H200
    // (MEMBAR.SC.GPU and an L1 invalidate per warp).
    __shared__ int s_last;
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        const int ticket = atomicAdd(p.counters + unit_id, 1);
        s_last = (ticket == n_act - 1);
        if (s_last) {
            p.counters[unit_id] = 0;  // ready for the next launch
            __threadfence();
        }
    }
    __syncthreads();
    if (!s_last) return;
    merge_splits<NT, GT, BULK>(p, smem, out_row(p, b, sq, hc0, gc, 0, GT), nrows, n_act);
}

template <int LANES, int GT, bool BULK, int NT>
struct Kernel {
    static bool configure(size_t smem) {
        static size_t allowed = 48 * 1024;  // dynamic shared memory allowed without opting in
        if (smem <= allowed) return true;
        if (cudaFuncSetAttribute(paged_decode_bulk<LANES, GT, BULK, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess)
            return false;
        allowed = smem;
        return true;
    }
    static int resident(size_t smem) {
        int n = 0;
        if (!configure(smem) || cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                    &n, paged_decode_bulk<LANES, GT, BULK, NT>, NT, smem) != cudaSuccess)
            return 0;
        return n;
    }
    static int run(int op, const Params& p, dim3 grid, size_t smem) {
        if (op == 0) return resident(smem);
        if (!configure(smem)) return 0;
        paged_decode_bulk<LANES, GT, BULK, NT><<<grid, NT, smem>>>(p);
        return 1;
    }
};

// Over the compiled (LANES, GT, BULK, NT) kernels; op 0: blocks resident per SM, op 1: launch.
// The deep ring's wider blocks exist for query groups of up to 2 heads per block only: more
// would not fit their registers.
template <int LANES, bool BULK, int NT>
int dispatch_gt(int op, int gt, const Params& p, dim3 grid, size_t smem) {
    if (gt == 1) return Kernel<LANES, 1, BULK, NT>::run(op, p, grid, smem);
    if (gt == 2) return Kernel<LANES, 2, BULK, NT>::run(op, p, grid, smem);
    if constexpr (NT == THREADS) {
        if (gt == 4) return Kernel<LANES, 4, BULK, NT>::run(op, p, grid, smem);
        return Kernel<LANES, 8, BULK, NT>::run(op, p, grid, smem);
    }
    return 0;
}

template <bool BULK, int NT>
int dispatch_lanes(int op, int lanes, int gt, const Params& p, dim3 grid, size_t smem) {
    switch (lanes) {
        case 8: return dispatch_gt<8, BULK, NT>(op, gt, p, grid, smem);
        case 16: return dispatch_gt<16, BULK, NT>(op, gt, p, grid, smem);
        default: return dispatch_gt<32, BULK, NT>(op, gt, p, grid, smem);
    }
}

// nt: THREADS, or DEEP_THREADS on the bulk path
int dispatch(int op, bool bulk, int lanes, int gt, int nt, const Params& p, dim3 grid, size_t smem) {
    if (!bulk) return dispatch_lanes<false, THREADS>(op, lanes, gt, p, grid, smem);
    if (nt == THREADS) return dispatch_lanes<true, THREADS>(op, lanes, gt, p, grid, smem);
    return dispatch_lanes<true, DEEP_THREADS>(op, lanes, gt, p, grid, smem);
}

struct Plan {
    long long key[10];
    Params p;
    dim3 grid;
    size_t smem;
    int lanes, gt, nt;
    bool bulk, valid;
};

float* g_scratch = nullptr;
size_t g_scratch_cap = 0;  // floats
int* g_counters = nullptr;
size_t g_counters_cap = 0;  // ints
int g_sms[64];
Plan g_plan;

size_t align128(size_t x) { return (x + 127) & ~(size_t)127; }

// Grows *buf to at least n elements of `size` bytes (zeroed); false when cudaMalloc fails.
bool grow(void** buf, size_t* cap, size_t n, size_t size) {
    if (n <= *cap) return true;
    if (*buf) cudaFree(*buf);
    *buf = nullptr;
    *cap = 0;
    if (cudaMalloc(buf, n * size) != cudaSuccess) {
        fprintf(stderr, "paged_decode splitkv_bulk.cu: cudaMalloc of %zu bytes failed\n", n * size);
        return false;
    }
    cudaMemset(*buf, 0, n * size);
    *cap = n;
    return true;
}

// Shared-memory layout of a block: mbarriers, staged page ids (at least one int per
// row, reused for the combine's row list), then the stages (reused for the merges).
size_t layout(Params& p, bool bulk, int gt, int ns, int nt, int split_pages) {
    const size_t pages_off = align128((RING_MAX + 1) * sizeof(uint64_t));
    int ids = split_pages > p.HC * gt ? split_pages : p.HC * gt;
    if (bulk && ids < p.HC * gt * (STAGED_SPLITS + 1)) ids = p.HC * gt * (STAGED_SPLITS + 1);
    size_t tail = bulk ? (size_t)p.stages * p.stage_bytes : 0;
    const size_t merge = (size_t)ns * gt * (p.D + 3) * sizeof(float);
    const size_t weights = combine_bytes(nt);
    if (merge > tail) tail = merge;
    if (weights > tail) tail = weights;
    p.pages_off = (int)pages_off;
    p.stage_off = (int)(pages_off + align128((size_t)ids * sizeof(int)));
    return p.stage_off + tail;
}

// Heads per block, tile and split count for one load path; false when nothing fits.
// The split count fills WAVES x the resident blocks, with splits of at least MIN_SPLIT
// tokens and at most MAX_SPLITS of them (the last block of a unit merges them alone).
// choose() leaves its heads per block, tile and shared-memory offsets in p.
struct Choice {
    int n_splits, split_pages, units, blocks, slots;
    size_t smem;
};

// A ring: its stage count (0 on the register path), stage size and threads per block.
struct Ring {
    int stages, stage_kb, threads;
};

bool choose(Params& p, bool bulk, Ring ring, int hc, int gt, int lanes, int B, int max_tokens, int sms, Choice& c) {
    const int nt = ring.threads, ns = nt / lanes, pages = (max_tokens + p.page - 1) / p.page;
    const size_t chunk = (size_t)hc * p.D * 2;
    if (hc > ns) return false;  // a stream per head of the chunk at least
    p.HC = hc;
    p.stages = bulk ? ring.stages : 0;
    int t = bulk ? (int)(ring.stage_kb * 1024 / (2 * chunk)) : 1;
    p.T = t < 1 ? 1 : (t > 128 ? 128 : t);
    p.stage_bytes = bulk ? (int)align128(2 * (size_t)p.T * chunk) : 0;
    // occupancy with the longest page list and most splits, then the split count it allows
    const int resident = dispatch(0, bulk, lanes, gt, nt, p, dim3(), layout(p, bulk, gt, ns, nt, pages));
    if (resident <= 0) return false;
    c.units = B * p.SQ * (p.HK / hc) * (p.group / gt);
    c.slots = WAVES * resident * sms;
    int n = c.slots / c.units;
    const int by_len = (max_tokens + MIN_SPLIT - 1) / MIN_SPLIT;
    if (n > by_len) n = by_len;
    if (n > pages) n = pages;
    if (n > MAX_SPLITS) n = MAX_SPLITS;
    if (n < 1) n = 1;
    c.split_pages = (pages + n - 1) / n;
    c.n_splits = (pages + c.split_pages - 1) / c.split_pages;
    c.blocks = c.units * c.n_splits;
    c.smem = layout(p, bulk, gt, ns, nt, c.split_pages);
    return true;
}

bool make_plan(int dev, const long long* key) {
    const int B = (int)key[1], SK = (int)key[2], SQ = (int)key[3], H = (int)key[4], HK = (int)key[5];
    const int D = (int)key[6], PAGE = (int)key[7];
    const long long NB = key[8];
    if (HK <= 0 || H % HK != 0 || D % 8 != 0 || D <= 0 || D > 256 || PAGE <= 0 || B <= 0 || SQ <= 0) {
        fprintf(stderr, "paged_decode splitkv_bulk.cu: unsupported shape H=%d HK=%d D=%d page=%d "
                        "(needs HK | H, D %% 8 == 0, D <= 256)\n", H, HK, D, PAGE);
        return false;
    }
    if (g_sms[dev] == 0) {
        int sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        g_sms[dev] = sms > 0 ? sms : 132;
    }
    Params& p = g_plan.p;
    p.H = H; p.HK = HK; p.group = H / HK; p.SQ = SQ; p.D = D; p.page = PAGE;
    const int gt = (p.group % 8 == 0) ? 8 : (p.group % 4 == 0) ? 4 : (p.group % 2 == 0) ? 2 : 1;
    const int lanes = D <= 64 ? 8 : (D <= 128 ? 16 : 32);
    const int ns = THREADS / lanes, max_tokens = SK > 0 ? SK : 1;  // streams of the narrower blocks

    // Bulk copies pay where each copy is large (a token's chunk of several heads: the copy
    // engine took ~40 cycles per copy on the H200, so 256-byte ones starve it), the grid
    // fills at least BULK_MIN_FILL% of the resident blocks and a split is long enough to
    // amortise the ring's start; otherwise lanes load one head's chunks directly.
    int hc = 1;
    for (int c = 1; c <= HK && c <= ns && c <= MAX_HEADS; ++c)
        if (HK % c == 0 && c * D * 2 <= 4096) hc = c;
    // The ring of STAGES first; where its grid would not fill the GPU, the deep ring, whose
    // fewer blocks per SM make the same grid a fuller one.
    Choice c;
    bool bulk = false;
    const Ring rings[2] = {{STAGES, STAGE_KB, THREADS}, {DEEP_STAGES, DEEP_STAGE_KB, DEEP_THREADS}};
    int r = 0;
    for (; r < 2 && !bulk && hc * D * 2 >= BULK_MIN_BYTES; ++r)
        bulk = rings[r].stages > 0 && choose(p, true, rings[r], hc, gt, lanes, B, max_tokens, g_sms[dev], c) &&
               100 * c.blocks >= BULK_MIN_FILL * c.slots && c.split_pages * PAGE >= BULK_MIN_SPLIT;
    const int nt = bulk ? rings[r - 1].threads : THREADS;
    if (!bulk && !choose(p, false, Ring{0, 0, THREADS}, 1, gt, lanes, B, max_tokens, g_sms[dev], c)) {
        fprintf(stderr, "paged_decode splitkv_bulk.cu: no block configuration fits the shared memory\n");
        return false;
    }
    p.causal = (key[9] != 0 && SQ > 1) ? 1 : 0;
    p.hchunks = HK / p.HC; p.gchunks = p.group / gt;
    p.n_splits = c.n_splits; p.split_pages = c.split_pages; p.split_tokens = c.split_pages * PAGE;
    p.bt_stride = NB / B;
    p.qk_scale = LOG2E_F / sqrtf((float)D);
    const size_t n_rows = (size_t)B * SQ * H;
    if (c.n_splits > 1 && !grow((void**)&g_scratch, &g_scratch_cap, n_rows * c.n_splits * (D + 2), sizeof(float)))
        return false;
    if (!grow((void**)&g_counters, &g_counters_cap, (size_t)c.units, sizeof(int))) return false;
    p.a_buf = g_scratch;
    p.m_buf = g_scratch ? g_scratch + n_rows * c.n_splits * D : nullptr;
    p.l_buf = g_scratch ? p.m_buf + n_rows * c.n_splits : nullptr;
    p.counters = g_counters;
    g_plan.grid = dim3(c.units, c.n_splits, 1);
    g_plan.smem = c.smem;
    g_plan.lanes = lanes;
    g_plan.gt = gt;
    g_plan.nt = nt;
    g_plan.bulk = bulk;
    return true;
}

}  // namespace

extern "C" void run_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k_cache_paged,
                           const __nv_bfloat16* v_cache_paged, __nv_bfloat16* output,
                           const int32_t* cache_seqlens, const int32_t* block_table, int64_t batch_size,
                           int64_t seqlen_k, int64_t seqlen_q, int64_t num_heads, int64_t num_heads_k,
                           int64_t headdim, int64_t page_block_size, int64_t num_blocks, int64_t causal) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev < 0 || dev >= 64) dev = 0;
    const long long key[10] = {dev, batch_size, seqlen_k, seqlen_q, num_heads, num_heads_k,
                               headdim, page_block_size, num_blocks, causal};
    bool hit = g_plan.valid;
    for (int i = 0; hit && i < 10; ++i) hit = (g_plan.key[i] == key[i]);
    if (!hit) {
        g_plan.valid = make_plan(dev, key);
        if (!g_plan.valid) return;
        for (int i = 0; i < 10; ++i) g_plan.key[i] = key[i];
    }
    if ((reinterpret_cast<uintptr_t>(k_cache_paged) | reinterpret_cast<uintptr_t>(v_cache_paged)) & 15) {
        fprintf(stderr, "paged_decode splitkv_bulk.cu: the K/V caches must be 16-byte aligned for bulk copies\n");
        return;
    }
    Params& p = g_plan.p;
    p.q = q; p.k = k_cache_paged; p.v = v_cache_paged; p.out = output;
    p.seqlens = cache_seqlens; p.block_table = block_table;
    if (!dispatch(1, g_plan.bulk, g_plan.lanes, g_plan.gt, g_plan.nt, p, g_plan.grid, g_plan.smem))
        fprintf(stderr, "paged_decode splitkv_bulk.cu: could not configure the kernel\n");
#ifdef PAGED_DECODE_DEBUG
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) fprintf(stderr, "paged_decode splitkv_bulk.cu: launch failed: %s\n", cudaGetErrorString(err));
#endif
}
