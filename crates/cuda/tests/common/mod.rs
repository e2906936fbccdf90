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

/// A fresh random seed, or `VORTEX_TEST_SEED` to repeat a run; printed either way.
#[allow(dead_code)]
pub fn test_seed() -> u64 {
    use rand::Rng;
    let seed = match std::env::var("VORTEX_TEST_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("VORTEX_TEST_SEED={s}: expected a u64 seed")),
        Err(_) => rand::rng().random(),
    };
    eprintln!("seed {seed}");
    seed
}
