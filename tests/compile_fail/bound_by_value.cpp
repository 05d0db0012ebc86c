// Must not compile: a non-tree parameter taken by value cannot be bound by identity.
#include <retrace/retrace.hpp>

struct Manager {
  int rank = 0;
};

retrace::Tensor run(const retrace::Tensor& x, retrace::Device& device, Manager manager) {
  (void)device;
  return retrace::ops::add(x, manager.rank);
}

int main() {
  auto traced = retrace::traced_function(run);
  (void)traced;
}
