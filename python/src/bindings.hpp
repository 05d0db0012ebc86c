// Shared declarations of the retrace Python extension (retrace._core).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "retrace/device.hpp"
#include "retrace/tensor.hpp"

#include <memory>
#include <optional>
#include <vector>

namespace retrace::python {

namespace nb = nanobind;

// A Python-side device: owns the device; Tensor.device finds the same Python object again.
class PyDevice {
 public:
  explicit PyDevice(std::unique_ptr<Device> device);
  // A member of a mesh: the mesh owns it (closing the mesh closes it; detach() then forgets it).
  PyDevice(Device* member, std::string mesh_name);
  ~PyDevice();
  PyDevice(const PyDevice&) = delete;
  PyDevice& operator=(const PyDevice&) = delete;

  // The device; failed_precondition once closed.
  [[nodiscard]] Device& get(std::string_view what) const;
  [[nodiscard]] Device* raw() const noexcept { return device_ ? device_.get() : member_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] bool closed() const noexcept {
    const Device* d = raw();
    return d == nullptr || d->is_closed();
  }
  void close();
  // Before its mesh destroys the member: the object then reports closed.
  void detach() noexcept;

  // The Python object of the open device `device` (None when it has none).
  static nb::object find(const Device* device);

 private:
  std::unique_ptr<Device> device_;
  Device* member_ = nullptr;  // a mesh member (owned by the mesh)
  std::string name_;
  std::string mesh_name_;
};

// The MeshDevices a traced call may take as its devices: the members, or nullopt when `object`
// is not a retrace.MeshDevice.
[[nodiscard]] std::optional<std::vector<Device*>> mesh_devices(nb::handle object);

// Device argument: a PyDevice or None.
[[nodiscard]] Device& device_of(nb::handle device, std::string_view what);

// DType from a retrace.DType, a name ("bfloat16") or a numpy dtype / type.
[[nodiscard]] DType parse_dtype(nb::handle spec);
[[nodiscard]] std::optional<DType> parse_optional_dtype(nb::handle spec);
[[nodiscard]] QueueId parse_queue(nb::handle queue);

// A host tensor from anything nanobind reads as an array (numpy, DLPack producers, buffer
// protocol): no copy when the memory is C-contiguous in a retrace dtype that equals `dtype`.
[[nodiscard]] Tensor host_tensor_from_array(nb::handle array, std::optional<DType> dtype,
                                            std::string_view what);
// A sequence of integers (or one integer) for a shape, dims or sizes argument; invalid_argument
// naming `what` and `argument` otherwise.
[[nodiscard]] std::vector<std::int64_t> int_list(nb::handle values, std::string_view what,
                                                 std::string_view argument);
// True for objects host_tensor_from_array accepts (numpy arrays, __dlpack__ producers).
[[nodiscard]] bool is_array_like(nb::handle object);

// Releases Python references whose last C++ owner went away on a thread without the GIL.
void drain_released_references();

void bind_errors(nb::module_& m);
void bind_tensors(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_tracer(nb::module_& m);
void bind_models(nb::module_& m);
void bind_mesh(nb::module_& m);

}  // namespace retrace::python
