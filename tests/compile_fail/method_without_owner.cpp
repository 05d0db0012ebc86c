// Must not compile: per-object traces need the class to derive from retrace::TraceOwner.
#include <retrace/retrace.hpp>

struct Model {
  retrace::Device* device;
  retrace::Tensor step(const retrace::Tensor& x) { return retrace::ops::add(x, 1.0); }
};

int main() {
  auto step = retrace::traced_method(&Model::step,
                                     [](Model& m) -> retrace::Device& { return *m.device; });
  (void)step;
}
