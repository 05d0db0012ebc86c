// Must not compile: a non-tree parameter bound by a plain reference. Its address could be
// reused by another object after it dies, which would then get its trace; bound objects derive
// from retrace::TraceOwner, come as std::shared_ptr, or are function pointers.
#include <retrace/retrace.hpp>

struct Manager {
  int rank = 0;
};

retrace::Tensor run(const retrace::Tensor& x, retrace::Device& device, const Manager& manager) {
  (void)device;
  return retrace::ops::add(x, manager.rank);
}

int main() {
  auto traced = retrace::traced_function(run);
  (void)traced;
}
