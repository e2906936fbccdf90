//! The `vortex` binary: bad input gets a clear message and a non-zero exit, never a panic.

mod common;

use common::{assert_clean_failure, vortex, vortex_env};

#[test]
fn flow_list_and_check_builtins() {
    let (code, out, _) = vortex(&["flow", "list"]);
    assert_eq!(code, 0);
    for name in [
        "dense",
        "streaming",
        "block_topk",
        "quest",
        "double_sparse",
        "h2o",
        "lsh",
        "global_local",
    ] {
        assert!(out.contains(name), "{name} missing from flow list");
    }
    let (code, out, _) = vortex(&["flow", "check", "block_topk", "quest", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v.as_array().unwrap().iter().all(|r| r["ok"] == true));
}

#[test]
fn flow_check_reports_errors_with_location_and_exit_1() {
    let dir = std::env::temp_dir().join(format!("vortex-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.flow");
    std::fs::write(&bad, "flow bad\nindex:\n  s = dto(q, q)\n  topk(s)\n").unwrap();
    let (code, _, err) = vortex(&["flow", "check", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("bad.flow:3:7: error: unknown operator 'dto'"),
        "{err}"
    );
    assert!(err.contains("^^^"), "{err}");
    let (code, out, _) = vortex(&["flow", "check", bad.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1);
    assert!(out.contains("\"line\": 3"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn explain_shows_graph_groups_and_bytes() {
    let (code, out, _) = vortex(&["flow", "explain", "quest"]);
    assert_eq!(code, 0);
    assert!(out.contains("fused group"), "{out}");
    assert!(out.contains("bytes"), "{out}");
    assert!(
        out.contains("the index phase: the built-in quest's hand-written kernel"),
        "{out}"
    );
}

/// A flow file says which form its generated index kernel takes on a GPU.
#[test]
fn explain_names_the_generated_index_form() {
    let dir = std::env::temp_dir().join(format!("vortex-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let quest =
        include_str!("../../flow/flows/quest_fp8.flow").replace("flow quest_fp8 ", "flow mine ");
    let path = dir.join("mine.flow");
    std::fs::write(&path, quest).unwrap();
    let (code, out, _) = vortex(&["flow", "explain", path.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(
        out.contains("generated, the matrix form: 1 sum(s)"),
        "{out}"
    );
    let (code, out, _) = vortex(&["flow", "explain", path.to_str().unwrap(), "--heads-q", "16"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("generated, the lane form: 16 lanes a page"),
        "{out}"
    );
    let (_, out, _) = vortex(&["flow", "explain", "h2o"]);
    assert!(
        out.contains("the built-in h2o's hand-written kernel"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_inputs_are_clear_errors() {
    assert_clean_failure(
        &["flow", "check", "block_topk", "--page-size", "3"],
        "page_size 3",
    );
    assert_clean_failure(
        &[
            "flow",
            "check",
            "block_topk",
            "--heads-q",
            "10",
            "--heads-kv",
            "4",
        ],
        "not a multiple",
    );
    assert_clean_failure(
        &["flow", "explain", "/nonexistent.flow"],
        "neither a built-in flow",
    );
    // A negative number after a space is the flag's value, with the flag's own message.
    assert_clean_failure(
        &["generate", "--prompt", "hi", "--budget", "-1"],
        "invalid value '-1' for '--budget <BUDGET>'",
    );
    assert_clean_failure(
        &["bench", "attention", "--context", "-1"],
        "'-1' is not a token count",
    );
    for json in [&[][..], &["--json"]] {
        let mut args = vec!["flow", "check", "nosuchname"];
        args.extend(json);
        let (code, out, err) = vortex(&args);
        assert_eq!(code, 1, "{args:?}");
        assert!(
            (out + &err).contains("'nosuchname' is neither a built-in flow (dense, "),
            "{args:?}: {err}"
        );
    }
    // --prompt, which conflicts with --chat, keeps clap from requiring --chat.
    assert_clean_failure(
        &[
            "generate",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "a",
            "--system",
            "s",
        ],
        "--system needs --chat",
    );
    assert_clean_failure(&["generate", "--system", "s"], "--chat");
    for (name, want) in [
        ("", "--served-model-name is empty or only spaces"),
        ("  ", "--served-model-name is empty or only spaces"),
    ] {
        assert_clean_failure(
            &[
                "serve",
                "--model",
                "/nonexistent/model.gguf",
                "--served-model-name",
                name,
            ],
            want,
        );
    }
    assert_clean_failure(
        &[
            "serve",
            "--model",
            "/nonexistent/model.gguf",
            "--api-key",
            "",
        ],
        "--api-key is empty",
    );
    assert_clean_failure(
        &[
            "serve",
            "--model",
            "/nonexistent/model.gguf",
            "--api-key",
            " k",
        ],
        "no leading or trailing spaces",
    );
    assert_clean_failure(
        &[
            "generate",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "hi",
        ],
        "",
    );
    assert_clean_failure(
        &["generate", "--model", "no-such-alias", "--prompt", "hi"],
        "smollm2-135m",
    );
    assert_clean_failure(&["model", "info", "no-such-alias"], "smollm2-135m");
    assert_clean_failure(
        &["bench", "attention", "--budget", "0"],
        "not a token count from 1 to",
    );
    assert_clean_failure(
        &["bench", "attention", "--context", "18446744073709551615k"],
        "not a token count from 1 to",
    );
    assert_clean_failure(
        &["bench", "decode", "--warmup", "18446744073709551615"],
        "--warmup 18446744073709551615: at most",
    );
    assert_clean_failure(
        &["serve", "--max-running", "4611686018427387905"],
        "--max-running 4611686018427387905: at most",
    );
    assert_clean_failure(
        &["bench", "attention", "--launches-per-timing", "0"],
        "--launches-per-timing and --batch must be at least 1",
    );
    assert_clean_failure(
        &["bench", "attention", "--launches-per-timing", "1001"],
        "--launches-per-timing 1001: at most 1000",
    );
    assert_clean_failure(
        &["bench", "attention", "--threads", "100000"],
        "--threads must be 1 to",
    );
    assert_clean_failure(
        &[
            "bench",
            "attention",
            "--context",
            "1k",
            "--batch",
            "100000000",
            "--flows",
            "dense",
        ],
        "--batch 100000000: at most 16777216",
    );
    assert_clean_failure(
        &[
            "bench",
            "attention",
            "--context",
            "1k",
            "--batch",
            "10000000",
            "--flows",
            "dense",
        ],
        "more than this machine's",
    );
    assert_clean_failure(
        &[
            "bench",
            "attention",
            "--context",
            "256",
            "--budget",
            "1",
            "--flows",
            "block_topk",
        ],
        "block_topk at --budget 1: 'budget' is 1 page,",
    );
    assert_clean_failure(
        &[
            "bench",
            "serve",
            "--url",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--tolerance",
            "inf",
        ],
        "--tolerance must be a finite number",
    );
    assert_clean_failure(
        &["eval", "--samples", "18446744073709551615"],
        "--samples must be 1 to 1048576",
    );
    assert_clean_failure(
        &["flow", "explain", "block_topk", "--heads-q", "100000"],
        "at most 4096",
    );
    assert_clean_failure(
        &[
            "bench",
            "serve",
            "--url",
            "http://127.0.0.1:1",
            "--timeout",
            "1e30",
        ],
        "at most 86400",
    );
    assert_clean_failure(
        &["generate", "--prompt", "hi", "--kv-dtype", "int4"],
        "int4",
    );
    // fp8 weights are the GPU's; said before any model is loaded.
    for cmd in [
        &["generate", "--prompt", "hi"][..],
        &["serve"][..],
        &["bench", "decode"][..],
    ] {
        let mut args = cmd.to_vec();
        args.extend([
            "--model",
            "/nonexistent/model.gguf",
            "--weight-dtype",
            "fp8",
        ]);
        assert_clean_failure(&args, "--weight-dtype fp8 needs --device cuda");
        // And Q8_0 is the CPU's, said before any device is opened.
        let n = args.len();
        args[n - 1] = "q8_0";
        args.extend(["--device", "cuda"]);
        assert_clean_failure(&args, "--weight-dtype q8_0 is for the CPU");
    }
    // Said before any model is fetched (the model named does not exist).
    assert_clean_failure(
        &[
            "serve",
            "--model",
            "/nonexistent/model.gguf",
            "--gpu-memory-utilization",
            "0.8",
        ],
        "applies to --device cuda",
    );
    assert_clean_failure(
        &[
            "serve",
            "--gpu-memory-utilization",
            "0.8",
            "--kv-memory",
            "1GiB",
        ],
        "cannot be used with",
    );
    let dir = std::env::temp_dir().join(format!("vortex-cli-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00\xff\xff").unwrap();
    assert_clean_failure(&["model", "info", junk.to_str().unwrap()], "");
    std::fs::write(&junk, b"not a model at all").unwrap();
    assert_clean_failure(
        &[
            "generate",
            "--model",
            junk.to_str().unwrap(),
            "--prompt",
            "x",
        ],
        "",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// fp8 KV on the CPU: the attention bench runs it beside bf16. A GPU run takes one of bf16 and
/// fp8, and says so before it looks for a device.
#[test]
fn bench_attention_runs_fp8_kv() {
    let (code, out, err) = vortex(&[
        "bench",
        "attention",
        "--batch",
        "1",
        "--context",
        "256",
        "--kv-dtype",
        "bf16,fp8",
        "--flows",
        "block_topk",
        "--budget",
        "64",
        "--iters",
        "1",
        "--threads",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("fp8"), "{out}");
    assert_clean_failure(
        &[
            "bench",
            "attention",
            "--device",
            "cuda",
            "--kv-dtype",
            "f16",
        ],
        "exactly one of bf16 and fp8",
    );
}

/// `--device cuda` is chosen at run time: without a GPU the same binary says CUDA is
/// unavailable and exits non-zero; with one it runs (a tiny configuration, so either is quick).
#[test]
fn bench_attention_on_cuda_says_when_it_is_unavailable() {
    let (code, _, err) = vortex(&[
        "bench",
        "attention",
        "--device",
        "cuda",
        "--batch",
        "1",
        "--context",
        "64",
        "--iters",
        "1",
        "--flows",
        "dense",
    ]);
    assert!(!err.contains("panicked"), "{err}");
    if code != 0 {
        assert!(err.contains("CUDA is unavailable"), "{err}");
    }
    assert_clean_failure(&["bench", "attention", "--device", "tpu"], "not a device");
    assert_clean_failure(
        &["bench", "attention", "--device", "cuda:x"],
        "not a device",
    );
}

/// The whole model on CUDA, chosen at run time: without a GPU the bench says CUDA is
/// unavailable; with one it decodes a small random geometry. Bad geometries are clean errors.
#[test]
fn bench_decode_on_cuda_says_when_it_is_unavailable() {
    let (code, _, err) = vortex(&[
        "bench",
        "decode",
        "--device",
        "cuda",
        "--random-weights",
        "qwen3-0.6b",
        "--batch",
        "2",
        "--context",
        "256",
        "--decode-tokens",
        "2",
        "--flows",
        "dense,block_topk",
        "--budget",
        "64",
    ]);
    assert!(!err.contains("panicked"), "{err}");
    if code != 0 {
        assert!(err.contains("CUDA is unavailable"), "{err}");
    }
    assert_clean_failure(
        &["bench", "decode", "--random-weights", "qwen9-huge"],
        "unknown geometry",
    );
    assert_clean_failure(
        &[
            "bench",
            "decode",
            "--random-weights",
            "/nonexistent/config.json",
        ],
        "cannot read",
    );
    assert_clean_failure(
        &[
            "bench",
            "decode",
            "--batch",
            "4",
            "--random-weights",
            "qwen3-0.6b",
        ],
        "--batch applies to --device cuda",
    );
    for flag in [
        &["--ahead"][..],
        &["--stagger"],
        &["--no-graphs"],
        &["--settle-ms", "10"],
    ] {
        let mut args = vec!["bench", "decode", "--random-weights", "qwen3-0.6b"];
        args.extend(flag);
        assert_clean_failure(&args, "apply to --device cuda");
    }
    for flag in [
        &["--ragged"][..],
        &["--sequential-pages"],
        &["--json-out", "/tmp/x.json"],
        &["--settle-ms", "10"],
        &["--index-parts", "2"],
    ] {
        let mut args = vec!["bench", "attention"];
        args.extend(flag);
        assert_clean_failure(&args, "apply to --device cuda");
    }
    // Checked before the device is opened, so on a GPU too.
    for device in ["cpu", "cuda"] {
        for parts in ["0", "9"] {
            assert_clean_failure(
                &[
                    "bench",
                    "attention",
                    "--device",
                    device,
                    "--index-parts",
                    parts,
                ],
                "from 1 to 8",
            );
        }
    }
}

/// `generate` and `serve` on CUDA say a missing GPU before fetching or loading any model (the
/// model named here does not exist, so reaching the model would be a different error). With a
/// GPU the commands get past the device and stop at the model instead.
#[test]
fn generate_and_serve_on_cuda_check_the_device_first() {
    let gpu = vortex_cuda::Device::open(0).is_ok();
    for args in [
        &[
            "generate",
            "--device",
            "cuda",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "x",
        ][..],
        &[
            "serve",
            "--device",
            "cuda",
            "--model",
            "/nonexistent/model.gguf",
            "--port",
            "0",
        ][..],
    ] {
        let (code, _, err) = vortex(args);
        assert_ne!(code, 0, "{args:?}");
        assert!(!err.contains("panicked"), "{err}");
        let want = if gpu {
            "/nonexistent/model.gguf"
        } else {
            "CUDA is unavailable"
        };
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `VORTEX_MAX_ISA` caps the CPU kernels' instruction set, and the bench says which it ran.
#[test]
fn max_isa_caps_the_kernels() {
    let args = [
        "bench",
        "attention",
        "--batch",
        "1",
        "--context",
        "1k",
        "--flows",
        "block_topk",
        "--kv-dtype",
        "fp8",
        "--iters",
        "1",
    ];
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    for (cap, want) in [
        ("scalar", "scalar kernels"),
        (
            "avx2",
            if avx2 {
                "avx2 kernels"
            } else {
                "scalar kernels"
            },
        ),
    ] {
        let (code, out, err) = vortex_env(&args, &[("VORTEX_MAX_ISA", cap)]);
        assert_eq!(code, 0, "{cap}: {err}");
        assert!(out.contains(want), "{cap}: {out}");
        assert!(out.contains("block_topk"), "{cap}: {out}");
    }
    // Capped below bf16, no pool's products run on bf16 pairs.
    let (code, out, err) = vortex_env(&args, &[("VORTEX_MAX_ISA", "avx512")]);
    assert_eq!(code, 0, "avx512: {err}");
    assert!(!out.contains("bf16 pairs"), "avx512: {out}");
    let (code, _, err) = vortex_env(&args, &[("VORTEX_MAX_ISA", "avx9")]);
    assert_eq!(code, 0);
    assert!(err.contains("VORTEX_MAX_ISA=\"avx9\" is none of"), "{err}");
}

/// `vortex bench decode` of dense attention on a tiny random model (`tag` names its folder),
/// 2 tokens decoded at `context`, with `extra` arguments: exit code, stdout and stderr.
fn bench_decode_tiny(tag: &str, context: &str, extra: &[&str]) -> (i32, String, String) {
    let dir = std::env::temp_dir().join(format!("vortex-bench-{tag}-{}", std::process::id()));
    let config = tiny_config(&dir);
    let mut args = vec![
        "bench",
        "decode",
        "--random-weights",
        config.to_str().unwrap(),
        "--context",
        context,
        "--flows",
        "dense",
        "--decode-tokens",
        "2",
    ];
    args.extend(extra);
    let result = vortex(&args);
    std::fs::remove_dir_all(&dir).unwrap();
    result
}

/// A context that leaves no room for the decoded tokens in the model's is measured shorter,
/// with a warning saying so.
#[test]
fn bench_decode_warns_when_it_shortens_the_context() {
    let (code, out, err) = bench_decode_tiny("context", "16k", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(
            "warning: --context 16384 and --decode-tokens 2 exceed the model's context of 2048 tokens; measuring a context of 2046 instead"
        ),
        "{err}"
    );
    assert!(out.contains(" 2046 dense"), "{out}");
}

/// `--weight-dtype q8_0` quantizes a model's float matrices when it loads, and says how many
/// bytes a token then reads.
#[test]
fn bench_decode_quantizes_float_weights_to_q8_0() {
    let (code, out, err) = bench_decode_tiny("q8", "64", &["--weight-dtype", "q8_0"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("weights: float matrices quantized to Q8_0"),
        "{err}"
    );
    assert!(out.contains("   64 dense"), "{out}");
}

/// The bench names the instruction set of the weight products, within `VORTEX_MAX_ISA`.
#[test]
fn bench_decode_names_its_products() {
    let dir = std::env::temp_dir().join(format!("vortex-bench-isa-{}", std::process::id()));
    let config = tiny_config(&dir);
    let args = [
        "bench",
        "decode",
        "--random-weights",
        config.to_str().unwrap(),
        "--context",
        "64",
        "--flows",
        "dense",
        "--decode-tokens",
        "2",
    ];
    let (code, out, err) = vortex_env(&args, &[("VORTEX_MAX_ISA", "scalar")]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("products: scalar\n"), "{out}");
}

/// A flow whose budget is below its always-kept pages, or that does not exist, is an error
/// that names the flag's tokens as well as the pages.
#[test]
fn bench_decode_checks_its_flows_first() {
    let dir = std::env::temp_dir().join(format!("vortex-bench-flows-{}", std::process::id()));
    let config = tiny_config(&dir);
    let config = config.to_str().unwrap();
    let common = [
        "bench",
        "decode",
        "--random-weights",
        config,
        "--context",
        "512",
    ];
    let with = |extra: &[&'static str]| [&common[..], extra].concat();
    assert_clean_failure(
        &with(&["--flows", "dense,quest", "--budget", "16"]),
        "quest: 'budget' is 1 page, but 'sinks' and 'recent' always keep 2: raise the budget or \
         lower them (--budget 16 tokens, in pages of 16 tokens)",
    );
    assert_clean_failure(
        &with(&["--flows", "dense,nosuch"]),
        "nosuch: 'nosuch' is neither a built-in flow",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `vortex serve --random-weights CONFIG.json` serves a model of that shape with nothing to
/// download: the address it prints answers a completion of the tokens asked for, and the
/// model is named after the geometry.
#[test]
fn serve_random_weights_answers_requests() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};

    let dir = std::env::temp_dir().join(format!("vortex-serve-random-{}", std::process::id()));
    let config = tiny_config(&dir);
    let config = config.to_str().unwrap();
    // Refused at start-up, before any request: a dense layer the model lacks, an unusable key.
    assert_clean_failure(
        &["serve", "--random-weights", config, "--dense-layers", "1,2"],
        "dense layer 2 does not exist; the model has 2 layers",
    );
    assert_clean_failure(
        &["serve", "--random-weights", config, "--api-key", ""],
        "--api-key",
    );
    let mut server = Command::new(env!("CARGO_BIN_EXE_vortex"))
        .args(["serve", "--random-weights", config, "--host", "localhost"])
        .args(["--port", "0", "--kv-pages", "64", "--quiet"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            let at = l.find("http://")? + "http://".len();
            Some(l[at..].split_whitespace().next()?.to_string())
        })
        .expect("the server prints its address");
    let body = r#"{"prompt": [5, 6, 7, 8], "max_tokens": 5, "temperature": 0}"#;
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains(r#""completion_tokens":5"#), "{reply}");
    assert!(reply.contains(r#""prompt_tokens":4"#), "{reply}");
    assert!(reply.contains("random "), "{reply}");
}

/// A 2-layer qwen3 `config.json` in `dir`, for random weights.
fn tiny_config(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 300, "max_position_embeddings": 2048,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": true}"#,
    )
    .unwrap();
    config
}
