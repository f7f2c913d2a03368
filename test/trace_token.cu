// trace_token.cu — a per-warp timeline of one decode token.
//
// Every warp of every decode kernel logs two times on the GPU's global timer (%globaltimer, ns):
// when it starts and when it ends. The token's graph is replayed once with the log on, and the
// warps are grouped into launches by time: a launch's first warp starts only after every warp of
// the launch before it has ended (one stream, no overlap). For each launch:
//
//   gap    from the last warp of the launch before to the first warp of this one (launch latency)
//   span   from its first warp's start to its last warp's end
//   ramp   from its first warp's start to the start of the warp at the 90th percentile (waves)
//   tail   from the median warp's end to the last warp's end (the warps that finish late)
//   marks  where a kernel has KERNEL_MARK(i) points: when its warps passed them (mean, latest)
//
// and the same averaged per kind of launch (kernel and grid). This is what showed that two
// resident blocks of the streaming mat-vec are not served alike (test/PERF_NOTES.md run 17).
//
// The log costs one atomic per warp, issued when the warp starts, and one store when it ends; the
// traced token is 5-7 % slower than the plain one (both are printed).
//
//   make test/trace_token && test/trace_token -m model.gguf [-c 128] [--dump warps.csv]
//   (GPU only; not part of make test; --dump writes every warp of the token: launch, kernel,
//   block, warp in block, SM, start and end in ns)

// Each warp's lane 0 records (start, end, kernel, SM, block, warp) into a log of its SM; the slot
// is taken by an atomic at the start so that the end waits on nothing.
typedef struct {
    unsigned long long t0, t1;
    unsigned kind, sm, block, warp;
    unsigned mark[8]; // KERNEL_MARK(i): ns from t0 when the warp passed point i (last pass), 0: never
} WarpRec;
#define TRACE_CAP 200000                // records per SM
__constant__ WarpRec *c_trace;          // (n_sm, TRACE_CAP) or NULL: not logging
__device__ unsigned d_trace_count[256 * 32]; // per SM, one 128-byte line each

__device__ __forceinline__ unsigned long long global_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned sm_index(void) {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
struct WarpTrace {
    unsigned long long t0;
    unsigned kind, sm, slot, mark[8];
    __device__ WarpTrace(unsigned k) : kind(k) {
        t0 = global_ns();
        sm = sm_index();
        slot = threadIdx.x % 32 == 0 ? atomicAdd(&d_trace_count[sm * 32], 1) : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) mark[i] = 0;
    }
    __device__ void at(int i) { mark[i - 1] = (unsigned)(global_ns() - t0); }
    __device__ ~WarpTrace() {
        if (threadIdx.x % 32 == 0 && c_trace && slot < TRACE_CAP) {
            WarpRec r = {t0, global_ns(), kind, sm, blockIdx.x, threadIdx.x / 32, {0}};
#pragma unroll
            for (int i = 0; i < 8; i++) r.mark[i] = mark[i];
            c_trace[(size_t)sm * TRACE_CAP + slot] = r;
        }
    }
};
#define KERNEL_TRACE(id) WarpTrace warp_trace_(id)
#define KERNEL_MARK(i) warp_trace_.at(i)

#define TESTING
#include "../qwen.cu"

static const char *kernel_name(unsigned k) {
    static const char *names[] = {"?", "mv stream", "mv blocks", "mv batch", "rmsnorm", "rope angles",
                                  "attention", "gdn token", "silu*up"};
    return k < sizeof names / sizeof names[0] ? names[k] : "?";
}

typedef struct {
    unsigned kind;
    int warps;
    double gap, span, ramp, tail; // ns
    double mk[8], mk_max[8];      // KERNEL_MARK(i): mean and latest time a warp passed it, from the launch's start
    int mk_n[8];                  // warps that passed it
} Launch;

static int by_start(const void *a, const void *b) {
    unsigned long long x = ((const WarpRec *)a)->t0, y = ((const WarpRec *)b)->t0;
    return x < y ? -1 : x > y;
}
static int by_value(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *path = NULL, *dump = NULL;
    int ctx = 128;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else die("usage: test/trace_token -m model.gguf [-c context] [--dump warps.csv]");
    }
    if (!path) die("usage: test/trace_token -m model.gguf [-c context] [--dump warps.csv]");
    if (ctx < 1) die("-c %d: the context must be at least 1", ctx);
    if (!gpu_available()) die("trace_token needs a CUDA GPU");

    Model m;
    model_open(&m, path);
    if (ctx + 1 > m.c.n_ctx_train) die("-c %d: above the model's context %d", ctx, m.c.n_ctx_train);
    GpuState s;
    gpu_state_init(&s, &m, ctx + 1);
    upload_weights(&m, &s);
    // the KV cache holds random values, as in --bench: the token attends to ctx earlier positions
    size_t cache = (size_t)m.c.n_kv_layers * (ctx + 1) * m.c.n_head_kv * m.c.head_dim;
    fill_random_half_kernel<<<1024, 256, 0, s.stream>>>(s.key_cache, cache, 1);
    fill_random_half_kernel<<<1024, 256, 0, s.stream>>>(s.value_cache, cache, 2);
    KERNEL_CHECK();
    embed_token(&m, 0, s.h_x);
    *s.h_pos = ctx;
    gpu_capture(&m, &s);

    int dev, n_sm;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    if (n_sm > 256) die("more than 256 SMs: raise d_trace_count");
    // the token's time with the log's atomics but no stores, then one token logged
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 5; i++) CUDA_CHECK(cudaGraphLaunch(s.graph, s.stream));
    CUDA_CHECK(cudaEventRecord(e0, s.stream));
    for (int i = 0; i < 50; i++) CUDA_CHECK(cudaGraphLaunch(s.graph, s.stream));
    CUDA_CHECK(cudaEventRecord(e1, s.stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= 50;
    WarpRec *log;
    CUDA_CHECK(cudaMalloc(&log, (size_t)n_sm * TRACE_CAP * sizeof(WarpRec)));
    unsigned *count;
    CUDA_CHECK(cudaGetSymbolAddress((void **)&count, d_trace_count));
    CUDA_CHECK(cudaMemcpyToSymbol(c_trace, &log, sizeof log));
    CUDA_CHECK(cudaGraphLaunch(s.graph, s.stream)); // a warm-up with the stores on
    CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof d_trace_count, s.stream));
    CUDA_CHECK(cudaGraphLaunch(s.graph, s.stream));
    CUDA_CHECK(cudaStreamSynchronize(s.stream));
    WarpRec *none = NULL;
    CUDA_CHECK(cudaMemcpyToSymbol(c_trace, &none, sizeof none));

    unsigned *n = (unsigned *)xmalloc(sizeof d_trace_count);
    CUDA_CHECK(cudaMemcpy(n, count, sizeof d_trace_count, cudaMemcpyDeviceToHost));
    size_t nr = 0;
    for (int i = 0; i < n_sm; i++) {
        if (n[i * 32] > TRACE_CAP) die("SM %d logged %u warps, more than %d: raise TRACE_CAP", i, n[i * 32], TRACE_CAP);
        nr += n[i * 32];
    }
    if (nr == 0) die("no warp was logged");
    WarpRec *r = (WarpRec *)xmalloc(nr * sizeof(WarpRec));
    for (int i = 0, k = 0; i < n_sm; k += n[i * 32], i++)
        CUDA_CHECK(cudaMemcpy(r + k, log + (size_t)i * TRACE_CAP, n[i * 32] * sizeof(WarpRec), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(log));
    qsort(r, nr, sizeof(WarpRec), by_start);
    unsigned long long origin = r[0].t0;

    FILE *df = NULL;
    if (dump) {
        df = fopen(dump, "w");
        if (!df) die("cannot write %s: %s", dump, strerror(errno));
        fprintf(df, "launch,kernel,block,warp,sm,start_ns,end_ns\n");
    }
    // group into launches (r is sorted by start, so each launch's starts are too)
    Launch *L = (Launch *)xmalloc(nr * sizeof(Launch));
    unsigned long long *t1 = (unsigned long long *)xmalloc(nr * sizeof *t1), prev_end = 0;
    size_t nl = 0;
    for (size_t i0 = 0; i0 < nr;) {
        size_t i1 = i0 + 1;
        unsigned long long end = r[i0].t1;
        while (i1 < nr && r[i1].t0 <= end) {
            if (r[i1].t1 > end) end = r[i1].t1;
            i1++;
        }
        int nw = (int)(i1 - i0);
        for (int j = 0; j < nw; j++) {
            const WarpRec *w = &r[i0 + j];
            t1[j] = w->t1;
            if (w->kind != r[i0].kind) die("launch %zu mixes kernels: the grouping by time failed", nl);
            if (df)
                fprintf(df, "%zu,%s,%u,%u,%u,%llu,%llu\n", nl, kernel_name(w->kind), w->block, w->warp, w->sm,
                        w->t0 - origin, w->t1 - origin);
        }
        qsort(t1, nw, sizeof *t1, by_value);
        Launch l = {r[i0].kind, nw, nl ? (double)(r[i0].t0 - prev_end) : 0.0, (double)(end - r[i0].t0),
                    (double)(r[i0 + nw * 9 / 10].t0 - r[i0].t0), (double)(end - t1[nw / 2]), {0}, {0}, {0}};
        for (int j = 0; j < nw; j++)
            for (int k = 0; k < 8; k++) {
                const WarpRec *w = &r[i0 + j];
                if (!w->mark[k]) continue;
                double t = (double)(w->t0 + w->mark[k] - r[i0].t0);
                l.mk[k] += t;
                l.mk_n[k]++;
                if (t > l.mk_max[k]) l.mk_max[k] = t;
            }
        for (int k = 0; k < 8; k++)
            if (l.mk_n[k]) l.mk[k] /= l.mk_n[k];
        L[nl++] = l;
        prev_end = end;
        i0 = i1;
    }
    if (df) fclose(df);

    printf("%s, context %d: %.3f ms a token with the log's atomics (graph replays), %zu warps in %zu launches\n", path,
           ctx, ms, nr, nl);
    printf("logged token: first start to last end %.1f us\n\n", (prev_end - origin) / 1e3);
    printf("  by kind (us, means over its launches; first: its first launch in the token)\n");
    printf("  %-12s %6s %6s %6s %8s %9s %8s %8s %10s %10s\n", "kernel", "warps", "first", "calls", "gap", "span", "ramp90",
           "tail50", "sum gap", "sum span");
    int *seen = (int *)calloc(nl, sizeof *seen);
    double gaps = 0, spans = 0;
    for (size_t i = 0; i < nl; i++) {
        gaps += L[i].gap;
        spans += L[i].span;
        if (seen[i]) continue;
        int calls = 0;
        double g = 0, sp = 0, ra = 0, ta = 0, mk[8] = {0}, mk_max[8] = {0}, mk_n[8] = {0};
        for (size_t j = i; j < nl; j++)
            if (!seen[j] && L[j].kind == L[i].kind && L[j].warps == L[i].warps) {
                seen[j] = 1;
                calls++;
                g += L[j].gap;
                sp += L[j].span;
                ra += L[j].ramp;
                ta += L[j].tail;
                for (int k = 0; k < 8; k++) {
                    mk[k] += L[j].mk[k];
                    mk_max[k] += L[j].mk_max[k];
                    mk_n[k] += L[j].mk_n[k];
                }
            }
        printf("  %-12s %6d %6zu %6d %8.2f %9.2f %8.2f %8.2f %10.1f %10.1f\n", kernel_name(L[i].kind), L[i].warps, i, calls,
               g / calls / 1e3, sp / calls / 1e3, ra / calls / 1e3, ta / calls / 1e3, g / 1e3, sp / 1e3);
        for (int k = 0; k < 8; k++) // the marks: mean over the warps that passed / the latest, warps per launch
            if (mk_n[k])
                printf("  %14s mark %d: %7.2f mean %7.2f latest (%.0f warps)\n", "", k + 1, mk[k] / calls / 1e3,
                       mk_max[k] / calls / 1e3, mk_n[k] / calls);
    }
    printf("  %-12s %6s %6s %6zu %8s %9s %8s %8s %10.1f %10.1f\n", "all", "", "", nl, "", "", "", "", gaps / 1e3,
           spans / 1e3);
    free(n);
    free(r);
    free(L);
    free(t1);
    free(seen);
    gpu_state_free(&s);
    gguf_close(&m.gguf);
    return 0;
}
