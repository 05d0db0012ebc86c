// Must not compile: maps in trees need std::string keys.
#include <retrace/retrace.hpp>

#include <map>

int main() {
  auto device = retrace::open_cpu_device();
  auto tracer = retrace::make_tracer(
      [](const std::map<int, retrace::Tensor>& m) { return retrace::ops::add(m.at(0), 1.0); },
      *device);
  tracer(std::map<int, retrace::Tensor>{{0, retrace::ops::full({2}, 1.0, *device)}});
}
