//! Finds the CUDA driver and NVRTC libraries at run time.
//!
//! The driver bindings open `libcuda` and `libnvrtc` by name on first use, and fail hard when
//! they are missing. So before any CUDA call, [`load`] opens them itself: by name first (the
//! loader path), then by full path from the usual install folders. A library opened globally by
//! full path satisfies the later open by name.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::CudaError;

/// Environment variable naming an extra folder (or `:`-separated folders) to search first.
pub const LIB_DIR_ENV: &str = "VORTEX_CUDA_LIB_DIR";

const DRIVER: &[&str] = &["libcuda.so.1", "libcuda.so"];
const NVRTC: &[&str] = &["libnvrtc.so.13", "libnvrtc.so", "libnvrtc.so.12"];
const CUBLAS_LT: &[&str] = &["libcublasLt.so.13", "libcublasLt.so", "libcublasLt.so.12"];
const CUBLAS: &[&str] = &["libcublas.so.13", "libcublas.so", "libcublas.so.12"];

/// Opens the driver library once per process (NVRTC too, see [`load_nvrtc`]); later calls
/// return the first result.
pub fn load() -> Result<(), CudaError> {
    static DRIVER_LIB: OnceLock<Result<String, CudaError>> = OnceLock::new();
    DRIVER_LIB
        .get_or_init(|| {
            open_any(DRIVER, &search_dirs()).map_err(|e| {
                CudaError::Unavailable(format!(
                    "no NVIDIA driver library (libcuda.so.1) found: {e}"
                ))
            })
        })
        .as_ref()
        .map_err(Clone::clone)?;
    load_nvrtc().map(|_| ())
}

/// Opens NVRTC once per process; it compiles kernels without a GPU too. Returns where it was
/// found.
pub fn load_nvrtc() -> Result<&'static str, CudaError> {
    static NVRTC_LIB: OnceLock<Result<String, CudaError>> = OnceLock::new();
    NVRTC_LIB
        .get_or_init(|| {
            let path = open_any(NVRTC, &search_dirs()).map_err(|e| {
                CudaError::Unavailable(format!(
                    "no NVRTC library (libnvrtc.so) found: {e}; set {LIB_DIR_ENV} to its folder"
                ))
            })?;
            preload_nvrtc_builtins(&path);
            Ok(path)
        })
        .as_ref()
        .map(String::as_str)
        .map_err(Clone::clone)
}

/// Opens cuBLAS (and cuBLASLt, which it needs) once per process, for the model's matrix
/// products.
pub fn load_cublas() -> Result<(), CudaError> {
    static CUBLAS_LIB: OnceLock<Result<String, CudaError>> = OnceLock::new();
    CUBLAS_LIB
        .get_or_init(|| {
            let dirs = search_dirs();
            let missing = |e: String| {
                CudaError::Unavailable(format!(
                    "no cuBLAS library (libcublas.so) found: {e}; set {LIB_DIR_ENV} to its folder"
                ))
            };
            open_any(CUBLAS_LT, &dirs).map_err(missing)?;
            open_any(CUBLAS, &dirs).map_err(missing)
        })
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

fn open_any(names: &[&str], dirs: &[PathBuf]) -> Result<String, String> {
    for name in names {
        // SAFETY: opening a system library runs its initialisers; these are NVIDIA's own.
        if let Ok(lib) = unsafe { Library::open(Some(*name), RTLD_NOW | RTLD_GLOBAL) } {
            std::mem::forget(lib);
            return Ok(name.to_string());
        }
    }
    for dir in dirs {
        for name in names {
            let path = dir.join(name);
            if path.is_file() {
                // SAFETY: as above.
                if let Ok(lib) = unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) } {
                    std::mem::forget(lib);
                    return Ok(path.display().to_string());
                }
            }
        }
    }
    Err(format!(
        "tried {names:?} on the loader path and in {} folders",
        dirs.len()
    ))
}

/// NVRTC opens `libnvrtc-builtins.so.X.Y` by name; when NVRTC itself came from a folder off the
/// loader path, the builtins must be opened from that folder first.
fn preload_nvrtc_builtins(nvrtc: &str) {
    let Some(dir) = Path::new(nvrtc).parent().filter(|d| d.is_absolute()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt."))
        })
        .collect();
    found.sort();
    for path in found.iter().rev() {
        // SAFETY: as above.
        if let Ok(lib) = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) } {
            std::mem::forget(lib);
            return;
        }
    }
}

fn search_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(v) = std::env::var(LIB_DIR_ENV) {
        dirs.extend(std::env::split_paths(&v));
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Ok(v) = std::env::var(var) {
            roots.push(v.into());
        }
    }
    roots.push("/usr/local/cuda".into());
    roots.extend(children("/usr/local", "cuda-"));
    for site in python_site_dirs() {
        roots.push(site.join("nvidia/cu13"));
        roots.push(site.join("nvidia/cuda_nvrtc"));
        roots.push(site.join("nvidia/cublas"));
    }
    for r in roots {
        for sub in ["lib64", "lib", "targets/x86_64-linux/lib"] {
            dirs.push(r.join(sub));
        }
    }
    for d in [
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(d.into());
    }
    let mut out = Vec::new();
    for d in dirs {
        if d.is_dir() && !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// Python package folders that may hold NVIDIA's wheels (`nvidia/cu13/lib`).
fn python_site_dirs() -> Vec<PathBuf> {
    let mut bases: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Ok(v) = std::env::var(var) {
            bases.push(PathBuf::from(v).join("lib"));
        }
    }
    for opt in children("/opt", "") {
        bases.push(opt.join(".venv/lib"));
        bases.push(opt.join("lib"));
    }
    bases.push("/usr/local/lib".into());
    bases.push("/usr/lib".into());
    let mut out = Vec::new();
    for b in bases {
        for py in children(&b, "python3") {
            for sub in ["site-packages", "dist-packages"] {
                let d = py.join(sub);
                if d.join("nvidia").is_dir() {
                    out.push(d);
                }
            }
        }
    }
    out
}

/// Entries of `dir` whose names start with `prefix`, newest-looking (reverse sorted) first.
fn children(dir: impl AsRef<Path>, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir.as_ref()) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    v.sort();
    v.reverse();
    v
}
