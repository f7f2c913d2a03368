// step_floor.cu — how fast can a decode token's chain of dependent steps go with ideal kernels?
//
// A decode token of the 27B/32B shapes is ~550 dependent steps: ~257 mat-vecs that stream the
// weights, and ~290 short kernels between them (RMSNorm, the DeltaNet conv / delta-rule step / gated
// norm, attention) that read almost nothing. Each step needs the one before it. This program keeps
// that chain and nothing else: every mat-vec becomes a pure read of the same number of bytes
// (16-byte loads, no dequantization, no arithmetic) and every short kernel an empty step, and it
// times the chain four ways:
//
//   graph      one launch per step, the token replayed as a CUDA graph (what qwen.cu does)
//   barrier    one persistent kernel per token, a grid barrier between two steps (a token kernel)
//   prefetch   the same, but every thread issues its first P loads of the next read step before it
//              enters the barrier(s) ahead of that step, so the weights stream while the grid waits
//   stream     all the token's bytes in one read, no steps at all (the ceiling of any structure)
//
// (The DeltaNet's delta-rule step reads its 6.3 MB state: a read step too.) The result is a floor for
// each structure, not a model of the engine: a real kernel of the same structure does more. It needs
// no model file: the step list is built from the shapes. A second mode (sizes) times pure reads of
// the 27B mat-vecs' sizes as launches of their own, the floor of each kind of mat-vec; a third
// (order) times a mat-vec's bytes read in the order the streaming kernel's warps read them
// (test/PERF_NOTES.md, decode runs 12 and 13, have the H200's numbers).
//
//   make test/step_floor && test/step_floor [27b-iq4_xs | 27b-q4_0 | 32b-iq4_xs | 32b-q4_0 | sizes | order]
//   test/step_floor SHAPE pf: the chain with the short steps' real spans and L2 prefetches of the
//   next read's bytes in them (prefetch_mode)
//   (GPU only; not part of make test)

// The engine without its main, for the benchmark's own pieces: CUDA_CHECK, measure_copy_bandwidth
// (the copy bandwidth exactly as --bench measures it); graph_ms from graph_ms.h.
#define TESTING
#include "../qwen.cu"
#include "graph_ms.h"
#include <algorithm>

// One step of the chain. n > 0: read n 16-byte units starting at unit off; n == 0: a short step.
// next = index of the next read step (-1: none), for the prefetching variant.
typedef struct {
    size_t off, n;
    int next;
    float us; // a short step: how long the engine's kernel for it lasts (run 18's spans, 27B)
} Step;

// --- the step list of a decode token ---------------------------------------------------------------
// Bytes per weight: IQ4_XS 4.25 bits, Q4_0 4.5, Q5_K 5.5, Q6_K 6.5625 (qwen.cu section 3).
#define B_IQ4 (4.25 / 8)
#define B_Q40 (4.5 / 8)
#define B_Q5K (5.5 / 8)
#define B_Q6K (6.5625 / 8)

#define MAX_STEPS 1024
static Step steps[MAX_STEPS];
static int n_steps;
static size_t units_total;
static void read_step(double bytes) {
    size_t n = (size_t)(bytes / 16);
    steps[n_steps++] = Step{units_total, n, -1, 0.0f};
    units_total += n;
}
static void short_step(float us) { steps[n_steps++] = Step{0, 0, -1, us}; }
// the engine's short kernels, us per launch (test/PERF_NOTES.md run 18's per-warp timeline)
#define US_NORM 2.17f
#define US_SILU 1.56f
#define US_CONV 2.0f
#define US_GNORM 2.5f
#define US_ATT_27B 14.1f // the attention (RoPE folded): 27B's hd 256, 32B's hd 128
#define US_ATT_32B 12.0f

// Qwen3.6-27B (qwen35): 64 layers, every 4th gated attention, the others Gated DeltaNet; hidden
// 5120, FFN 17408, vocabulary 248320. iq4 = 1: the IQ4_XS mix (Q5_K DeltaNet qkv, attn_v, ffn_down
// of the first 8 layers; Q6_K output), else Q4_0 (Q6_K output).
static void build_27b(int iq4) {
    double E = 5120, F = 17408, V = 248320, w = iq4 ? B_IQ4 : B_Q40, w5 = iq4 ? B_Q5K : B_Q40;
    for (int l = 0; l < 64; l++) {
        short_step(US_NORM); // RMSNorm
        if (l % 4 == 3) {
            read_step(E * 12288 * w + E * 1024 * w + E * 1024 * w5); // q+gate, k, v
            short_step(US_ATT_27B);                                 // attention (RoPE folded)
            read_step(6144 * E * w);                                 // attn_output
        } else {
            read_step(E * 10240 * w5 + E * 6144 * w + 2 * E * 48 * w); // qkv, z, alpha, beta
            short_step(US_CONV);                                        // conv
            read_step(48.0 * 128 * 128 * 4);                            // delta-rule step: the state
            short_step(US_GNORM);                                       // gated norm
            read_step(6144 * E * w);                                    // ssm_out
        }
        short_step(US_NORM);                              // RMSNorm
        read_step(2 * E * F * w);                         // gate + up
        short_step(US_SILU);                              // SiLU * up
        read_step(F * E * ((iq4 && l < 8) ? B_Q5K : w)); // down
    }
    short_step(US_NORM);     // final RMSNorm
    read_step(E * V * B_Q6K); // output
}

// Qwen3-32B (qwen3): 64 layers, 64 query heads and 8 KV heads of 128, hidden 5120, FFN 25600,
// vocabulary 151936.
static void build_32b(int iq4) {
    double E = 5120, F = 25600, V = 151936, w = iq4 ? B_IQ4 : B_Q40, w5 = iq4 ? B_Q5K : B_Q40;
    for (int l = 0; l < 64; l++) {
        short_step(US_NORM);
        read_step(E * 8192 * w + E * 1024 * w + E * 1024 * w5);
        short_step(US_ATT_32B); // attention
        read_step(8192 * E * w);
        short_step(US_NORM);
        read_step(2 * E * F * w);
        short_step(US_SILU);
        read_step(F * E * ((iq4 && l < 8) ? B_Q5K : w));
    }
    short_step(US_NORM);
    read_step(E * V * B_Q6K);
}

// --- kernels ---------------------------------------------------------------------------------------
// Weight loads as the engine makes them: qwen.cu's ldw (16 bytes, evict-first ld.global.cs, never
// dropped by the compiler).

// Units j0*T + t, (j0+1)*T + t, ... below n of p, four loads in flight; returns their xor.
__device__ __forceinline__ unsigned read_units(const int4 *p, size_t n, size_t t, size_t T, size_t j0) {
    unsigned acc = 0;
    size_t i = t + j0 * T;
    for (; i + 3 * T < n; i += 4 * T) {
        int4 a = ldw(p + i), b = ldw(p + i + T), c = ldw(p + i + 2 * T), d = ldw(p + i + 3 * T);
        acc ^= a.x ^ b.x ^ c.x ^ d.x;
    }
    for (; i < n; i += T) acc ^= ldw(p + i).x;
    return acc;
}

// A mat-vec stand-in: one launch reading n units. sink[0] is written only if the data says so (never:
// the buffer is zero), which keeps the loads alive.
__global__ void read_kernel(const int4 *p, size_t n, int *sink) {
    unsigned acc = read_units(p, n, blockIdx.x * (size_t)blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x, 0);
    if (acc == 0x12345678u) sink[0] = acc;
}

// A short-kernel stand-in: one thread counts.
__global__ void short_kernel(int *sink) {
    if (threadIdx.x == 0) sink[1] += 1;
}

// --- L2 prefetch: the next read step's first bytes fetched while the short steps run --------------
// prefetch.global.L2 (sm_70 PTX) asks for the line of an address in L2 and returns at once: no
// register waits for it. One per `stride` units (2: every 32-byte sector, 8: every 128-byte line).
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ void prefetch_units(const int4 *p, size_t n, int stride, size_t t, size_t T) {
    for (size_t i = t * stride; i < n; i += T * stride) prefetch_l2(p + i);
}

// A short step that lasts `cycles` SM cycles (thread 0 of block 0 spins on clock64), whose threads
// first prefetch units [0, npf) of pf into L2.
__global__ void timed_short_kernel(long long cycles, const int4 *pf, size_t npf, int stride, int *sink) {
    prefetch_units(pf, npf, stride, blockIdx.x * (size_t)blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        long long c0 = clock64();
        while (clock64() - c0 < cycles) {}
        sink[1] += 1;
    }
}

// read_kernel, then (each thread, once its reads are issued and used) a prefetch of units [0, npf)
// of pf into L2: the next read step's first bytes, fetched over the read's tail and the launches
// between the two.
__global__ void read_pf_kernel(const int4 *p, size_t n, const int4 *pf, size_t npf, int stride, int *sink) {
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, T = (size_t)gridDim.x * blockDim.x;
    unsigned acc = read_units(p, n, t, T, 0);
    prefetch_units(pf, npf, stride, t, T);
    if (acc == 0x12345678u) sink[0] = acc;
}

// Grid barrier: every block counts itself in (release), thread 0 waits until all have (acquire).
__device__ __forceinline__ void grid_barrier(unsigned *count, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

// The token as one kernel over a resident grid. P > 0: a thread issues units 0..P-1 of the next read
// step (its share: t, T + t, ...) as soon as its part of the current read step is done, and keeps
// them in registers through the barriers and short steps until that step starts. Warp 0 (whose
// thread 0 makes the barrier's release, which waits for that thread's loads in flight) prefetches
// only when pf_warp0 is set.
template <int P>
__global__ void token_kernel(const int4 *base, const Step *st, int n_steps, unsigned *count, int *sink, int pf_warp0) {
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, T = (size_t)gridDim.x * blockDim.x;
    bool prefetcher = P > 0 && (pf_warp0 || threadIdx.x >= 32);
    unsigned acc = 0, target = 0;
    int4 pf[P > 0 ? P : 1];
    bool have = false;
    for (int s = 0; s < n_steps; s++) {
        Step c = st[s];
        if (c.n) {
            size_t j0 = 0;
            if (have) {
#pragma unroll
                for (int k = 0; k < P; k++) acc ^= pf[k].x;
                j0 = P;
                have = false;
            }
            acc ^= read_units(base + c.off, c.n, t, T, j0);
            if (prefetcher && c.next >= 0) {
                Step d = st[c.next];
#pragma unroll
                for (int k = 0; k < P; k++) pf[k] = t + k * T < d.n ? ldw(base + d.off + t + k * T) : make_int4(0, 0, 0, 0);
                have = true;
            }
        } else if (blockIdx.x == 0 && threadIdx.x == 0) {
            sink[1] += 1;
        }
        target += gridDim.x;
        grid_barrier(count, target);
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

// --- timing ----------------------------------------------------------------------------------------
static cudaEvent_t ev0, ev1;
static void tic(void) { CUDA_CHECK(cudaEventRecord(ev0)); }
static double toc(int reps) {
    float ms;
    CUDA_CHECK(cudaEventRecord(ev1));
    CUDA_CHECK(cudaEventSynchronize(ev1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
    return ms * 1e-3 / reps;
}

static void report(const char *what, double t, double bytes, double copy) {
    printf("  %-44s %7.3f ms  %7.1f tok/s  %6.0f GB/s  %5.1f %% of copy\n", what, t * 1e3, 1 / t, bytes / t / 1e9,
           100 * bytes / t / copy);
}

template <int P>
static double run_token_kernel(const int4 *buf, const Step *d_st, int n, unsigned *count, int *sink, int grid, int pf0, int reps) {
    for (int r = -2; r < reps; r++) {
        if (r == 0) tic();
        CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned)));
        token_kernel<P><<<grid, 256>>>(buf, d_st, n, count, sink, pf0);
    }
    CUDA_CHECK(cudaGetLastError());
    return toc(reps);
}

// One read of S bytes as a launch of its own, K launches over K regions in a graph: us per launch,
// for the sizes of the 27B IQ4_XS file's mat-vecs, at two occupancies (the fit t = t0 + S / B).
static void sizes(double copy, int n_sm) {
    const double mb[] = {16.7, 39.8, 47.3, 53.1, 94.7, 1043.0};
    const int ns = sizeof mb / sizeof mb[0];
    size_t cap = 8ull << 30;
    int4 *buf;
    int *sink;
    CUDA_CHECK(cudaMalloc(&buf, cap));
    CUDA_CHECK(cudaMemset(buf, 0, cap));
    CUDA_CHECK(cudaMalloc(&sink, 2 * sizeof(int)));
    cudaStream_t cs;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    for (int occ = 0; occ < 2; occ++) {
        int grid = occ == 0 ? 8 * n_sm : 2 * n_sm; // 64 or 16 warps per SM
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        printf("pure reads, one launch each, %d warps per SM:\n", grid / n_sm * 8);
        for (int i = 0; i < ns; i++) {
            size_t n = (size_t)(mb[i] * 1e6 / 16);
            int K = (int)std::min((size_t)64, cap / 16 / n);
            cudaGraph_t g;
            CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
            for (int k = 0; k < K; k++) read_kernel<<<grid, 256, 0, cs>>>(buf + k * n, n, sink);
            CUDA_CHECK(cudaStreamEndCapture(cs, &g));
            double t = graph_ms(g, 10, cs) * 1e-3 / K, S = 16.0 * n; // graph_ms destroys g
            printf("  %7.1f MB: %7.2f us per launch, %5.1f %% of copy\n", S / 1e6, t * 1e6, 100 * S / t / copy);
            sx += S, sy += t, sxx += S * S, sxy += S * t;
        }
        double slope = (ns * sxy - sx * sy) / (ns * sxx - sx * sx), t0 = (sy - slope * sx) / ns;
        printf("  fit t = t0 + S / B: t0 %.2f us, B %.0f GB/s = %.1f %% of copy\n", t0 * 1e6, 1e-9 / slope, 100 / slope / copy);
    }
    CUDA_CHECK(cudaFree(buf));
    CUDA_CHECK(cudaFree(sink));
}

// The order in which a mat-vec's warps read its bytes. Pure reads (no arithmetic) of an IQ4_XS
// matrix in the engine's planes (qs: 16 B per 32-weight sub-block; header: 8 B per 8 sub-blocks),
// cut as the streaming kernel cuts it: units of 4 rows x 32 sub-blocks (one 16-byte load per lane and
// row, plus the rows' headers), each warp of a one-wave grid (16 warps per SM) an equal run of units,
// one unit in flight. Three placements of the same units in memory:
//   grid-stride  no units: every thread reads 16-byte pieces at the grid's stride (the ideal order)
//   warp runs    the engine's layout: row-major planes, so at any moment the ~2000 warps read ~2000
//                places spread over the whole matrix
//   step order   unit k of every warp's run stored side by side: at any moment the grid reads one
//                contiguous window (a layout that depends on the grid size)
template <int STEP_ORDER>
__global__ void __launch_bounds__(256, 2) unit_read_kernel(const uint8_t *W, int n_sub, int rows, int upw, int total, int *sink) {
    int lane = threadIdx.x % 32, warp = (blockIdx.x * 256 + threadIdx.x) / 32, nwarps = gridDim.x * 8, cpr = n_sub / 32;
    size_t NB = (size_t)rows * n_sub;
    int c0 = warp * upw, c1 = min(c0 + upw, total);
    unsigned acc = 0;
    int4 q[4];
    int2 h[4];
    auto load = [&](int c) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
            unsigned g = STEP_ORDER ? ((unsigned)((c - c0) * nwarps + warp) * 4 + r) * 32 + lane
                                    : (unsigned)((c / cpr) * 4 + r) * n_sub + (c % cpr) * 32 + lane;
            q[r] = ldw((const int4 *)W + g);
            h[r] = ldw((const int2 *)(W + 16 * NB) + g / 8);
        }
    };
    if (c0 < c1) load(c0);
    for (int c = c0; c < c1; c++) {
#pragma unroll
        for (int r = 0; r < 4; r++) acc ^= q[r].x ^ q[r].w ^ h[r].x;
        if (c + 1 < c1) load(c + 1);
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

static void order(double copy, int n_sm) {
    const struct { const char *name; int n_in, rows; } mats[] = {
        {"27B gate+up", 5120, 2 * 17408}, {"27B ffn_down", 17408, 5120}, {"27B DeltaNet in-proj", 5120, 16480}};
    int grid = 2 * n_sm, warps = grid * 8, K = 20;
    int *sink;
    CUDA_CHECK(cudaMalloc(&sink, 2 * sizeof(int)));
    cudaStream_t cs;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    printf("pure reads of an IQ4_XS matrix in three orders, %d warps, %d launches over %d copies (us per launch, %% of copy):\n",
           warps, K, K);
    for (const auto &m : mats) {
        int n_sub = m.n_in / 32, cpr = n_sub / 32, total = m.rows / 4 * cpr, upw = (total + warps - 1) / warps;
        size_t NB = (size_t)m.rows * n_sub, bytes = 16 * NB + NB, alloc = bytes + 16ull * warps * 4 * 32; // step order's last step may overrun
        alloc = (alloc + 255) / 256 * 256;
        uint8_t *buf; // K copies, one per launch, so that none is read from L2
        CUDA_CHECK(cudaMalloc(&buf, K * alloc));
        CUDA_CHECK(cudaMemset(buf, 0, K * alloc));
        double t[3];
        for (int v = 0; v < 3; v++) {
            cudaGraph_t g;
            CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
            for (int k = 0; k < K; k++) {
                const uint8_t *W = buf + k * alloc;
                if (v == 0) read_kernel<<<grid, 256, 0, cs>>>((const int4 *)W, bytes / 16, sink);
                else if (v == 1) unit_read_kernel<0><<<grid, 256, 0, cs>>>(W, n_sub, m.rows, upw, total, sink);
                else unit_read_kernel<1><<<grid, 256, 0, cs>>>(W, n_sub, m.rows, upw, total, sink);
            }
            CUDA_CHECK(cudaStreamEndCapture(cs, &g));
            t[v] = graph_ms(g, 10, cs) * 1e-3 / K; // graph_ms destroys g
        }
        printf("  %-21s %6.1f MB: grid-stride %6.2f us %5.1f %%, warp runs %6.2f us %5.1f %%, step order %6.2f us %5.1f %%\n",
               m.name, bytes / 1e6, t[0] * 1e6, 100 * bytes / t[0] / copy, t[1] * 1e6, 100 * bytes / t[1] / copy,
               t[2] * 1e6, 100 * bytes / t[2] / copy);
        CUDA_CHECK(cudaFree(buf));
    }
    CUDA_CHECK(cudaFree(sink));
}

// --- pf: the short steps' time filled with the next weights' reads ---------------------------------
// The chain of the shape with every short step lasting as long as the engine's kernel for it, and
// the next read step's first bytes prefetched into L2 over that time: by the short kernels
// themselves, and/or by the read kernel before (after its own reads: over its tail and the launch
// gaps). First, what a prefetch does on its own: K launches over K regions of R bytes each, cold.
static double graph_time(cudaStream_t cs, int reps, void (*body)(cudaStream_t, int), int K) {
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    for (int k = 0; k < K; k++) body(cs, k);
    CUDA_CHECK(cudaStreamEndCapture(cs, &g));
    return graph_ms(g, reps, cs) * 1e-3; // graph_ms destroys g
}
static const int4 *pf_buf;
static int *pf_sink;
static size_t pf_R;            // units per region
static long long pf_spin;      // cycles of a "long" short step
static int pf_grid, pf_stride, pf_nsm;
static void b_read(cudaStream_t cs, int k) { read_kernel<<<pf_grid, 256, 0, cs>>>(pf_buf + k * pf_R, pf_R, pf_sink); }
static void b_pf(cudaStream_t cs, int k) { timed_short_kernel<<<pf_nsm, 256, 0, cs>>>(0, pf_buf + k * pf_R, pf_R, pf_stride, pf_sink); }
static void b_pf_read(cudaStream_t cs, int k) { b_pf(cs, k); b_read(cs, k); }
static void b_spin(cudaStream_t cs, int k) { timed_short_kernel<<<pf_nsm, 256, 0, cs>>>(pf_spin, pf_buf, 0, 2, pf_sink); }
static void b_spin_read(cudaStream_t cs, int k) { b_spin(cs, k); b_read(cs, k); }
static void b_spinpf(cudaStream_t cs, int k) { timed_short_kernel<<<pf_nsm, 256, 0, cs>>>(pf_spin, pf_buf + k * pf_R, pf_R, pf_stride, pf_sink); }
static void b_spinpf_read(cudaStream_t cs, int k) { b_spinpf(cs, k); b_read(cs, k); }

static void prefetch_mode(const int4 *buf, size_t units, int *sink, double copy, int n_sm, int clock_khz, int n) {
    cudaStream_t cs;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    const int reps = 10, read_grid = 8 * n_sm;
    double cyc_per_us = clock_khz / 1e3;
    pf_buf = buf, pf_sink = sink, pf_grid = read_grid, pf_nsm = n_sm;
    pf_R = (size_t)(24e6 / 16);
    pf_spin = (long long)(15 * cyc_per_us);
    int K = (int)std::min((size_t)40, units / pf_R);
    printf("prefetch alone, %d regions of %.0f MB, us per region:\n", K, 16e-6 * pf_R);
    for (pf_stride = 2; pf_stride <= 8; pf_stride *= 4) {
        double r = graph_time(cs, reps, b_read, K) / K, p = graph_time(cs, reps, b_pf, K) / K;
        double pr = graph_time(cs, reps, b_pf_read, K) / K, s = graph_time(cs, reps, b_spin, K) / K;
        double sr = graph_time(cs, reps, b_spin_read, K) / K, spr = graph_time(cs, reps, b_spinpf_read, K) / K;
        double sp = graph_time(cs, reps, b_spinpf, K) / K;
        printf("  stride %2d B: read cold %.2f | prefetch launch %.2f | prefetch + read %.2f | spin %.2f, spin + read %.2f "
               "| spin with prefetch %.2f, + read %.2f (read after a prefetch: %.2f)\n",
               16 * pf_stride, r * 1e6, p * 1e6, pr * 1e6, s * 1e6, sr * 1e6, sp * 1e6, spr * 1e6, (spr - sp) * 1e6);
    }

    // the chain
    double bytes = 16.0 * units;
    struct { const char *name; int spin, short_k, read_pf, stride, short_blocks; } V[] = {
        {"graph, empty short steps", 0, 0, 0, 2, 1},
        {"timed short steps", 1, 0, 0, 2, 1},
        {"timed, short steps prefetch 1x their time", 1, 1, 0, 2, 0},
        {"timed, short steps prefetch 2x their time", 1, 2, 0, 2, 0},
        {"timed, 1x, 16 blocks", 1, 1, 0, 2, 16},
        {"timed, 1x, one per 128 B", 1, 1, 0, 8, 0},
        {"timed, reads prefetch the gaps", 1, 0, 1, 2, 0},
        {"timed, reads prefetch gaps + short 1x", 1, 1, 1, 2, 0},
        {"timed, reads prefetch gaps + short 2x", 1, 2, 1, 2, 0},
        {"timed, reads prefetch gaps + their short", 1, 0, 2, 2, 0},
    };
    double gap_us = 1.0, bw_units_per_us = copy / 16 / 1e6;
    double t_short = 0;
    for (int s = 0; s < n; s++) t_short += steps[s].n ? 0 : steps[s].us;
    for (const auto &v : V) {
        cudaGraph_t g;
        CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        for (int s = 0; s < n; s++) {
            const Step &c = steps[s];
            if (c.n) {
                size_t npf = 0;
                const int4 *pf = buf;
                if (v.read_pf && c.next >= 0) { // the gaps to the next read (and its short steps' time)
                    double us = (c.next - s) * gap_us;
                    for (int j = s + 1; j < c.next && v.read_pf == 2; j++) us += steps[j].us;
                    npf = std::min(steps[c.next].n, (size_t)(us * bw_units_per_us));
                    pf = buf + steps[c.next].off;
                }
                if (npf) read_pf_kernel<<<read_grid, 256, 0, cs>>>(buf + c.off, c.n, pf, npf, v.stride, sink);
                else read_kernel<<<read_grid, 256, 0, cs>>>(buf + c.off, c.n, sink);
            } else {
                int j = s + 1;
                while (j < n && !steps[j].n) j++;
                size_t from = 0, npf = 0;
                if (j < n && v.short_k) {
                    if (v.read_pf) { // the read before already fetched the gaps' share
                        int i = s - 1;
                        while (i >= 0 && !steps[i].n) i--;
                        from = i >= 0 ? std::min(steps[j].n, (size_t)((j - i) * gap_us * bw_units_per_us)) : 0;
                    }
                    npf = std::min(steps[j].n - from, (size_t)(v.short_k * c.us * bw_units_per_us));
                }
                int blocks = v.short_blocks ? v.short_blocks : n_sm;
                long long cyc = v.spin ? (long long)(c.us * cyc_per_us) : 0;
                timed_short_kernel<<<blocks, 256, 0, cs>>>(cyc, j < n ? buf + steps[j].off + from : buf, npf, v.stride, sink);
            }
        }
        CUDA_CHECK(cudaStreamEndCapture(cs, &g));
        double t = graph_ms(g, reps, cs) * 1e-3;
        report(v.name, t, bytes, copy);
    }
    printf("  (short steps' time in the list: %.3f ms a token; SM clock taken as %.0f MHz)\n", t_short * 1e-3, cyc_per_us);
}

int main(int argc, char **argv) {
    const char *shape = argc > 1 ? argv[1] : "27b-iq4_xs";
    if (!strcmp(shape, "sizes") || !strcmp(shape, "order")) {
        int dev, n_sm;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
        double copy = measure_copy_bandwidth();
        printf("copy bandwidth %.0f GB/s\n", copy / 1e9);
        if (shape[0] == 's') sizes(copy, n_sm);
        else order(copy, n_sm);
        return 0;
    }
    if (!strcmp(shape, "27b-iq4_xs")) build_27b(1);
    else if (!strcmp(shape, "27b-q4_0")) build_27b(0);
    else if (!strcmp(shape, "32b-iq4_xs")) build_32b(1);
    else if (!strcmp(shape, "32b-q4_0")) build_32b(0);
    else {
        fprintf(stderr, "usage: %s [27b-iq4_xs | 27b-q4_0 | 32b-iq4_xs | 32b-q4_0 [pf] | sizes | order]\n", argv[0]);
        return 2;
    }
    int n = n_steps, n_read = 0;
    for (int s = n - 1, next = -1; s >= 0; s--) {
        steps[s].next = next;
        if (steps[s].n) next = s, n_read++;
    }
    double bytes = 16.0 * units_total;

    int dev, n_sm;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    CUDA_CHECK(cudaEventCreate(&ev0));
    CUDA_CHECK(cudaEventCreate(&ev1));
    double copy = measure_copy_bandwidth();
    printf("%s, %d SMs; copy bandwidth (1 GiB device-to-device, read + write): %.0f GB/s\n", prop.name, n_sm, copy / 1e9);
    printf("shape %s: %d steps (%d reads, %d short), %.2f GB read per token\n", shape, n, n_read, n - n_read, bytes / 1e9);

    int4 *buf;
    int *sink;
    unsigned *count;
    Step *d_st;
    CUDA_CHECK(cudaMalloc(&buf, 16 * units_total));
    CUDA_CHECK(cudaMemset(buf, 0, 16 * units_total));
    CUDA_CHECK(cudaMalloc(&sink, 2 * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&count, sizeof(unsigned)));
    CUDA_CHECK(cudaMalloc(&d_st, n * sizeof(Step)));
    CUDA_CHECK(cudaMemcpy(d_st, steps, n * sizeof(Step), cudaMemcpyHostToDevice));
    const int reps = 20, read_grid = 8 * n_sm;

    // stream: every byte in one launch
    for (int r = -1; r < reps; r++) {
        if (r == 0) tic();
        read_kernel<<<read_grid, 256>>>(buf, units_total, sink);
    }
    CUDA_CHECK(cudaGetLastError());
    report("stream (one read, no steps)", toc(reps), bytes, copy);

    // graph: one launch per step, all captured in one graph
    cudaStream_t cs;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    for (int only_short = 0; only_short < 2; only_short++) {
        cudaGraph_t g;
        CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
        for (int s = 0; s < n; s++) {
            if (steps[s].n && !only_short) read_kernel<<<read_grid, 256, 0, cs>>>(buf + steps[s].off, steps[s].n, sink);
            else short_kernel<<<1, 32, 0, cs>>>(sink);
        }
        CUDA_CHECK(cudaStreamEndCapture(cs, &g));
        double t = graph_ms(g, reps, cs) * 1e-3; // graph_ms destroys g
        if (only_short) printf("  graph of %d empty launches: %.2f us per launch\n", n, 1e6 * t / n);
        else report("graph (one launch per step)", t, bytes, copy);
    }

    if (argc > 2 && !strcmp(argv[2], "pf")) {
        int clock_khz;
        CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
        prefetch_mode(buf, units_total, sink, copy, n_sm, clock_khz, n);
        return 0;
    }

    // barrier / prefetch: one persistent kernel per token, 1..4 blocks of 256 threads per SM
    int occ;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, token_kernel<8>, 256, 0));
    for (int per_sm = 1; per_sm <= 4 && per_sm <= occ; per_sm *= 2) {
        int grid = per_sm * n_sm;
        char what[96];
        // barriers alone: every step short
        {
            Step *d_e;
            CUDA_CHECK(cudaMalloc(&d_e, n * sizeof(Step)));
            CUDA_CHECK(cudaMemset(d_e, 0, n * sizeof(Step))); // n = 0: short
            double t = run_token_kernel<0>(buf, d_e, n, count, sink, grid, 0, reps);
            printf("  %d blocks/SM: %d grid barriers alone: %.2f us per barrier\n", per_sm, n, 1e6 * t / n);
            CUDA_CHECK(cudaFree(d_e));
        }
        snprintf(what, sizeof what, "barrier, %d blocks/SM", per_sm);
        report(what, run_token_kernel<0>(buf, d_st, n, count, sink, grid, 0, reps), bytes, copy);
        for (int pf0 = 0; pf0 < 2; pf0++) {
            snprintf(what, sizeof what, "prefetch 4 units, %d blocks/SM%s", per_sm, pf0 ? ", warp 0 too" : "");
            report(what, run_token_kernel<4>(buf, d_st, n, count, sink, grid, pf0, reps), bytes, copy);
            snprintf(what, sizeof what, "prefetch 8 units, %d blocks/SM%s", per_sm, pf0 ? ", warp 0 too" : "");
            report(what, run_token_kernel<8>(buf, d_st, n, count, sink, grid, pf0, reps), bytes, copy);
        }
    }
    int h_sink[2];
    CUDA_CHECK(cudaMemcpy(h_sink, sink, sizeof h_sink, cudaMemcpyDeviceToHost));
    printf("(sink %d)\n", h_sink[0]);
    return 0;
}
