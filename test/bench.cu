// bench.cu — the measurements behind qwen.cu's choices, on a GPU (make bench; not part of make test).
//
//   test/bench -m model.gguf [-c N] [-s]
//
// It includes qwen.cu and runs, on the same uploaded model:
//   1. qwen --bench's decode table (contexts 128 and 2048) against the copy bandwidth;
//   2. a read-only stream over 1 GiB: the ceiling a read-only kernel reaches, beside the copy;
//   3. the attention alone at 128 and 2048 keys;
//   4. per kernel, one decode token: every kernel launch of the token's graph run on its own
//      between two CUDA events, summed by kernel (template arguments name the variant);
//   5. the mat-vecs alone, per kind (gate/up, down, DeltaNet projections, ...): GB/s and % of copy;
//   6. the launches between the mat-vecs alone, per kind (RMSNorm, the DeltaNet token kernels);
//   7. each fast type's mat-vec against its size, with a straight-line fit t = t0 + bytes / B;
//   8. qwen --bench's pp512, and per kernel, one 512-token batched pass;
//   9. each kind of mat-vec launch under every block shape of the two fast kernels (-s: this
//      table and the decode table only).
// The tables of 4 and 8 take their launches from a capture of the engine's own enqueue functions
// (forward_gpu_enqueue, forward_gpu_batch_enqueue), so they time exactly what the engine runs.
#define TESTING
#include "../qwen.cu"
#include "graph_ms.h"
#if CUDART_VERSION >= 12030
#include <cxxabi.h>
#endif

// The ceiling a read-only kernel can reach, next to the copy bandwidth: every thread streams
// 16-byte loads, 4 in flight, and folds them into one word it (as good as) never writes.
__global__ void read_stream_kernel(const int4 *p /* (n) */, size_t n, int *sink) {
    int acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        int4 v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = i + k * stride < n ? p[i + k * stride] : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < 4; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (acc == 0x5a17c3e9) *sink = acc; // keeps the loads
}

static void bench_read_stream(double copy_bw) {
    size_t n = 1ull << 30;
    void *a;
    int *sink;
    CUDA_CHECK(cudaMalloc(&a, n));
    CUDA_CHECK(cudaMalloc(&sink, 4));
    CUDA_CHECK(cudaMemset(a, 1, n));
    int dev, n_sm;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float ms[10];
    for (int i = -1; i < 10; i++) { // the first run warms up
        CUDA_CHECK(cudaEventRecord(e0));
        read_stream_kernel<<<8 * n_sm, 256>>>((const int4 *)a, n / 16, sink);
        CUDA_CHECK(cudaEventRecord(e1));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (i >= 0) CUDA_CHECK(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    qsort(ms, 10, sizeof ms[0], cmp_float);
    double bw = n / (ms[5] * 1e-3);
    printf("\nread-only stream over 1 GiB (16-byte loads): %.0f GB/s = %.1f %% of copy\n", bw / 1e9,
           100.0 * bw / copy_bw);
    cudaFree(a);
    cudaFree(sink);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// A kernel's name, template arguments included, without its parameter list.
static void kernel_name(const void *func, char *buf, size_t cap) {
    snprintf(buf, cap, "kernel %p", func);
#if CUDART_VERSION >= 12030
    const char *mangled = NULL;
    if (cudaFuncGetName(&mangled, func) != cudaSuccess || !mangled) return;
    int status = 0;
    char *name = abi::__cxa_demangle(mangled, NULL, NULL, &status);
    const char *s = status == 0 && name ? name : mangled;
    if (!strncmp(s, "void ", 5)) s += 5;
    snprintf(buf, cap, "%s", s);
    int depth = 0; // cut at the parameter list: the first '(' outside template arguments
    for (char *p = buf; *p; p++) {
        if (*p == '<') depth++;
        else if (*p == '>') depth--;
        else if (*p == '(' && depth == 0) { *p = 0; break; }
    }
    free(name);
#endif
}

// Per kernel: every kernel node of a captured graph (a stream capture adds them in launch order)
// launched on its own between two events, with the node's own arguments, grid and shared memory;
// the rows sum the launches by kernel. The graph is destroyed.
static void per_kernel_table(cudaGraph_t graph, cudaStream_t st, const char *title) {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &n));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)xmalloc(n * sizeof *nodes, "the bench");
    CUDA_CHECK(cudaGraphGetNodes(graph, nodes, &n));
    typedef struct { const void *func; int calls; double ms; } Row;
    Row rows[64];
    int nr = 0, launches = 0;
    double total = 0;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int pass = 0; pass < 2; pass++) // the first pass warms up
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType type;
            CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
            if (type != cudaGraphNodeTypeKernel) continue;
            cudaKernelNodeParams p;
            CUDA_CHECK(cudaGraphKernelNodeGetParams(nodes[i], &p));
            CUDA_CHECK(cudaEventRecord(e0, st));
            CUDA_CHECK(cudaLaunchKernel(p.func, p.gridDim, p.blockDim, p.kernelParams,
                                        p.sharedMemBytes, st));
            CUDA_CHECK(cudaEventRecord(e1, st));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float ms;
            CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (pass == 0) continue;
            int r = 0;
            while (r < nr && rows[r].func != p.func) r++;
            if (r == nr) {
                if (nr == 64) continue;
                rows[nr++] = (Row){p.func, 0, 0};
            }
            rows[r].calls++;
            rows[r].ms += ms;
            total += ms;
            launches++;
        }
    printf("\nper kernel, %s (each launch alone between two events):\n", title);
    printf("  %-56s %6s %10s %7s\n", "kernel", "calls", "us", "share");
    for (int r = 0; r < nr; r++) {
        char name[256];
        kernel_name(rows[r].func, name, sizeof name);
        printf("  %-56.56s %6d %10.1f %6.1f%%\n", name, rows[r].calls, rows[r].ms * 1e3,
               100.0 * rows[r].ms / total);
    }
    printf("  %-56s %6d %10.1f\n", "sum", launches, total * 1e3);
    free(nodes);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    CUDA_CHECK(cudaGraphDestroy(graph));
}

// The mat-vecs alone, per kind: one graph holds the kind's launches for every layer back to back
// (different weights each time, so nothing is served from L2), replayed 5 times. No event sits
// between the launches, so this is what each kernel streams inside the forward graph, launch gaps
// included. Outputs go to scratch buffers; the inputs are whatever the last pass left.
static void bench_matvecs(const Model *m, GpuState *s, double copy_bw) {
    const char *kinds[] = {"ffn_gate_up", "ffn_down", "gdn_proj", "gdn_out", "attn_qkv",
                           "attn_output", "output"};
    cudaStream_t st = s->stream;
    printf("\nmat-vecs alone, each kind over all its layers in one graph (launch gaps included):\n");
    printf("  %-12s %6s %12s %9s %9s %7s\n", "kind", "calls", "bytes/call", "us/call", "GB/s",
           "% copy");
    for (int k = 0; k < 7; k++) {
        double bytes = 0;
        int calls = 0;
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < (k == 6 ? 1 : m->c.n_layer); l++) {
            const LayerWeights *L = &m->w.layers[l];
            int gdn = m->c.kind[l] == LAYER_DELTANET;
            if (k == 0) {
                ffn_gate_up(&L->w_gate, &L->w_up, &s->xb, &s->hb, s->hb2, st);
                bytes += L->w_gate.nbytes + L->w_up.nbytes;
            } else if (k == 1) {
                matvec(&L->w_down, &s->hb, s->hb2, NULL, 0, st);
                bytes += L->w_down.nbytes;
            } else if (k == 2 && gdn) {
                const Tensor *W[4] = {&L->wqkv, &L->wz, &L->w_beta, &L->w_alpha};
                const float *nob[4] = {NULL, NULL, NULL, NULL};
                float *y[4] = {s->gdn_mixed, s->gdn_z, s->gdn_beta, s->gdn_alpha};
                matvec_batch(4, W, nob, y, &s->xb, st);
                bytes += L->wqkv.nbytes + L->wz.nbytes + L->w_beta.nbytes + L->w_alpha.nbytes;
            } else if (k == 3 && gdn) {
                matvec(&L->ssm_out, &s->gdn_out, s->hb2, NULL, 0, st);
                bytes += L->ssm_out.nbytes;
            } else if (k == 4 && !gdn) {
                matvec_qkv(&L->wq, &L->wk, &L->wv, DEV(L->bq), DEV(L->bk), DEV(L->bv), &s->xb,
                           m->c.arch == ARCH_QWEN35 ? s->qg : s->q, s->k, s->v, st);
                bytes += L->wq.nbytes + L->wk.nbytes + L->wv.nbytes;
            } else if (k == 5 && !gdn) {
                matvec(&L->wo, &s->att_out, s->hb2, NULL, 0, st);
                bytes += L->wo.nbytes;
            } else if (k == 6) {
                matvec(&m->w.output, &s->xb, s->logits, DEV(m->w.output_bias), 0, st);
                bytes += m->w.output.nbytes;
            } else continue;
            calls++;
        }
        CUDA_CHECK(cudaStreamEndCapture(st, &graph));
        if (calls == 0) {
            CUDA_CHECK(cudaGraphDestroy(graph));
            continue;
        }
        double t = graph_ms(graph, 5, st) * 1e-3 / calls;
        printf("  %-12s %6d %12.0f %9.1f %9.0f %6.1f%%\n", kinds[k], calls, bytes / calls, t * 1e6,
               bytes / calls / t / 1e9, 100.0 * bytes / calls / t / copy_bw);
    }
}

// The launches between the mat-vecs, per kind: one graph holds the kind's launches for every layer
// (the RMSNorms: all 2 x layers + 1 of a token; gdn_token is what a DeltaNet layer runs, the three
// before it the path for state sizes above 128), replayed 5 times. What each costs inside the
// forward graph, launch gap included: the price of a launch that a fold into a neighbour removes.
static void bench_small_kernels(const Model *m, GpuState *s) {
    const Config *c = &m->c;
    const char *kinds[] = {"rmsnorm", "gdn_conv", "gdn_step", "gdn_norm", "gdn_token"};
    cudaStream_t st = s->stream;
    int E = c->n_embd, S = c->ssm_state, Hk = c->ssm_k_heads, Hv = c->ssm_v_heads;
    printf("\nthe other launches alone, each kind over all its layers in one graph:\n");
    printf("  %-12s %6s %9s\n", "kind", "calls", "us/call");
    for (int k = 0; k < 5; k++) {
        int calls = 0;
        cudaGraph_t graph;
        if (k == 4 && !gdn_token_ok(S)) continue;
        CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < c->n_layer; l++) {
            const LayerWeights *L = &m->w.layers[l];
            if (k == 0) {
                rmsnorm_quant(&s->xb, s->x, DEV(L->attn_norm), E, c->eps, st);
                rmsnorm_quant(&s->xb, s->x, DEV(L->ffn_norm), E, c->eps, st);
                if (l == c->n_layer - 1)
                    rmsnorm_quant(&s->xb, s->x, DEV(m->w.output_norm), E, c->eps, st);
                calls += 2 + (l == c->n_layer - 1);
                continue;
            }
            if (c->kind[l] != LAYER_DELTANET) continue;
            float *cs = gdn_conv_state(c, s, l), *state = gdn_ssm_state(c, s, l);
            if (k == 1) {
                gdn_conv_norm_kernel<<<2 * Hk + Hv, S, 0, st>>>(
                    s->gdn_mixed, DEV(L->conv1d), cs, s->gdn_beta, s->gdn_alpha, DEV(L->dt_bias),
                    DEV(L->ssm_a), s->gdn_gb, Hk, Hv, c->eps);
                KERNEL_CHECK();
            } else if (k == 2) {
                gdn_step(state, s->gdn_mixed, s->gdn_gb, s->gdn_raw, S, Hk, Hv, 1, st);
            } else if (k == 3) {
                gdn_gated_norm_kernel<<<Hv, S, 0, st>>>(s->gdn_out, s->gdn_raw, s->gdn_z,
                                                       DEV(L->ssm_norm), c->eps);
                KERNEL_CHECK();
            } else {
                gdn_token(state, cs, s->gdn_mixed, DEV(L->conv1d), s->gdn_z, s->gdn_beta,
                          s->gdn_alpha, DEV(L->dt_bias), DEV(L->ssm_a), DEV(L->ssm_norm),
                          &s->gdn_out, s->gdn_count, S, Hk, Hv, c->eps, st);
            }
            calls++;
        }
        CUDA_CHECK(cudaStreamEndCapture(st, &graph));
        if (calls == 0) {
            CUDA_CHECK(cudaGraphDestroy(graph));
            continue;
        }
        printf("  %-12s %6d %9.2f\n", kinds[k], calls, graph_ms(graph, 5, st) * 1e3 / calls);
    }
}

// One fast type's mat-vec against its size: K launches in one graph over K different matrices of
// S bytes each (n_in = the model's width, rows as many as fit), for S from 8 MB to 1 GiB, through
// the kernel the engine picks (matvec) and through the streaming kernel for every size. A straight
// line t(S) = t0 + S / B through the points separates what a launch costs whatever its size (t0:
// the ramp of its first loads, its tail, the gap to the next launch) from the rate it streams at
// once under way (B): what a kernel that kept the weights flowing across launches could win.
static void bench_matvec_sizes(const Model *m, GpuState *s, int type, double copy_bw) {
    const double MB = 1 << 20;
    const int sizes[] = {8, 16, 32, 64, 128, 256, 1024}, n_sizes = 7;
    int E = m->c.n_embd;
    size_t rb = row_bytes(type, E), fr, tot;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    size_t buf_bytes = 2048 * (size_t)MB;
    if (fr < buf_bytes + 512 * (size_t)MB)
        buf_bytes = fr > 768 * (size_t)MB ? fr - 512 * (size_t)MB : 0;
    if (buf_bytes < 256 * (size_t)MB) {
        printf("\n%s mat-vec against its size: skipped (%.0f MB free)\n", type_name(type), fr / MB);
        return;
    }
    uint8_t *buf; // (buf_bytes) the matrices one after the other; their values do not matter here
    float *y;     // (rows of the largest) outputs
    CUDA_CHECK(cudaMalloc(&buf, buf_bytes));
    CUDA_CHECK(cudaMemset(buf, 0x11, buf_bytes));
    CUDA_CHECK(cudaMalloc(&y, buf_bytes / rb * sizeof(float) + 256));
    cudaStream_t st = s->stream;
    printf("\n%s mat-vec against its size (%d inputs; K launches over K matrices in one graph):\n",
           type_name(type), E);
    printf("  %9s %5s   %-22s   %-22s\n", "MB/call", "K", "engine's kernel us  %copy",
           "streaming us  %copy");
    double sx = 0, sy[2] = {0, 0}, sxx = 0, sxy[2] = {0, 0};
    int np = 0;
    for (int i = 0; i < n_sizes; i++) {
        int64_t rows = (int64_t)(sizes[i] * MB / rb) / 32 * 32;
        size_t bytes = (size_t)rows * rb, stride = ALIGN256(bytes);
        int K = (int)(buf_bytes / stride);
        if (K > 128) K = 128;
        if (K < 1 || (size_t)(E / 32) * rows > UINT32_MAX) continue;
        double t[2];
        for (int k = 0; k < 2; k++) {
            cudaGraph_t graph;
            CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int j = 0; j < K; j++) {
                Tensor W;
                memset(&W, 0, sizeof W);
                W.name = "sweep";
                W.type = type;
                W.n_in = E;
                W.n_out = rows;
                W.nbytes = bytes;
                W.dev = buf + (size_t)j * stride;
                W.planes = 1;
                if (k == 0) {
                    matvec(&W, &s->xb, y, NULL, 0, st);
                } else {
                    MvPlan p;
                    memset(&p, 0, sizeof p);
                    mv_plan_add(&p, &W, NULL, y);
                    matvec_stream(&p, s->xb.q, E, st);
                }
            }
            CUDA_CHECK(cudaStreamEndCapture(st, &graph));
            t[k] = graph_ms(graph, 3, st) * 1e-3 / K;
            sy[k] += t[k];
            sxy[k] += bytes * t[k];
        }
        sx += bytes;
        sxx += (double)bytes * bytes;
        np++;
        printf("  %9.1f %5d   %9.1f  %8.1f %%   %9.1f  %6.1f %%\n", bytes / MB, K, t[0] * 1e6,
               100.0 * bytes / t[0] / copy_bw, t[1] * 1e6, 100.0 * bytes / t[1] / copy_bw);
    }
    for (int k = 0; k < 2 && np >= 2; k++) { // least squares t = t0 + bytes / B
        double slope = (np * sxy[k] - sx * sy[k]) / (np * sxx - sx * sx);
        double t0 = (sy[k] - slope * sx) / np;
        printf("  fit, %s: t0 = %.1f us per launch, B = %.0f GB/s = %.1f %% of copy\n",
               k == 0 ? "engine's kernel" : "streaming kernel", t0 * 1e6, 1e-9 / slope,
               100.0 / slope / copy_bw);
    }
    cudaFree(buf);
    cudaFree(y);
}

// Every block shape the two fast kernels offer, per kind of mat-vec launch (the kinds of the
// table above: attn_qkv, attn_output, ffn_gate_up, ffn_down, gdn_proj, gdn_out, output), each over
// all its layers in one graph with the model's own weights, as bench_matvecs times the engine's
// choice. The weights' bytes are read as they lie: a variant whose order of the planes differs
// from the upload's reads other values (wrong sums, same bytes and the same pattern of addresses),
// which is all a timing needs. Variants:
//   engine        what the engine launches (matvec, matvec_batch)
//   blk R=4 LF    per-block kernel, 4 rows a block, loads first (one launch per matrix)
//   blk R=8       per-block kernel, 8 rows, no barrier
//   blk R=8 LF    per-block kernel, 8 rows, loads first
//   blk batch     the per-block batch kernel (one launch for all the matrices, 8 rows LF)
//   str T rows    streaming kernel, T threads a block, planes row by row
//   str T step    streaming kernel, T threads a block, planes in that launch's step order
// The mixed launches take the MIX_FOUR / MIX_ALL kernels at 256 and 512 threads, as the engine
// can; a launch whose rows are not whole chunks has no step order.
typedef struct {
    int n;
    const Tensor *W[BATCH_MAX];
    float *y[BATCH_MAX];
} ShapeLaunch;

// The kind's launch for layer l (n = 0: none in this layer).
static ShapeLaunch shape_launch(const Model *m, GpuState *s, int kind, int l) {
    ShapeLaunch a;
    memset(&a, 0, sizeof a);
    const LayerWeights *L = &m->w.layers[l];
    int gdn = m->c.kind[l] == LAYER_DELTANET;
    float *q = m->c.arch == ARCH_QWEN35 ? s->qg : s->q;
    if (kind == 0 && !gdn) a = (ShapeLaunch){3, {&L->wq, &L->wk, &L->wv}, {q, s->k, s->v}};
    if (kind == 1 && !gdn) a = (ShapeLaunch){1, {&L->wo}, {s->hb2}};
    if (kind == 2) a = (ShapeLaunch){2, {&L->w_gate, &L->w_up}, {s->hb.f, s->hb2}};
    if (kind == 3) a = (ShapeLaunch){1, {&L->w_down}, {s->hb2}};
    if (kind == 4 && gdn)
        a = (ShapeLaunch){4, {&L->wqkv, &L->wz, &L->w_beta, &L->w_alpha},
                          {s->gdn_mixed, s->gdn_z, s->gdn_beta, s->gdn_alpha}};
    if (kind == 5 && gdn) a = (ShapeLaunch){1, {&L->ssm_out}, {s->hb2}};
    if (kind == 6 && l == 0) a = (ShapeLaunch){1, {&m->w.output}, {s->logits}};
    for (int i = 0; i < a.n; i++)
        if (!a.W[i]->planes) a.n = 0; // float weights: not the fast kernels
    return a;
}

// Launch one variant (v, the list above) of launch a; returns 0 where the variant does not apply.
static int shape_variant(const ShapeLaunch &a, int v, const Act *in, cudaStream_t st) {
    int n_sub = (int)a.W[0]->n_in / 32;
    const XQ &xq = in->q;
    if (v == 0) { // the engine
        const float *nob[BATCH_MAX] = {NULL, NULL, NULL, NULL};
        if (a.n == 1) matvec(a.W[0], in, a.y[0], NULL, 0, st);
        else matvec_batch(a.n, a.W, nob, a.y, in, st);
        return 1;
    }
    if (v <= 3) { // per-block, one launch per matrix
        for (int i = 0; i < a.n; i++) {
            const uint8_t *w = (const uint8_t *)a.W[i]->dev;
            int n_out = (int)a.W[i]->n_out, R = v == 1 ? 4 : 8, threads = fast_threads(n_sub);
            int blocks = (n_out + R - 1) / R;
#define BLK(T)                                                                                     \
    if (v == 1) matvec_fast_kernel<T, 4, true><<<blocks, threads, 0, st>>>(w, xq, NULL, a.y[i],    \
                                                                           n_sub, n_out, 0);       \
    else if (v == 2) matvec_fast_kernel<T, 8, false><<<blocks, threads, 0, st>>>(                  \
        w, xq, NULL, a.y[i], n_sub, n_out, 0);                                                     \
    else matvec_fast_kernel<T, 8, true><<<blocks, threads, 0, st>>>(w, xq, NULL, a.y[i], n_sub,    \
                                                                    n_out, 0)
            FAST_TYPE_SWITCH(a.W[i]->type, BLK)
#undef BLK
            KERNEL_CHECK();
        }
        return 1;
    }
    if (v == 4) { // the per-block batch kernel
        if (a.n == 1) return 0;
        Tensor t[BATCH_MAX];
        const Tensor *W[BATCH_MAX];
        const float *nob[BATCH_MAX] = {NULL, NULL, NULL, NULL};
        for (int i = 0; i < a.n; i++) {
            t[i] = *a.W[i];
            t[i].so.upw = 0; // the batch kernel refuses planes in step order
            W[i] = &t[i];
        }
        matvec_blocks_batch(a.n, W, nob, a.y, xq, st);
        return 1;
    }
    // streaming: v = 5.. : threads {256, 512, 640} x {rows, step}
    int threads = v <= 6 ? 256 : v <= 8 ? 512 : MV_ONE_BLOCK, step = (v - 5) % 2;
    MvPlan p;
    memset(&p, 0, sizeof p);
    for (int i = 0; i < a.n; i++) {
        Tensor t = *a.W[i];
        t.so.upw = 0;
        mv_plan_add(&p, &t, NULL, a.y[i]);
        if (step && !step_order_fits(&t)) return 0;
    }
    int type = mv_plan_type(&p);
    if (type >= 0 && threads == 512) return 0;        // single types: 256 or MV_ONE_BLOCK
    if (type < 0 && (threads == 640 || (step && threads == 512))) return 0; // mixes: as built
    mv_plan_runs_at(&p, threads);
    if (step)
        for (int i = 0; i < p.n; i++)
            p.so[i] = StepOrder{p.upw, p.first_unit[i], p.first_unit[i + 1] - p.first_unit[i]};
    mv_launch(&p, xq, n_sub, threads, step, st);
    return 1;
}

static void bench_shapes(const Model *m, GpuState *s, double copy_bw) {
    const char *kinds[] = {"attn_qkv", "attn_output", "ffn_gate_up", "ffn_down", "gdn_proj",
                           "gdn_out", "output"};
    const char *vnames[] = {"engine", "blk R=4 LF", "blk R=8", "blk R=8 LF", "blk batch",
                            "str 256 rows", "str 256 step", "str 512 rows", "str 512 step",
                            "str 640 rows", "str 640 step"};
    const Act *ins[7] = {&s->xb, &s->att_out, &s->xb, &s->hb, &s->xb, &s->gdn_out, &s->xb};
    cudaStream_t st = s->stream;
    printf("\nmat-vecs under every block shape, each kind over all its layers in one graph:\n");
    printf("  %-12s %-14s %6s %9s %7s  %s\n", "kind", "variant", "calls", "us/call", "% copy",
           "types");
    for (int k = 0; k < 7; k++) {
        char types[64] = "";
        double bytes = 0;
        int layers = 0;
        for (int l = 0; l < m->c.n_layer; l++) {
            ShapeLaunch a = shape_launch(m, s, k, l);
            if (!a.n) continue;
            layers++;
            for (int i = 0; i < a.n; i++) bytes += a.W[i]->nbytes;
            if (!types[0])
                for (int i = 0; i < a.n; i++)
                    snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s",
                             i ? "," : "", type_name(a.W[i]->type));
        }
        if (!layers) continue;
        for (int v = 0; v < 11; v++) {
            int ok = 1;
            cudaGraph_t graph;
            CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < m->c.n_layer && ok; l++) {
                ShapeLaunch a = shape_launch(m, s, k, l);
                if (a.n) ok = shape_variant(a, v, ins[k], st);
            }
            CUDA_CHECK(cudaStreamEndCapture(st, &graph));
            if (!ok) {
                CUDA_CHECK(cudaGraphDestroy(graph));
                continue;
            }
            double t = graph_ms(graph, 5, st) * 1e-3 / layers;
            printf("  %-12s %-14s %6d %9.1f %6.1f%%  %s\n", kinds[k], vnames[v], layers, t * 1e6,
                   100.0 * bytes / layers / t / copy_bw, v == 0 ? types : "");
        }
    }
}

// The attention alone: every attention layer's launch in one graph, at contexts 128 and 2048
// (what the context adds to a token beyond its KV bytes is here).
static void bench_attention(const Model *m, GpuState *s) {
    const Config *c = &m->c;
    const int ctxs[2] = {128, 2048};
    cudaStream_t st = s->stream;
    int hd = c->head_dim, gated = c->arch == ARCH_QWEN35;
    size_t kvdim = (size_t)c->n_head_kv * hd;
    if (!c->n_kv_layers) return;
    printf("\nattention alone, its %d layers in one graph (%d kv heads x at most %d splits of "
           "%d-key chunks):\n", c->n_kv_layers, c->n_head_kv, s->n_split, att_chunk(hd));
    printf("  context  us/layer  KV bytes/layer   GB/s\n");
    for (int ci = 0; ci < 2; ci++) {
        int pos = ctxs[ci];
        CUDA_CHECK(cudaMemcpy(s->pos, &pos, 4, cudaMemcpyHostToDevice));
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < c->n_layer; l++) {
            if (c->kind[l] == LAYER_DELTANET) continue;
            size_t off = (size_t)c->kv_slot[l] * s->n_ctx * kvdim;
            attention(s->q, s->key_cache + off, s->value_cache + off, NULL, s->part_o, s->part_ml,
                      s->kv_done, &s->att_out, gated ? s->qg + hd : NULL, 2 * hd, s->pos,
                      c->n_head, c->n_head_kv, hd, s->n_split, st);
        }
        CUDA_CHECK(cudaStreamEndCapture(st, &graph));
        double t = graph_ms(graph, 10, st) * 1e-3 / c->n_kv_layers;
        double bytes = 2.0 * (pos + 1) * kvdim * 2;
        printf("  %7d  %8.2f  %14.0f  %6.0f\n", pos, t * 1e6, bytes, bytes / t / 1e9);
    }
}

int main(int argc, char **argv) {
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    const char *path = NULL;
    int n_ctx = 4096, shapes_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) n_ctx = arg_int("-c", argv[++i]);
        else if (!strcmp(argv[i], "-s")) shapes_only = 1;
        else die("usage: test/bench -m model.gguf [-c N] [-s]");
    }
    if (!path) die("usage: test/bench -m model.gguf [-c N] [-s]");
    if (!gpu_available()) die("test/bench needs a CUDA GPU");
    Model m;
    memset(&m, 0, sizeof m);
    if (gguf_open(&m.gguf, path) != 0) die("%s", m.gguf.err);
    model_load(&m);
    GpuState s;
    double copy_bw = bench_setup(&m, n_ctx < 2049 ? 2049 : n_ctx, &s); // decode at 2048 keys
    bench_decode(&m, &s, copy_bw);
    if (shapes_only) {
        bench_shapes(&m, &s, copy_bw);
        gpu_state_free(&s);
        gguf_close(&m.gguf);
        return 0;
    }
    bench_read_stream(copy_bw);
    bench_attention(&m, &s);

    // one decode token at context 2048 (the last the decode table set), launch by launch
    cudaGraph_t graph;
    CUDA_CHECK(cudaMemcpy(s.x, s.h_x, m.c.n_embd * 4u, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(s.pos, s.h_pos, 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    forward_gpu_enqueue(&m, &s);
    CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));
    per_kernel_table(graph, s.stream, "one decode token at context 2048");

    bench_matvecs(&m, &s, copy_bw);
    bench_small_kernels(&m, &s);
    bench_shapes(&m, &s, copy_bw);
    const LayerWeights *L0 = &m.w.layers[0]; // each fast type of layer 0 and of the output matrix
    int types[5] = {L0->w_gate.type, L0->w_down.type, m.w.output.type,
                    L0->wqkv.name ? L0->wqkv.type : L0->wq.type, L0->wv.name ? L0->wv.type : -1};
    int seen[5], n_seen = 0;
    for (int i = 0; i < 5; i++) {
        int dup = !is_fast_type(types[i]);
        for (int j = 0; j < n_seen; j++) dup |= seen[j] == types[i];
        if (!dup) bench_matvec_sizes(&m, &s, seen[n_seen++] = types[i], copy_bw);
    }

    bench_prefill(&m, &s);
    if (s.n_batch >= 512) { // one pp512 pass, launch by launch
        int toks[512];
        bench_prompt(&m, toks);
        forward_gpu_batch(&m, &s, toks, 512, 0); // the rows uploaded; the pass runs once
        CUDA_CHECK(cudaStreamSynchronize(s.stream));
        CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
        forward_gpu_batch_enqueue(&m, &s, 512, 0);
        batch_output_gpu(&m, &s, 511, 1);
        CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));
        per_kernel_table(graph, s.stream, "one pp512 pass");
    }
    gpu_state_free(&s);
    gguf_close(&m.gguf);
    return 0;
}
