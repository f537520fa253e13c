/* order_test.c - the stub's order of the work (cuda_stub.c) finds an unordered access, and only
 * that: each case below is the pattern of the trainer's batch pipeline (rt_cuda.c) with its
 * events, or with one of them left out.
 *
 *   order_test CASE    exits 0 when CASE is ordered; the stub aborts ("cuda_stub: unordered")
 *                      when it is not. order_test.sh runs every case and checks which is which.
 *
 * Cases: copy-then-read (a copy stream fills a device buffer, the step stream reads it after an
 * event) and its no-wait; refill (the host refills a pinned slot after an event recorded behind
 * its last copy) and its no-sync; graph (a captured graph reads the buffer and records an event
 * that the next fill waits for) and its graph-no-wait; query (the host finds the event passed by
 * cudaEventQuery) and side-arena (a stream writes where another's earlier kernel touched, after a
 * whole-stream synchronisation) for the other ways of ordering.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "order_test: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: order_test CASE\n");
        return 2;
    }
    const char *c = argv[1];
    cudaStream_t copy, step;
    cudaEvent_t landed, free_again;
    unsigned char *slot, *landing, *batch;
    ok(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking), "stream");
    ok(cudaStreamCreateWithFlags(&step, cudaStreamNonBlocking), "stream");
    ok(cudaEventCreateWithFlags(&landed, cudaEventDisableTiming | cudaEventBlockingSync), "event");
    ok(cudaEventCreateWithFlags(&free_again, cudaEventDisableTiming | cudaEventBlockingSync), "event");
    ok(cudaHostAlloc((void **)&slot, 64, cudaHostAllocDefault), "pinned");
    ok(cudaMalloc((void **)&landing, 64), "landing");
    ok(cudaMalloc((void **)&batch, 64), "batch");
    ok(cudaEventRecord(free_again, step), "record");

    if (!strcmp(c, "copy-then-read") || !strcmp(c, "no-wait")) {
        ok(cudaMemcpyAsync(landing, slot, 64, cudaMemcpyHostToDevice, copy), "fill");
        ok(cudaEventRecord(landed, copy), "record");
        if (!strcmp(c, "copy-then-read"))
            ok(cudaStreamWaitEvent(step, landed, 0), "wait");
        ok(cudaMemcpyAsync(batch, landing, 64, cudaMemcpyDeviceToDevice, step), "read");
    } else if (!strcmp(c, "refill") || !strcmp(c, "no-sync")) {
        ok(cudaMemcpyAsync(landing, slot, 64, cudaMemcpyHostToDevice, copy), "fill");
        ok(cudaEventRecord(landed, copy), "record");
        if (!strcmp(c, "refill"))
            ok(cudaEventSynchronize(landed), "sync");
        ok(cudaMemcpyAsync(batch, slot, 64, cudaMemcpyHostToDevice, step), "refill");
    } else if (!strcmp(c, "query")) {
        ok(cudaMemcpyAsync(landing, slot, 64, cudaMemcpyHostToDevice, copy), "fill");
        ok(cudaEventRecord(landed, copy), "record");
        while (cudaEventQuery(landed) == cudaErrorNotReady) {
        }
        ok(cudaMemcpyAsync(batch, slot, 64, cudaMemcpyHostToDevice, step), "refill");
    } else if (!strcmp(c, "graph") || !strcmp(c, "graph-no-wait")) {
        cudaGraph_t g;
        cudaGraphExec_t exec;
        ok(cudaStreamBeginCapture(step, cudaStreamCaptureModeThreadLocal), "capture");
        ok(cudaMemcpyAsync(batch, landing, 64, cudaMemcpyDeviceToDevice, step), "captured read");
        ok(cudaEventRecordWithFlags(free_again, step, cudaEventRecordExternal), "captured record");
        ok(cudaMemsetAsync(batch, 0, 64, step), "captured work");
        ok(cudaStreamEndCapture(step, &g), "end capture");
        ok(cudaGraphInstantiate(&exec, g, 0), "instantiate");
        for (int i = 0; i < 3; i++) {
            if (!strcmp(c, "graph") || i == 0)
                ok(cudaStreamWaitEvent(copy, free_again, 0), "wait for the landing buffer");
            ok(cudaMemcpyAsync(landing, slot, 64, cudaMemcpyHostToDevice, copy), "fill");
            ok(cudaEventRecord(landed, copy), "record");
            ok(cudaEventSynchronize(landed), "sync: the slot is free");
            ok(cudaStreamWaitEvent(step, landed, 0), "wait for the batch");
            ok(cudaGraphLaunch(exec, step), "launch");
        }
    } else if (!strcmp(c, "side-arena")) {
        ok(cudaMemsetAsync(landing, 0, 64, copy), "the side's work");
        ok(cudaStreamSynchronize(copy), "sync the side");
        ok(cudaMemcpyAsync(landing, batch, 64, cudaMemcpyDeviceToDevice, step), "snapshot");
    } else {
        fprintf(stderr, "order_test: no case %s\n", c);
        return 2;
    }
    ok(cudaStreamSynchronize(step), "sync");
    ok(cudaStreamSynchronize(copy), "sync");
    return 0;
}
