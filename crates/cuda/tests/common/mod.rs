//! Shared by the GPU tests: open the device or say plainly why the test is skipped.

use std::io::Write;

use vortex_cuda::Device;

/// Device 0, or `None` after a message on the terminal (not captured by the test harness).
pub fn device_or_skip(test: &str) -> Option<Device> {
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {e}");
            None
        }
    }
}
