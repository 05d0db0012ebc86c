// make_floor: the floor built for the requested CPU kernel variant.
#include "floor_dit.hpp"

#include "cpu/isa.hpp"

#include <retrace/error.hpp>

#define RETRACE_CPU_VARIANT_ROW(entry, name, march) \
  extern "C" retrace::bench::MakeFloor entry() noexcept;
#include "retrace_dit_floor_variants.inc"
#undef RETRACE_CPU_VARIANT_ROW

namespace retrace::bench {

std::unique_ptr<FloorStep> make_floor(const models::DiT& model, std::string_view isa) {
  struct Row {
    std::string_view name;
    MakeFloor (*entry)() noexcept;
  };
  static constexpr Row kRows[] = {
#define RETRACE_CPU_VARIANT_ROW(entry, name, march) {name, &entry},
#include "retrace_dit_floor_variants.inc"
#undef RETRACE_CPU_VARIANT_ROW
  };
  const cpu::VariantInfo* kernels = cpu::find_variant(isa);
  for (const Row& row : kRows) {
    if (row.name == isa && kernels != nullptr) return row.entry()(model, kernels->entry()->sgemm);
  }
  RETRACE_FAIL(invalid_argument, "bench: no floor built for the kernel variant '{}'", isa);
}

}  // namespace retrace::bench
