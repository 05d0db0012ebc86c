// Collectives between CUDA members of a mesh, through NCCL (one communicator per line of a
// mesh axis, one rank per GPU). The CUDA device hands a collective command here instead of
// launching a kernel of its own.
//
// How a collective runs: ops::all_reduce (and the others) enqueue the command on every member
// of a group, from one thread, between begin_enqueue and end_enqueue of the group. Each
// member's enqueue writes its failure state into a word of the command's scratch (a kernel on
// its stream) and stages its part. end_enqueue then starts, on every member's stream, in NCCL
// group calls: a max-reduction of the failure words (so a member that failed before the
// collective fails it on every member: adopt_peer_failure raises the flag of the members that
// had not failed, naming it), then the collective itself. Captured, the same calls become
// nodes of each member's CUDA graph, and a replay runs them with the rest.
#pragma once

#include "cuda/launch.hpp"

#include <string>
#include <vector>

namespace retrace::cuda {

// Why the CUDA device cannot run this collective command (nullptr when it can).
[[nodiscard]] const char* collective_unsupported_reason(const CollectiveParams& p) noexcept;

// The member's part of a collective: records its failure state in `ctx.scratch` (a word) and
// stages the part until the group's end_enqueue. Called by the device with the command's
// stream, failure record and site.
[[nodiscard]] cudaError_t stage_collective(const CollectiveParams& p, const LaunchContext& ctx);

// Scratch a collective command needs (its failure word).
inline constexpr std::size_t kCollectiveScratchBytes = 256;

// The group's label and member names, for a failure message ("member cuda:1 of ... failed").
struct CollectiveSiteInfo {
  std::string label;
  std::vector<std::string> members;
};
[[nodiscard]] CollectiveSiteInfo collective_site_info(const CollectiveParams& p);

// Makes mesh lines of CUDA devices meet through NCCL (called when the backend registers).
void register_nccl_transport();

// Kernels of the failure exchange (kernels_collective.cu).
// *word = mark when the record says an earlier command failed, else 0.
cudaError_t launch_failure_word(const LaunchContext& ctx, unsigned int* word, unsigned int mark);
// When *word (the members' maximum) is nonzero and this member's record is clear: fails the
// record at ctx.site, element = *word - 1 (the failed member's rank), and raises the flag.
cudaError_t launch_adopt_peer_failure(const LaunchContext& ctx, const unsigned int* word);

}  // namespace retrace::cuda
