//! Running the `vortex` binary, shared by the command-line tests.

use std::process::Command;

/// Exit code, stdout and stderr of `vortex args`.
pub fn vortex(args: &[&str]) -> (i32, String, String) {
    vortex_env(args, &[])
}

/// Exit code, stdout and stderr of `vortex args` with the environment variables `env` set.
pub fn vortex_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vortex"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `vortex args` fails with a message containing `needle`, without a panic.
pub fn assert_clean_failure(args: &[&str], needle: &str) {
    let (code, _, err) = vortex(args);
    assert_ne!(code, 0, "{args:?} should fail");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in: {err}"
    );
}
