// graph_ms.h — one helper of the measurement tools (test/bench.cu, test/step_floor.cu), which
// include qwen.cu first.

// Milliseconds per replay of a captured graph: instantiated, replayed once to warm up, then reps
// times between two events. The graph is destroyed.
static float graph_ms(cudaGraph_t graph, int reps, cudaStream_t st) {
    cudaGraphExec_t exec;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    CUDA_CHECK(cudaGraphLaunch(exec, st));
    CUDA_CHECK(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; r++) CUDA_CHECK(cudaGraphLaunch(exec, st));
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms / reps;
}
