// step_graph.h, by cudart's stream capture and c10_cuda's caching allocator, as libtorch's
// CUDAGraph (libtorch_cuda, which Strata's plugins do not link) does it for PyTorch:
//   1. the device drains, so no block freed before the capture is reused by it while in flight;
//   2. the allocator serves the capturing stream from a pool of the graph's own
//      (beginAllocateToPool), whose blocks the graph's pointers name for as long as it lives;
//   3. the work runs on a side stream (the legacy default stream cannot be captured) in
//      thread-local capture mode; cudaStreamEndCapture returns the recorded graph, which is
//      instantiated once and launched by each replay;
//   4. when the graph goes, the pool is released (its blocks are freed once no tensor holds them).
#include "step_graph.h"

#include <atomic>
#include <string>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "strata/errors.h"

namespace strata::cuda_graph {

namespace {

// Pool ids of this plugin's graphs: libtorch numbers its own graphs' pools {0, 1}, {0, 2}, ...
// and user-made pools {n, 0}; these start far above both.
c10::cuda::MempoolId_t next_pool_id() {
  static std::atomic<unsigned long long> next{1ULL << 62};
  return {0, next++};
}

void check(cudaError_t result, const std::string& what) {
  if (result != cudaSuccess) throw UserError(what + ": " + cudaGetErrorString(result));
}

}  // namespace

struct StepGraph::Handles {
  c10::DeviceIndex device = 0;
  c10::cuda::MempoolId_t pool;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

StepGraph::StepGraph(c10::Device device, const std::function<void()>& work, const std::string& what)
    : handles_(std::make_unique<Handles>()) {
  Handles& h = *handles_;
  h.device = device.index() < 0 ? c10::cuda::current_device() : device.index();
  h.pool = next_pool_id();
  const c10::cuda::CUDAGuard device_guard(h.device);
  c10::cuda::device_synchronize();
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, h.device);
  unsigned long long capture_id = 0;
  c10::cuda::CUDACachingAllocator::beginAllocateToPool(h.device, h.pool, [&capture_id](cudaStream_t s) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    return cudaStreamGetCaptureInfo(s, &status, &id) == cudaSuccess && status == cudaStreamCaptureStatusActive && id == capture_id;
  });
  const c10::cuda::CUDAStreamGuard stream_guard(stream);
  std::string failure;
  cudaError_t begun = cudaStreamBeginCapture(stream.stream(), cudaStreamCaptureModeThreadLocal);
  if (begun == cudaSuccess) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaStreamGetCaptureInfo(stream.stream(), &status, &capture_id);
    try {
      work();
    } catch (const std::exception& e) {
      failure = e.what();
      failure = failure.substr(0, failure.find('\n'));
    }
    const cudaError_t ended = cudaStreamEndCapture(stream.stream(), &h.graph);
    if (failure.empty() && ended != cudaSuccess) failure = cudaGetErrorString(ended);
  } else {
    failure = cudaGetErrorString(begun);
  }
  c10::cuda::CUDACachingAllocator::endAllocateToPool(h.device, h.pool);
  cudaGetLastError();  // a failed capture leaves its error behind; the message below says it
  if (!failure.empty()) {
    if (h.graph) cudaGraphDestroy(h.graph), h.graph = nullptr;
    c10::cuda::CUDACachingAllocator::releasePool(h.device, h.pool);
    throw UserError(what + " could not be recorded as one CUDA graph (" + failure +
                    "): something in it waits for the device or calls what a capture forbids");
  }
  check(cudaGraphInstantiate(&h.exec, h.graph, 0), what + ": instantiating its CUDA graph");
}

StepGraph::~StepGraph() {
  Handles& h = *handles_;
  const c10::cuda::CUDAGuard device_guard(h.device);
  c10::cuda::device_synchronize();  // no replay is in flight when its graph and pool go
  if (h.exec) cudaGraphExecDestroy(h.exec);
  if (h.graph) cudaGraphDestroy(h.graph);
  c10::cuda::CUDACachingAllocator::releasePool(h.device, h.pool);
}

void StepGraph::replay() const {
  check(cudaGraphLaunch(handles_->exec, c10::cuda::getCurrentCUDAStream(handles_->device).stream()), "replaying a CUDA graph");
}

}  // namespace strata::cuda_graph
