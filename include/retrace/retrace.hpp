// Umbrella header: everything a user of retrace needs.
#pragma once

#include "retrace/bfloat16.hpp"
#include "retrace/cpu.hpp"
#include "retrace/device.hpp"
#include "retrace/error.hpp"
#include "retrace/log.hpp"
#include "retrace/mesh.hpp"
#include "retrace/ops.hpp"
#include "retrace/registry.hpp"
#include "retrace/shape.hpp"
#include "retrace/signature.hpp"
#include "retrace/state_tensor.hpp"
#include "retrace/tensor.hpp"
#include "retrace/traced_function.hpp"
#include "retrace/tracer.hpp"
#include "retrace/tree.hpp"
#include "retrace/types.hpp"
