#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxFlashForwardCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxFlashBackwardCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxFlashBiasGradientCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxFlashPagedForwardCuda);
