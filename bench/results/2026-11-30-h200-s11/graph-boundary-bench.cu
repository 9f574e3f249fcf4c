// boundary costs between CUDA graphs on one stream: what a host-driven cycle pays per forward
#include <cstdio>
#include <cuda_runtime.h>
#include <chrono>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
__global__ void tiny(float *p, int i) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) p[blockIdx.x] += (float)i;
}
struct P { int n; int v[64]; int *dst; };
__global__ void pk(P q) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x < q.n) q.dst[threadIdx.x] = q.v[threadIdx.x];
}
static void launch_pdl(cudaStream_t s, dim3 g, dim3 b, void (*k)(float *, int), float *p, int i) {
    cudaLaunchAttribute a; a.id = cudaLaunchAttributeProgrammaticStreamSerialization; a.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {}; c.gridDim = g; c.blockDim = b; c.stream = s; c.attrs = &a; c.numAttrs = 1;
    cudaLaunchKernelEx(&c, k, p, i);
}
int main() {
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *p; CK(cudaMalloc(&p, 1 << 20)); int *d; CK(cudaMalloc(&d, 1 << 16));
    char *h; CK(cudaHostAlloc((void **)&h, 1 << 16, 0));
    const int NK = 20;
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < NK; i++) launch_pdl(s, 32, 128, tiny, p, i);
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t ev; cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    const int N = 2000;
    const char *names[] = {"graph only", "graph + H2D 256 B", "graph + H2D 8 KB", "graph + param kernel", "graph + event record",
                           "graph + D2H 4 B + sync", "graph + 2x H2D 256 B", "graph + H2D 256 B + D2H + sync", "eager 20 kernels"};
    for (int mode = 0; mode < 9; mode++) {
        for (int rep = 0; rep < 2; rep++) {
            CK(cudaStreamSynchronize(s));
            auto t0 = std::chrono::steady_clock::now();
            for (int it = 0; it < N; it++) {
                if (mode == 8) { for (int i = 0; i < NK; i++) launch_pdl(s, 32, 128, tiny, p, i); }
                else CK(cudaGraphLaunch(ge, s));
                if (mode == 1 || mode == 6 || mode == 7) CK(cudaMemcpyAsync(d, h, 256, cudaMemcpyHostToDevice, s));
                if (mode == 6) CK(cudaMemcpyAsync(d + 1024, h + 1024, 256, cudaMemcpyHostToDevice, s));
                if (mode == 2) CK(cudaMemcpyAsync(d, h, 8192, cudaMemcpyHostToDevice, s));
                if (mode == 3) { P q; q.n = 64; q.dst = d; for (int i = 0; i < 64; i++) q.v[i] = i + it;
                    cudaLaunchAttribute a; a.id = cudaLaunchAttributeProgrammaticStreamSerialization; a.val.programmaticStreamSerializationAllowed = 1;
                    cudaLaunchConfig_t c = {}; c.gridDim = 1; c.blockDim = 64; c.stream = s; c.attrs = &a; c.numAttrs = 1; cudaLaunchKernelEx(&c, pk, q); }
                if (mode == 4) CK(cudaEventRecord(ev, s));
                if (mode == 5 || mode == 7) { CK(cudaMemcpyAsync(h + 4096, d, 4, cudaMemcpyDeviceToHost, s)); CK(cudaStreamSynchronize(s)); }
            }
            CK(cudaStreamSynchronize(s));
            double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / N;
            if (rep) printf("%-36s %7.2f us per iteration (%d kernels)\n", names[mode], us, NK);
        }
    }
    return 0;
}
