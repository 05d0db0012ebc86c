#include "retrace/state_tensor.hpp"

#include "retrace/error.hpp"
#include "retrace/ops.hpp"

namespace retrace {

void StateTensor::update(const Tensor& value, Traced traced, Device* device, QueueId queue) {
  value.check_not_null("StateTensor::update", "the value");
  if (data_.is_null() || traced == Traced::no) {
    if (value.on_device()) {
      (void)value.require_device("StateTensor::update", "the value");
      data_ = value;
      return;
    }
    Device* target = device;
    if (target == nullptr && !data_.is_null()) {
      target = &data_.require_device("StateTensor::update", "the state");
    }
    RETRACE_CHECK(target != nullptr, invalid_argument,
                  "StateTensor::update: a host value needs a device to upload to");
    data_ = value.to_device(*target, queue);
    return;
  }
  Device& home = data_.require_device("StateTensor::update", "the state");
  RETRACE_CHECK(value.shape() == data_.shape() && value.dtype() == data_.dtype() &&
                    value.layout() == data_.layout(),
                invalid_argument,
                "StateTensor::update: a traced update must keep the state's shape, dtype and "
                "layout ({} {} {}), got {} {} {}; traces read the state's buffer in place",
                data_.shape(), data_.dtype(), data_.layout(), value.shape(), value.dtype(),
                value.layout());
  RETRACE_CHECK(value.on_host() ||
                    &value.require_device("StateTensor::update", "the value") == &home,
                invalid_argument, "StateTensor::update: the value is on {} but the state lives on {}",
                value.device() ? value.device()->name() : "?", home.name());
  ops::copy(value, data_, queue);
}

void StateTensor::update(std::span<const float> values, const Shape& shape, Traced traced,
                         Device& device, DType dtype, QueueId queue) {
  update(Tensor::from_vector<float>(values, shape, dtype), traced, &device, queue);
}

}  // namespace retrace
