// The two small kernels around an NCCL collective that carry a member's failure to its peers
// (see cuda/collective.hpp).
#include "cuda/collective.hpp"
#include "cuda/common.cuh"

namespace retrace::cuda {

namespace {

__global__ void failure_word_kernel(const FailureRecord* record, unsigned int* word,
                                    unsigned int mark) {
  *word = aborted(record) ? mark : 0u;
}

__global__ void adopt_peer_failure_kernel(const unsigned int* word, FailureRecord* record,
                                          unsigned int* host_flag, unsigned int site) {
  const unsigned int w = *reinterpret_cast<const volatile unsigned int*>(word);
  if (w == 0u || aborted(record)) return;  // no failure, or this member's own is reported
  record->element = static_cast<unsigned long long>(w - 1u) << 32;
  record->site = site;
  __threadfence();
  atomicExch(&record->abort, 1u);
  *reinterpret_cast<volatile unsigned int*>(host_flag) = site;
  __threadfence_system();
}

}  // namespace

cudaError_t launch_failure_word(const LaunchContext& ctx, unsigned int* word, unsigned int mark) {
  failure_word_kernel<<<1, 1, 0, ctx.stream>>>(ctx.record, word, mark);
  return cudaGetLastError();
}

cudaError_t launch_adopt_peer_failure(const LaunchContext& ctx, const unsigned int* word) {
  adopt_peer_failure_kernel<<<1, 1, 0, ctx.stream>>>(word, ctx.record, ctx.host_flag, ctx.site);
  return cudaGetLastError();
}

}  // namespace retrace::cuda
