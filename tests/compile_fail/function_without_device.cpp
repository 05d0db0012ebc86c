// Must not compile: traced_function finds the device by its type; this function has none.
#include <retrace/retrace.hpp>

retrace::Tensor plus_one(const retrace::Tensor& x) { return retrace::ops::add(x, 1.0); }

int main() {
  auto traced = retrace::traced_function(plus_one);
  (void)traced;
}
