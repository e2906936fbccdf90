//! Run-time kernel compilation with NVRTC, cached on disk by content hash.
//!
//! A kernel module is its CUDA C source with the geometry fixed by `#define`s in front. The
//! cache key hashes that text, the NVRTC version, the target architecture and the options, so a
//! changed source or geometry never reuses a stale binary. Binaries land in
//! `$VORTEX_KERNEL_CACHE`, else `$XDG_CACHE_HOME/vortex/kernels`, else
//! `~/.cache/vortex/kernels`, as `<sha256>.cubin`. A cache that cannot be read or written only
//! costs a compile.

use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaFunction, CudaModule};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};
use sha2::{Digest, Sha256};

use crate::error::driver;
use crate::{CudaError, Device};

pub const CACHE_ENV: &str = "VORTEX_KERNEL_CACHE";

/// A kernel module to build: a name for messages, its source and `#define`s.
pub struct ModuleSpec<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub defines: Vec<(&'static str, String)>,
}

/// How a module was obtained.
#[derive(Debug, Clone)]
pub struct Built {
    pub module: Arc<CudaModule>,
    pub key: String,
    pub from_cache: bool,
    pub seconds: f64,
}

impl Built {
    /// The module's kernel `name`.
    pub fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        self.module
            .load_function(name)
            .map_err(driver("cuModuleGetFunction"))
    }
}

impl ModuleSpec<'_> {
    /// The full text NVRTC compiles.
    pub fn text(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.defines {
            s.push_str(&format!("#define {k} {v}\n"));
        }
        s.push_str(self.source);
        s
    }
}

fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--use_fast_math".into(),
    ]
}

/// The cache key of `text` compiled for `arch` by NVRTC `version`.
pub fn cache_key(text: &str, arch: &str, version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(format!("nvrtc {}.{}\n", version.0, version.1));
    h.update(options(arch).join(" "));
    h.update("\n");
    h.update(text);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(
        std::env::var_os(CACHE_ENV),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

/// The kernel cache folder from the variables' values (`VORTEX_KERNEL_CACHE`,
/// `XDG_CACHE_HOME`, `HOME`), as the model cache reads them: an empty value counts as unset, and
/// a relative `XDG_CACHE_HOME` is ignored, as the XDG spec says.
fn cache_dir_from(
    kernel_cache: Option<std::ffi::OsString>,
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let set = |v: Option<std::ffi::OsString>| v.filter(|s| !s.is_empty()).map(PathBuf::from);
    if let Some(d) = set(kernel_cache) {
        return Some(d);
    }
    if let Some(d) = set(xdg_cache_home).filter(|d| d.is_absolute()) {
        return Some(d.join("vortex/kernels"));
    }
    set(home).map(|h| h.join(".cache/vortex/kernels"))
}

fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    let (mut a, mut b) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) }
        .result()
        .map_err(driver("nvrtcVersion"))?;
    Ok((a, b))
}

/// The modules [`build`] has given this process so far: how many it compiled and how many it
/// loaded from the disk cache, and the seconds each kind took (what a first start on a machine
/// spends compiling). [`warm_cache`]'s compiles are not counted: its modules count when built.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BuildStats {
    pub compiled: u64,
    pub compile_seconds: f64,
    pub loaded: u64,
    pub load_seconds: f64,
}

static BUILD_STATS: std::sync::Mutex<BuildStats> = std::sync::Mutex::new(BuildStats {
    compiled: 0,
    compile_seconds: 0.0,
    loaded: 0,
    load_seconds: 0.0,
});

impl BuildStats {
    /// This process's so far (every thread's builds).
    pub fn now() -> Self {
        *BUILD_STATS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What was built between `before` and `self`.
    pub fn since(self, before: Self) -> Self {
        Self {
            compiled: self.compiled.saturating_sub(before.compiled),
            compile_seconds: (self.compile_seconds - before.compile_seconds).max(0.0),
            loaded: self.loaded.saturating_sub(before.loaded),
            load_seconds: (self.load_seconds - before.load_seconds).max(0.0),
        }
    }

    /// E.g. "kernels: 3 compiled in 12.3 s, 5 from the cache in 0.1 s".
    pub fn describe(&self) -> String {
        format!(
            "kernels: {} compiled in {:.1} s, {} from the cache in {:.1} s",
            self.compiled, self.compile_seconds, self.loaded, self.load_seconds
        )
    }

    fn record(compiled: bool, seconds: f64) {
        let mut s = BUILD_STATS.lock().unwrap_or_else(|e| e.into_inner());
        if compiled {
            s.compiled += 1;
            s.compile_seconds += seconds;
        } else {
            s.loaded += 1;
            s.load_seconds += seconds;
        }
    }
}

/// Loads `spec` for `dev`: from the disk cache when present, else compiled and stored.
pub fn build(dev: &Device, spec: &ModuleSpec) -> Result<Built, CudaError> {
    let t0 = Instant::now();
    let arch = dev.arch();
    let text = spec.text();
    let key = cache_key(&text, &arch, nvrtc_version()?);
    let path = cache_dir().map(|d| d.join(format!("{key}.cubin")));
    if let Some(p) = &path
        && let Ok(bin) = std::fs::read(p)
        && let Ok(module) = dev.ctx.load_module(Ptx::from_binary(bin))
    {
        let seconds = t0.elapsed().as_secs_f64();
        BuildStats::record(false, seconds);
        return Ok(Built {
            module,
            key,
            from_cache: true,
            seconds,
        });
    }
    let cubin = compile(spec.name, &text, &arch)?;
    if let Some(p) = &path {
        store(p, &cubin);
    }
    let module = dev
        .ctx
        .load_module(Ptx::from_binary(cubin))
        .map_err(driver("cuModuleLoadData"))?;
    let seconds = t0.elapsed().as_secs_f64();
    BuildStats::record(true, seconds);
    Ok(Built {
        module,
        key,
        from_cache: false,
        seconds,
    })
}

/// Most compiles [`compile_all`] runs at once: NVRTC takes hundreds of MB a program.
const MAX_COMPILE_THREADS: usize = 16;

/// Compiles each `(name, text)` for `arch`, on as many threads as the machine has cores (NVRTC
/// compiles separate programs at once), at most `MAX_COMPILE_THREADS` at a time: the results in
/// order.
pub fn compile_all(jobs: &[(&str, &str)], arch: &str) -> Vec<Result<Vec<u8>, CudaError>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_COMPILE_THREADS.min(jobs.len().max(1)));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, Result<Vec<u8>, CudaError>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((name, text)) = jobs.get(i) else {
                            return out;
                        };
                        let result = std::panic::catch_unwind(|| compile(name, text, arch))
                            .unwrap_or_else(|_| {
                                Err(CudaError::Invalid(format!("compiling {name} panicked")))
                            });
                        out.push((i, result));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    let mut done = done.into_iter().peekable();
    (0..jobs.len())
        .map(|i| match done.next_if(|(j, _)| *j == i) {
            Some((_, r)) => r,
            None => Err(CudaError::Invalid(format!(
                "compiling {} stopped with its thread",
                jobs[i].0
            ))),
        })
        .collect()
}

/// Compiles the `specs` that the disk cache lacks for `dev` on every core ([`compile_all`]) and
/// stores them, so that their [`build`]s then load at once: what a test or a start that builds
/// many modules one after another can call first. Returns how many it stored (none without a
/// cache folder, or one that cannot be written: the `build`s then compile as before); a module
/// that does not compile is an error, once the others are stored.
pub fn warm_cache(dev: &Device, specs: &[ModuleSpec]) -> Result<usize, CudaError> {
    let Some(dir) = cache_dir() else {
        return Ok(0);
    };
    let arch = dev.arch();
    let version = nvrtc_version()?;
    let mut missing: Vec<(PathBuf, &str, String)> = Vec::new();
    for spec in specs {
        let text = spec.text();
        let path = dir.join(format!("{}.cubin", cache_key(&text, &arch, version)));
        if !path.exists() && !missing.iter().any(|(p, _, _)| *p == path) {
            missing.push((path, spec.name, text));
        }
    }
    let jobs: Vec<(&str, &str)> = missing.iter().map(|(_, n, t)| (*n, t.as_str())).collect();
    let (mut stored, mut failed) = (0, None);
    for ((path, _, _), bin) in missing.iter().zip(compile_all(&jobs, &arch)) {
        match bin {
            Ok(bin) => stored += usize::from(store(path, &bin)),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    failed.map_or(Ok(stored), Err)
}

/// Writes through a temporary file and a rename, so a reader never sees half a binary; whether
/// it did.
fn store(path: &std::path::Path, bin: &[u8]) -> bool {
    let Some(dir) = path.parent() else {
        return false;
    };
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    // One temporary file per writer: threads of one process may store the same kernel at once.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}.{n}", std::process::id()));
    if std::fs::write(&tmp, bin).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return false;
    }
    if std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return false;
    }
    true
}

/// Compiles `text` to a CUBIN for `arch` (`sm_XY`).
pub fn compile(name: &str, text: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    crate::libs::load_nvrtc()?;
    let src = CString::new(text).map_err(|_| CudaError::Invalid("NUL in kernel source".into()))?;
    let cname = CString::new(name).map_err(|_| CudaError::Invalid("NUL in kernel name".into()))?;
    let prog = nvrtc::create_program(&src, Some(&cname)).map_err(driver("nvrtcCreateProgram"))?;
    // SAFETY: `prog` is a live program until destroyed below.
    let out = unsafe {
        match nvrtc::compile_program(prog, &options(arch)) {
            Err(_) => {
                let log = nvrtc::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                Err(CudaError::Compile {
                    kernel: name.to_string(),
                    log,
                })
            }
            Ok(()) => cubin(prog),
        }
    };
    // SAFETY: destroyed once.
    unsafe { nvrtc::destroy_program(prog) }.map_err(driver("nvrtcDestroyProgram"))?;
    out
}

unsafe fn cubin(prog: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, CudaError> {
    let mut size = 0usize;
    // SAFETY: the caller passes a compiled program; the buffer has the size NVRTC reports.
    unsafe {
        nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .map_err(driver("nvrtcGetCUBINSize"))?;
        let mut buf = vec![0u8; size];
        nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _)
            .result()
            .map_err(driver("nvrtcGetCUBIN"))?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_changes_with_text_arch_and_version() {
        let a = cache_key("x", "sm_90", (13, 0));
        assert_eq!(a.len(), 64);
        assert_eq!(a, cache_key("x", "sm_90", (13, 0)));
        assert_ne!(a, cache_key("y", "sm_90", (13, 0)));
        assert_ne!(a, cache_key("x", "sm_80", (13, 0)));
        assert_ne!(a, cache_key("x", "sm_90", (12, 8)));
    }

    #[test]
    fn cache_dir_skips_empty_and_relative_values() {
        let v = |s: &str| Some(std::ffi::OsString::from(s));
        let dir = |k, x, h| cache_dir_from(k, x, h).map(|p| p.display().to_string());
        assert_eq!(dir(v("/k"), v("/x"), v("/h")).as_deref(), Some("/k"));
        assert_eq!(
            dir(v(""), v("/x"), v("/h")).as_deref(),
            Some("/x/vortex/kernels")
        );
        assert_eq!(
            dir(None, v("rel"), v("/h")).as_deref(),
            Some("/h/.cache/vortex/kernels")
        );
        assert_eq!(dir(None, v(""), v("")), None);
    }

    #[test]
    fn defines_come_first() {
        let spec = ModuleSpec {
            name: "t",
            source: "body",
            defines: vec![("HEAD_DIM", "128".into())],
        };
        assert_eq!(spec.text(), "#define HEAD_DIM 128\nbody");
    }

    #[test]
    fn build_stats_count_and_subtract() {
        let before = BuildStats {
            compiled: 2,
            compile_seconds: 10.0,
            loaded: 1,
            load_seconds: 0.5,
        };
        let after = BuildStats {
            compiled: 5,
            compile_seconds: 22.5,
            loaded: 4,
            load_seconds: 0.9,
        };
        let d = after.since(before);
        assert_eq!((d.compiled, d.loaded), (3, 3));
        assert_eq!(
            d.describe(),
            "kernels: 3 compiled in 12.5 s, 3 from the cache in 0.4 s"
        );
        // The process's count only grows (other threads may build beside this test).
        let now = BuildStats::now();
        BuildStats::record(true, 1.0);
        BuildStats::record(false, 1.0);
        let later = BuildStats::now();
        assert!(later.compiled > now.compiled && later.loaded > now.loaded);
    }

    /// A binary is stored whole, or the store says it was not (a folder that cannot be made).
    #[test]
    fn store_says_whether_it_stored() {
        let dir = std::env::temp_dir().join(format!("vortex_store_{}", std::process::id()));
        let path = dir.join("k.cubin");
        assert!(store(&path, b"binary"));
        assert_eq!(std::fs::read(&path).unwrap(), b"binary");
        // A file where the folder should be.
        let blocked = dir.join("k.cubin").join("x.cubin");
        assert!(!store(&blocked, b"binary"));
        let leftovers = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(leftovers, 1, "only the stored binary remains");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Without NVRTC (as on a machine with no CUDA), every job gets its error; none is lost.
    #[test]
    fn compile_all_answers_every_job() {
        if crate::libs::load_nvrtc().is_ok() {
            return; // compiled for real by kernels_compile
        }
        let jobs = [("a.cu", "x"), ("b.cu", "y"), ("c.cu", "z")];
        let out = compile_all(&jobs, "sm_90");
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(Result::is_err));
        assert!(compile_all(&[], "sm_90").is_empty());
    }
}
