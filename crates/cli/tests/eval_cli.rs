//! `vortex eval`, `vortex flow new` and `vortex flow eval`: bad input gets a clear message and
//! a non-zero exit before any model is loaded, and the template flow checks.

mod common;

use common::{assert_clean_failure, vortex};

/// A model path that does not exist: every check below must fail before loading it.
const NO_MODEL: &str = "/nonexistent/model.gguf";

#[test]
fn eval_rejects_bad_input_before_loading() {
    assert_clean_failure(
        &["eval", "--model", NO_MODEL, "--tasks", "passkey,haystack"],
        "unknown task 'haystack'",
    );
    assert_clean_failure(
        &["eval", "--model", NO_MODEL, "--flows", "quest,nosuch"],
        "unknown flow 'nosuch'",
    );
    assert_clean_failure(
        &["eval", "--model", NO_MODEL, "--lengths", "2k,lots"],
        "'lots' is not a token count",
    );
    assert_clean_failure(
        &["eval", "--model", NO_MODEL, "--budget", "3/2"],
        "must be a share of the context",
    );
    assert_clean_failure(
        &["eval", "--model", NO_MODEL, "--samples", "0"],
        "--samples",
    );
    assert_clean_failure(
        &["flow", "eval", "nosuch.flow", "--model", NO_MODEL],
        "unknown flow 'nosuch.flow'",
    );
    assert_clean_failure(
        &["eval", "--model", NO_MODEL, "--fidelity-layer-stride", "0"],
        "--fidelity-layer-stride must be at least 1",
    );
    assert_clean_failure(
        &quest_eval(&["--speed-tokens", "0"]),
        "--speed-tokens must be at least 1",
    );
    // An unwritable report is said before the evaluation, here before the model loads.
    assert_clean_failure(
        &quest_eval(&["--out", "/proc/x/y"]),
        "cannot write /proc/x/y",
    );
}

/// `flow eval quest` of the missing model, with `extra` flags.
fn quest_eval<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    [&["flow", "eval", "quest", "--model", NO_MODEL][..], extra].concat()
}

/// The file that `eval --json` and `flow eval` create to see that their report can be written
/// is gone when the run fails.
#[test]
fn failed_eval_leaves_no_report_behind() {
    let dir = std::env::temp_dir().join(format!("vortex-eval-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("run.json");
    let out = dir.join("quest.eval.json");
    assert_clean_failure(
        &[
            "eval",
            "--model",
            NO_MODEL,
            "--json",
            json.to_str().unwrap(),
        ],
        "/nonexistent/model.gguf",
    );
    assert_clean_failure(
        &quest_eval(&["--out", out.to_str().unwrap()]),
        "/nonexistent/model.gguf",
    );
    assert!(!json.exists() && !out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flow_new_writes_a_template_that_checks() {
    let dir = std::env::temp_dir().join(format!("vortex-flow-new-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mine.flow");
    let _ = std::fs::remove_file(&path);
    let p = path.to_str().unwrap();
    let (code, out, err) = vortex(&["flow", "new", "mine", "--out", p]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wrote"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("flow mine ") && text.contains("cache:") && text.contains("index:"));
    let (code, out, err) = vortex(&[
        "flow",
        "check",
        p,
        "--heads-q",
        "9",
        "--heads-kv",
        "3",
        "--head-dim",
        "64",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (flow mine)"), "{out}");
    assert_clean_failure(&["flow", "new", "mine", "--out", p], "File exists");
    assert_clean_failure(&["flow", "new", "no-dash"], "is not a flow name");
    // Refused by the flow checker's own rule, before a template is written that fails it.
    let long = "a".repeat(100);
    let long_path = dir.join("long.flow");
    assert_clean_failure(
        &["flow", "new", &long, "--out", long_path.to_str().unwrap()],
        "is not a flow name: this name is too long (at most",
    );
    assert!(!long_path.exists());
}

#[test]
fn report_from_saved_results() {
    let dir = std::env::temp_dir().join(format!("vortex-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.json");
    let fid = r#"{"rows": 2, "mass_recall": 0.5, "topk_recall": 0.5, "rel_error": 0.1, "min_mass_recall": 0.4}"#;
    let sample = |flow: &str, correct: bool| {
        format!(
            r#"{{"task": "passkey", "length": 2048, "index": 0, "flow": "{flow}", "correct": {correct},
            "output": " 12345", "answers": ["12345"], "prompt_tokens": 2000, "depth": 0.5, "fidelity": {fid}}}"#
        )
    };
    let json = format!(
        r#"{{"model": "m", "partial": true, "speed": [], "samples": [{}, {}]}}"#,
        sample("dense", true),
        sample("quest 1/8", false)
    );
    std::fs::write(&path, json).unwrap();
    let (code, out, err) = vortex(&["eval", "--report-from", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("had not finished"), "{out}");
    let dense = out.find("| dense | 100 |").expect(&out);
    assert!(dense < out.find("| quest 1/8 | 0 (-100) |").expect(&out));
    assert!(out.contains("0.500 / 0.500 / 0.100"), "{out}");
    std::fs::write(&path, "{").unwrap();
    assert_clean_failure(
        &["eval", "--report-from", path.to_str().unwrap()],
        "is not JSON",
    );
    for not_results in ["[]", "{}", "{\"speed\": []}"] {
        std::fs::write(&path, not_results).unwrap();
        assert_clean_failure(
            &["eval", "--report-from", path.to_str().unwrap()],
            "does not hold eval results: no \"samples\" key",
        );
    }
    // A source without end is read no further than a report can be.
    #[cfg(unix)]
    assert_clean_failure(
        &["eval", "--report-from", "/dev/zero"],
        "is larger than 256 MiB",
    );
}
