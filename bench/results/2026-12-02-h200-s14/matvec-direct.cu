// Experiment (not part of coti): how close to a bare read does a one-token Q8_0 matvec come when
// (a) its input arrives as codes formed by a kernel before it (no prologue), and (b) each lane
// loads its weight blocks straight into registers, the first row's before griddepcontrol.wait,
// instead of cp.async into shared memory? Chains of 32 matvecs 4096 -> 4096 (17.8 MB each),
// each input the previous output, PDL, in a graph. Variants: A0 = session 8's matvec with the
// input quantized in every block's prologue (coti's fused form); A1 = the same body reading
// codes from a form kernel; D = direct register loads reading the same codes. Same sum order
// in all three, so the outputs must be bit-identical.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

enum { WARPS = 16, THREADS = WARPS * 32, BB = 34, CHB = 64 /* blocks per chunk */, CHBYTES = CHB * BB,
       SLOT = CHBYTES + 32, WSM = WARPS * 2 * SLOT };

struct mat { const uint8_t *w; int n_in, n_out; };
// one phase: y = W q(x); in_mode 0: x f32 quantized per block into smem; 1: codes in global (xq, xd)
struct phase { int probe; /* 1: skip the input prologue, 2: skip the dot products (timing only) */ mat m; mat next; /* the next phase with weights: L2 prefetch target */ const float *x; const int8_t *xq; const float *xd; float *y; int in_mode;
               // form phase (m.w == NULL): h = silu(a[i]) * a[i + n] -> codes xq/xd (n = m.n_in)
};

__device__ __forceinline__ void cp16(uint8_t *s, const void *g) {
    unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ int q8c(float r) { return !(r == r) ? 0 : r >= 127.f ? 127 : r <= -127.f ? -127 : (int)roundf(r); }

// quantize 32-blocks of v (n values) into q/d, 8 lanes per block, 4 values each; item = thread index
__device__ void q8_blocks(const float *v, int n, int8_t *q, float *d, int tid, int nthr, bool swiglu, const float *a) {
    const int nb = n / 32;
    for (int i = tid; i < nb * 8; i += nthr) { // all lanes of a warp iterate together when nb*8 % 32 == 0
        const int b = i / 8, part = i % 8, e0 = 32 * b + 4 * part;
        float x[4];
        for (int k = 0; k < 4; k++) {
            if (swiglu) { float g = a[e0 + k], u = a[e0 + k + n]; x[k] = g / (1.f + expf(-g)) * u; }
            else x[k] = v[e0 + k];
        }
        float amax = 0.f;
        for (int k = 0; k < 4; k++) amax = fmaxf(amax, fabsf(x[k]));
        for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
        const float dd = amax / 127.f, id = dd != 0.f ? 1.f / dd : 0.f;
        uint32_t w = 0;
        for (int k = 0; k < 4; k++) w |= (uint32_t)(q8c(x[k] * id) & 0xFF) << (8 * k);
        *(uint32_t *)(q + e0) = w;
        if (part == 0) d[b] = __half2float(__float2half_rn(dd));
    }
}

struct stream_state { int row, ch; };

// warp-level row streaming over one matrix: rows gw, gw + nw, ...; chunks of CHB blocks
__device__ __forceinline__ unsigned sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
struct streamer {
    uint8_t *stages; // this warp's 2 stages
    int gw, nw, lane;
    bool bulk;       // TMA bulk copies (one per chunk, completion on an mbarrier per stage)
    uint64_t *bars;  // this warp's 2 mbarriers
    unsigned par;    // expected parity per stage
    __device__ void wait(int st) {
        if (bulk) {
            unsigned ok = 0;
            const unsigned ph = (par >> st) & 1;
            do {
                asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                             : "=r"(ok) : "r"(sa(bars + st)), "r"(ph) : "memory");
            } while (!ok);
            par ^= 1u << st;
        } else wait1();
        __syncwarp();
    }
    __device__ void issue(const mat &m, stream_state s, int st) {
        const int nbr = m.n_in / 32, nch = (nbr + CHB - 1) / CHB;
        if (s.row < m.n_out && s.ch < nch) {
            const uint8_t *row = m.w + (size_t)s.row * nbr * BB;
            const int b0 = s.ch * CHB, b1 = min(b0 + CHB, nbr);
            const uint8_t *gs = row + (size_t)b0 * BB, *ge = row + (size_t)b1 * BB;
            const uint8_t *a0 = (const uint8_t *)((uintptr_t)gs & ~(uintptr_t)15);
            const int n16 = (int)((ge - a0 + 15) / 16);
            if (bulk) {
                if (lane == 0) {
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(bars + st)), "r"(16 * n16) : "memory");
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                                 ::"r"(sa(stages + st * SLOT)), "l"(a0), "r"(16 * n16), "r"(sa(bars + st)) : "memory");
                }
                return;
            }
            for (int i = lane; i < n16; i += 32) cp16(stages + st * SLOT + 16 * i, a0 + 16 * i);
        }
        if (!bulk) commit();
    }
    __device__ void next(const mat &m, stream_state &s) {
        const int nch = (m.n_in / 32 + CHB - 1) / CHB;
        if (++s.ch == nch) { s.ch = 0; s.row += nw; }
    }
};

// The matvec body: assumes items 0 and 1 of this warp's sequence were already issued into
// stages 0 and 1 (before a PDL wait or a grid barrier).
__device__ void matvec_body(const phase &p, streamer &sw, const int8_t *xq, const float *xd) {
    const mat &m = p.m;
    const int nbr = m.n_in / 32, nch = (nbr + CHB - 1) / CHB;
    stream_state c = {sw.gw, 0}, is = {sw.gw, 0};
    sw.next(m, is); sw.next(m, is);
    int st = 0;
    float acc = 0.f;
    while (c.row < m.n_out) {
        sw.wait(st);
        const int b0 = c.ch * CHB, nb = min(CHB, nbr - b0);
        const uint8_t *gs = m.w + (size_t)c.row * nbr * BB + (size_t)b0 * BB;
        const uint8_t *sm = sw.stages + st * SLOT + ((uintptr_t)gs & 15);
        if (p.probe == 2) acc += sm[sw.lane];
        else for (int b = sw.lane; b < nb; b += 32) {
            const uint8_t *blk = sm + BB * b;
            const float dw = __half2float(*(const __half *)blk);
            const uint16_t *c16 = (const uint16_t *)(blk + 2);
            const int xb = b0 + b;
            const int4 *xp = (const int4 *)(xq + 32 * xb);
            const int4 xa = xp[0], xc = xp[1];
            const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xc.x, xc.y, xc.z, xc.w};
            int sum = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) sum = __dp4a((int)(c16[2 * k] | ((uint32_t)c16[2 * k + 1] << 16)), xw[k], sum);
            acc += __fmul_rn(__fmul_rn(dw, xd[xb]), (float)sum);
        }
        __syncwarp();
        sw.issue(m, is, st); // refill the stage just consumed
        sw.next(m, is);
        st ^= 1;
        if (++c.ch == nch) {
            for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
            if (sw.lane == 0) p.y[c.row] = acc;
            acc = 0.f;
            c.ch = 0;
            c.row += sw.nw;
        }
    }
}

__device__ __forceinline__ void prefetch2(const phase &p, streamer &sw) {
    if (!p.m.w) return;
    stream_state s = {sw.gw, 0};
    sw.issue(p.m, s, 0); sw.next(p.m, s); sw.issue(p.m, s, 1);
}

// run phase p by this block; the weight prefetch was done by the caller
__device__ void run_phase(const phase &p, streamer &sw, uint8_t *xs_q, float *xs_d) {
    if (!p.m.w) { // form: swiglu + codes, grid-wide
        q8_blocks(NULL, p.m.n_in, (int8_t *)p.xq, (float *)p.xd, blockIdx.x * THREADS + threadIdx.x, gridDim.x * THREADS, true, p.x);
        return;
    }
    const int8_t *xq; const float *xd;
    if (p.in_mode == 0) {
        if (p.probe != 1) q8_blocks(p.x, p.m.n_in, (int8_t *)xs_q, xs_d, threadIdx.x, THREADS, false, NULL);
        __syncthreads();
        xq = (const int8_t *)xs_q; xd = xs_d;
    } else { xq = p.xq; xd = p.xd; }
    matvec_body(p, sw, xq, xd);
}

__device__ __forceinline__ streamer make_streamer(uint8_t *dsm, bool bulk) {
    streamer sw;
    const int warp = threadIdx.x / 32;
    sw.bulk = bulk;
    sw.par = 0;
    sw.bars = (uint64_t *)(dsm + WSM + 4096 + 512) + 2 * warp;
    if (bulk) {
        if (threadIdx.x % 32 == 0) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(sw.bars)) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(sw.bars + 1)) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncwarp();
    }
    sw.stages = dsm + warp * 2 * SLOT;
    sw.gw = blockIdx.x * WARPS + warp;
    sw.nw = gridDim.x * WARPS;
    sw.lane = threadIdx.x % 32;
    return sw;
}


__global__ void __launch_bounds__(THREADS, 2) phase_kernel(const phase p) {
    extern __shared__ __align__(128) uint8_t dsm[];
    pdl_trigger();
    streamer sw = make_streamer(dsm, false);
    prefetch2(p, sw);
    pdl_wait();
    run_phase(p, sw, dsm + WSM, (float *)(dsm + WSM + 4096));
}

// the input's codes, grid-wide (a producer's epilogue would write these)
__global__ void __launch_bounds__(256) form_kernel(const float *x, int n, int8_t *xq, float *xd) {
    pdl_trigger();
    pdl_wait();
    q8_blocks(x, n, xq, xd, blockIdx.x * 256 + threadIdx.x, gridDim.x * 256, false, NULL);
}

// D: lane l takes blocks l, l + 32, l + 64, l + 96 of its warp's rows (the order A sums them
// in); a block's 34 bytes come as the 9 aligned words that cover them. PRE blocks per lane of
// the first row are loaded before the wait.
template <int PRE>
__global__ void __launch_bounds__(THREADS, 2) direct_kernel(const uint8_t *w, int n_in, int n_out, const int8_t *xq,
                                                            const float *xd, float *y) {
    constexpr int KB = 4; // blocks per lane and row: n_in = 4096 only
    pdl_trigger();
    const int lane = threadIdx.x % 32, gw = blockIdx.x * WARPS + threadIdx.x / 32, nw = gridDim.x * WARPS;
    const int nb = n_in / 32;
    const size_t rb = (size_t)nb * BB;
    uint32_t wv[PRE][9];
    int row = gw;
    if (row < n_out) {
#pragma unroll
        for (int k = 0; k < PRE; k++) {
            const uint8_t *b = w + (size_t)row * rb + (size_t)(lane + 32 * k) * BB;
            const uint32_t *a = (const uint32_t *)((uintptr_t)b & ~(uintptr_t)3);
#pragma unroll
            for (int j = 0; j < 9; j++) wv[k][j] = __ldg(a + j);
        }
    }
    pdl_wait();
    for (; row < n_out; row += nw) {
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < KB; k++) {
            const int b = lane + 32 * k;
            const uint8_t *bp = w + (size_t)row * rb + (size_t)b * BB;
            const bool odd = ((uintptr_t)bp & 3) != 0; // the block starts 2 bytes into a word
            uint32_t v[9];
            if (k < PRE && row == gw) {
#pragma unroll
                for (int j = 0; j < 9; j++) v[j] = wv[k < PRE ? k : 0][j]; // k is a constant here
            } else {
                const uint32_t *a = (const uint32_t *)((uintptr_t)bp & ~(uintptr_t)3);
#pragma unroll
                for (int j = 0; j < 9; j++) v[j] = __ldg(a + j);
            }
            const uint16_t dbits = odd ? (uint16_t)(v[0] >> 16) : (uint16_t)(v[0] & 0xFFFF);
            const float dw = __half2float(__ushort_as_half(dbits));
            const int4 *xp = (const int4 *)(xq + 32 * b);
            const int4 xa = xp[0], xc = xp[1];
            const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xc.x, xc.y, xc.z, xc.w};
            int sum = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t q = odd ? v[j + 1] : __funnelshift_r(v[j], v[j + 1], 16);
                sum = __dp4a((int)q, xw[j], sum);
            }
            acc += __fmul_rn(__fmul_rn(dw, xd[b]), (float)sum);
        }
        for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
        if (lane == 0) y[row] = acc;
    }
}

// D2p: any shape. A warp's work is a sequence of items (row, G consecutive blocks of the lane's
// own sequence lane, lane + 32, ...); two items live in registers, the next loading while the
// current is summed; the first is loaded before the wait. Same sum order as A.
template <int G>
__device__ __forceinline__ void load_item(const uint8_t *w, size_t rb, int row, int g, int lane, uint32_t (&v)[G][9]) {
#pragma unroll
    for (int i = 0; i < G; i++) {
        const uint8_t *bp = w + (size_t)row * rb + (size_t)(lane + 32 * (g * G + i)) * BB;
        const uint32_t *a = (const uint32_t *)((uintptr_t)bp & ~(uintptr_t)3);
#pragma unroll
        for (int j = 0; j < 9; j++) v[i][j] = __ldg(a + j);
    }
}
template <int G>
__device__ __forceinline__ float sum_item(const uint8_t *w, size_t rb, int row, int g, int lane, const uint32_t (&v)[G][9],
                                          const int8_t *xq, const float *xd, float acc) {
#pragma unroll
    for (int i = 0; i < G; i++) {
        const int b = lane + 32 * (g * G + i);
        const bool odd = (((uintptr_t)w + (size_t)row * rb + (size_t)b * BB) & 3) != 0;
        const uint16_t dbits = odd ? (uint16_t)(v[i][0] >> 16) : (uint16_t)(v[i][0] & 0xFFFF);
        const float dw = __half2float(__ushort_as_half(dbits));
        const int4 *xp = (const int4 *)(xq + 32 * b);
        const int4 xa = xp[0], xc = xp[1];
        const int xw[8] = {xa.x, xa.y, xa.z, xa.w, xc.x, xc.y, xc.z, xc.w};
        int sum = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) sum = __dp4a((int)(odd ? v[i][j + 1] : __funnelshift_r(v[i][j], v[i][j + 1], 16)), xw[j], sum);
        acc += __fmul_rn(__fmul_rn(dw, xd[b]), (float)sum);
    }
    return acc;
}
template <int G>
__global__ void __launch_bounds__(THREADS, 2) direct_pipe_kernel(const uint8_t *w, int n_in, int n_out, const int8_t *xq,
                                                                 const float *xd, float *y) {
    pdl_trigger();
    const int lane = threadIdx.x % 32, gw = blockIdx.x * WARPS + threadIdx.x / 32, nw = gridDim.x * WARPS;
    const int nb = n_in / 32, ipr = nb / 32 / G; // items per row (n_in a multiple of 1024 * G)
    const size_t rb = (size_t)nb * BB;
    const int rows = gw < n_out ? (n_out - gw + nw - 1) / nw : 0, n_items = rows * ipr;
    uint32_t va[G][9], vb[G][9];
    if (n_items > 0) load_item<G>(w, rb, gw, 0, lane, va);
    pdl_wait();
    float acc = 0.f;
    auto step = [&](int it, uint32_t (&cur)[G][9], uint32_t (&nxt)[G][9]) {
        const int row = gw + (it / ipr) * nw, g = it % ipr;
        if (it + 1 < n_items) load_item<G>(w, rb, gw + ((it + 1) / ipr) * nw, (it + 1) % ipr, lane, nxt);
        acc = sum_item<G>(w, rb, row, g, lane, cur, xq, xd, acc);
        if (g == ipr - 1) {
            for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
            if (lane == 0) y[row] = acc;
            acc = 0.f;
        }
    };
    for (int it = 0; it < n_items; it += 2) {
        step(it, va, vb);
        if (it + 1 < n_items) step(it + 1, vb, va);
    }
}

static void fill_q8(uint8_t *h, size_t nblk, uint32_t seed) {
    for (size_t i = 0; i < nblk; i++) {
        seed = seed * 1664525u + 1013904223u;
        __half d = __float2half(0.0002f + (seed >> 8) * (1.0f / 16777216.0f) * 0.00002f);
        memcpy(h + i * BB, &d, 2);
        for (int k = 0; k < 32; k++) { seed = seed * 1664525u + 1013904223u; h[i * BB + 2 + k] = (uint8_t)(seed >> 24); }
    }
}

static uint8_t *upload_mat(int n_in, int n_out, uint32_t seed) {
    const size_t bytes = (size_t)n_in / 32 * BB * n_out;
    std::vector<uint8_t> h(bytes);
    fill_q8(h.data(), bytes / BB, seed);
    uint8_t *d;
    CK(cudaMalloc(&d, bytes + 64));
    CK(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice));
    return d;
}

static cudaStream_t s;
static void launch_pdl(const void *fn, int grid, int threads, int smem, void **args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid); cfg.blockDim = dim3(threads); cfg.dynamicSmemBytes = smem; cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at; cfg.numAttrs = 1;
    CK(cudaLaunchKernelExC(&cfg, fn, args));
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int smem = 80 * 1024;
    CK(cudaFuncSetAttribute(phase_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int grid = prop.multiProcessorCount * 2;
    cudaFuncAttributes fa[4];
    CK(cudaFuncGetAttributes(&fa[0], phase_kernel));
    CK(cudaFuncGetAttributes(&fa[1], direct_kernel<4>));
    CK(cudaFuncGetAttributes(&fa[2], direct_kernel<2>));
    CK(cudaFuncGetAttributes(&fa[3], direct_kernel<1>));
    printf("# %s; registers: A %d, D4 %d, D2 %d, D1 %d\n", prop.name, fa[0].numRegs, fa[1].numRegs, fa[2].numRegs, fa[3].numRegs);
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const int N = 32, n = 4096;
    std::vector<uint8_t *> W(N);
    for (int i = 0; i < N; i++) W[i] = upload_mat(n, n, 1000 + i);
    float *ys[N + 1];
    for (int i = 0; i <= N; i++) {
        CK(cudaMalloc(&ys[i], n * 4));
        std::vector<float> h(n);
        for (int k = 0; k < n; k++) h[k] = sinf(0.37f * k + i) * 0.8f;
        CK(cudaMemcpy(ys[i], h.data(), n * 4, cudaMemcpyHostToDevice));
    }
    int8_t *xq; float *xd;
    CK(cudaMalloc(&xq, n + 64)); CK(cudaMalloc(&xd, n / 32 * 4 + 64));
    const double bytes = (double)N * n / 32 * BB * n;
    const char *names[] = {"A0 prologue quantizes (coti's fused form)", "A1 form kernel + cp.async matvec",
                           "D4 form kernel + direct, row before wait", "D2 form kernel + direct, half row before wait",
                           "D1 form kernel + direct, a quarter before", "D2p form kernel + direct, pipelined (2 an item)"};
    std::vector<float> ref;
    for (int v = 0; v < 6; v++) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < N; i++) {
            if (v == 0) {
                phase p = {};
                p.m = {W[i], n, n}; p.x = ys[i]; p.y = ys[i + 1]; p.in_mode = 0;
                void *args[] = {&p};
                launch_pdl((const void *)phase_kernel, grid, THREADS, smem, args);
                continue;
            }
            { const float *x = ys[i]; int nn = n; void *args[] = {&x, &nn, &xq, &xd};
              launch_pdl((const void *)form_kernel, 16, 256, 0, args); }
            if (v == 1) {
                phase p = {};
                p.m = {W[i], n, n}; p.xq = xq; p.xd = xd; p.y = ys[i + 1]; p.in_mode = 1;
                void *args[] = {&p};
                launch_pdl((const void *)phase_kernel, grid, THREADS, smem, args);
            } else {
                const uint8_t *wp = W[i]; int ni = n, no = n; float *yp = ys[i + 1];
                void *args[] = {&wp, &ni, &no, &xq, &xd, &yp};
                const void *fn = v == 2 ? (const void *)direct_kernel<4> : v == 3 ? (const void *)direct_kernel<2>
                               : v == 4 ? (const void *)direct_kernel<1> : (const void *)direct_pipe_kernel<2>;
                launch_pdl(fn, grid, THREADS, 0, args);
            }
        }
        CK(cudaStreamEndCapture(s, &g));
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        std::vector<float> t;
        for (int r = 0; r < 5; r++) {
            CK(cudaEventRecord(e0, s));
            for (int k = 0; k < reps; k++) CK(cudaGraphLaunch(ge, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms * 1000.f / reps);
        }
        std::sort(t.begin(), t.end());
        // one chain from the same inputs, to compare the variants' outputs
        for (int i = 0; i <= N; i++) {
            std::vector<float> h(n);
            for (int k = 0; k < n; k++) h[k] = sinf(0.37f * k + i) * 0.8f;
            if (i == 0) CK(cudaMemcpy(ys[0], h.data(), n * 4, cudaMemcpyHostToDevice));
        }
        CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        std::vector<float> o(n);
        CK(cudaMemcpy(o.data(), ys[N], n * 4, cudaMemcpyDeviceToHost));
        if (v == 1) ref = o;
        const char *same = v == 0 ? "-" : memcmp(ref.data(), o.data(), n * 4) ? "DIFFERS from A1" : "same as A1";
        printf("%-48s %8.2f us per matvec (+ its form kernel)  %7.1f GB/s  output %s\n", names[v], t[2] / N, bytes / (t[2] * 1e-6) / 1e9, same);
        CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    }

    // FFN-shaped chain: 8 x [codes of x (4096) | 4096 -> 24576 | codes of y[0..12288) | 12288 -> 4096]
    {
        const int L = 8;
        std::vector<uint8_t *> GU(L), DN(L);
        for (int i = 0; i < L; i++) { GU[i] = upload_mat(4096, 24576, 2000 + i); DN[i] = upload_mat(12288, 4096, 3000 + i); }
        float *h[2 * L + 1];
        for (int i = 0; i <= 2 * L; i++) {
            CK(cudaMalloc(&h[i], 24576 * 4));
            std::vector<float> hv(24576);
            for (int k = 0; k < 24576; k++) hv[k] = sinf(0.37f * k + i) * 0.8f;
            CK(cudaMemcpy(h[i], hv.data(), 24576 * 4, cudaMemcpyHostToDevice));
        }
        int8_t *q2; float *d2;
        CK(cudaMalloc(&q2, 12288 + 64)); CK(cudaMalloc(&d2, 12288 / 32 * 4 + 64));
        const double fb = (double)L * (4096.0 / 32 * BB * 24576 + 12288.0 / 32 * BB * 4096);
        const char *fn_names[] = {"A1 form kernel + cp.async matvec", "D2p form kernel + direct, pipelined, 2 blocks an item",
                                  "D1p form kernel + direct, pipelined, 1 block an item"};
        std::vector<float> fref;
        for (int v = 0; v < 3; v++) {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < L; i++) {
                for (int half = 0; half < 2; half++) {
                    const float *x = h[2 * i + half]; int nn = half ? 12288 : 4096;
                    int8_t *cq = half ? q2 : xq; float *cd = half ? d2 : xd;
                    void *fa_[] = {&x, &nn, &cq, &cd};
                    launch_pdl((const void *)form_kernel, 48, 256, 0, fa_);
                    const uint8_t *wp = half ? DN[i] : GU[i]; int ni = half ? 12288 : 4096, no = half ? 4096 : 24576;
                    float *yp = h[2 * i + half + 1];
                    if (v == 0) {
                        phase p = {};
                        p.m = {wp, ni, no}; p.xq = cq; p.xd = cd; p.y = yp; p.in_mode = 1;
                        void *args[] = {&p};
                        launch_pdl((const void *)phase_kernel, grid, THREADS, smem, args);
                    } else {
                        void *args[] = {&wp, &ni, &no, &cq, &cd, &yp};
                        launch_pdl(v == 1 ? (const void *)direct_pipe_kernel<2> : (const void *)direct_pipe_kernel<1>, grid, THREADS, 0, args);
                    }
                }
            }
            CK(cudaStreamEndCapture(s, &g));
            cudaGraphExec_t ge;
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaStreamSynchronize(s));
            std::vector<float> t;
            for (int r = 0; r < 5; r++) {
                CK(cudaEventRecord(e0, s));
                for (int k = 0; k < reps; k++) CK(cudaGraphLaunch(ge, s));
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms * 1000.f / reps);
            }
            std::sort(t.begin(), t.end());
            std::vector<float> o(4096);
            CK(cudaMemcpy(o.data(), h[2 * L], 4096 * 4, cudaMemcpyDeviceToHost));
            if (v == 0) fref = o;
            printf("ffn %-50s %8.2f us per layer (2 matvecs + 2 form kernels)  %7.1f GB/s  output %s\n", fn_names[v], t[2] / L,
                   fb / (t[2] * 1e-6) / 1e9, v == 0 ? "-" : memcmp(fref.data(), o.data(), 4096 * 4) ? "DIFFERS from A1" : "same as A1");
            CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
        }
    }
    return 0;
}
