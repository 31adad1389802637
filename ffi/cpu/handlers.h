#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxFlashForwardCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxFlashBackwardCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxFlashBiasGradientCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxFlashPagedForwardCpu);
