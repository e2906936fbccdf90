//! Bounds on what flags may ask for: threads, and memory the machine can hold.

/// Worker threads a pool may start.
const MAX_THREADS: usize = 4096;

/// `--threads` within what a pool may start.
pub fn check_threads(threads: usize) -> Result<usize, String> {
    if !(1..=MAX_THREADS).contains(&threads) {
        return Err(format!(
            "--threads must be 1 to {MAX_THREADS}, got {threads}"
        ));
    }
    Ok(threads)
}

/// The machine's memory in bytes, where the system says (Linux).
pub fn physical_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: usize = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// An error when `bytes` of `what` (`None`: past what a size can count) exceed the machine's
/// memory, instead of an allocation that aborts.
pub fn check_memory(what: &str, bytes: Option<usize>) -> Result<(), String> {
    match (bytes, physical_memory()) {
        (None, _) => Err(format!("{what} would take more memory than can be counted")),
        (Some(b), Some(total)) if b > total => Err(format!(
            "{what} would take {:.1} GB, more than this machine's {:.1} GB",
            b as f64 / 1e9,
            total as f64 / 1e9
        )),
        _ => Ok(()),
    }
}
