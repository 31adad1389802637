// Test hooks, off unless a test turns them on through the extension module
// (jax_flash._ffi.inject_launch_failures): how the error path of every
// kernel launch is exercised without a broken GPU (tests/test_robustness.py,
// issue 25's fault tests). An injected failure takes the same road as a
// real one: the launcher's message, an ffi::Error from the handler, an
// exception in Python; the next call runs normally.
#pragma once

namespace jax_flash {

// The next `count` kernel launches report a failure (count <= 0: none).
void InjectLaunchFailures(int count);

// Whether this launch is to report an injected failure (consumes one).
bool TakeInjectedLaunchFailure();

}  // namespace jax_flash
