//! The `vortex` commands the user documentation shows must parse: every line of a shell block
//! (fenced with no language, `sh` or `bash`) of README.md, EVAL.md and docs/ that runs
//! `vortex`, after environment variables or `nice`, is parsed as the binary parses its
//! arguments, so a flag renamed or a value format changed breaks this test, not a reader's
//! first try. BENCHMARKS.md records the commands of their day and is left as written.

use clap::{CommandFactory, FromArgMatches};

use crate::{Cli, negatives_as_values};

const DOCS: [&str; 5] = [
    "README.md",
    "EVAL.md",
    "docs/FLOWS.md",
    "docs/SERVING.md",
    "docs/ARCHITECTURE.md",
];

/// The `vortex` commands of `text`'s shell blocks, as argument lists, with their line numbers.
fn commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let mut shell = None;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(fence) = line.trim_start().strip_prefix("```") {
            shell = match shell {
                Some(_) => None,
                None => Some(matches!(fence.trim(), "" | "sh" | "bash")),
            };
            continue;
        }
        if shell != Some(true) {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        match line.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                pending = Some((start, joined));
            }
            None => {
                joined.push_str(line);
                if let Some(args) = vortex_args(&joined) {
                    found.push((start, args));
                }
            }
        }
    }
    found
}

/// The arguments of `line` when it runs `vortex` (after `NAME=value` words or `nice -n N`),
/// up to a comment, pipe, redirection or command separator.
fn vortex_args(line: &str) -> Option<Vec<String>> {
    let words = shell_words(line);
    let mut rest = words.as_slice();
    loop {
        match rest {
            [first, tail @ ..] if first.contains('=') && !first.starts_with('-') => rest = tail,
            [nice, flag, _, tail @ ..] if nice == "nice" && flag == "-n" => rest = tail,
            [first, ..] if first == "vortex" => return Some(rest.to_vec()),
            _ => return None,
        }
    }
}

/// `line` split into words as a POSIX shell splits it (quotes removed), ending at an unquoted
/// `#` that starts a word, `|`, `>`, `<`, `;` or `&`.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_default().push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_default();
            }
            (None, '#') if word.is_none() => break,
            (None, '|' | '>' | '<' | ';' | '&') => break,
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    words
}

#[test]
fn documented_commands_parse() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut checked = 0;
    let mut failures = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(format!("{root}/{doc}")).unwrap();
        for (line, args) in commands(&text) {
            checked += 1;
            let parsed = negatives_as_values(Cli::command())
                .try_get_matches_from(&args)
                .and_then(|m| Cli::from_arg_matches(&m));
            if let Err(e) = parsed {
                let e = e.to_string();
                let first = e.lines().next().unwrap_or_default();
                failures.push(format!("{doc}:{line}: `{}`: {first}", args.join(" ")));
            }
        }
    }
    assert!(checked >= 40, "only {checked} documented commands found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn shell_words_split_as_a_shell_does() {
    let words = shell_words(r#"vortex generate --prompt "a b # c" --flow 'x y'  # a note"#);
    assert_eq!(
        words,
        ["vortex", "generate", "--prompt", "a b # c", "--flow", "x y"]
    );
    assert_eq!(shell_words("a --b=c#d | e > f"), ["a", "--b=c#d"]);
    assert_eq!(shell_words(r#"--x """#), ["--x", ""]);
}

#[test]
fn commands_are_found_after_prefixes_and_across_continued_lines() {
    let text = "```sh\nVORTEX_MAX_ISA=avx2 vortex bench attention\nls\n```\n\
                ```json\nvortex not a shell block\n```\n\
                ```\nnice -n 19 vortex eval \\\n  --lengths 2k\n```\nvortex outside a block\n";
    let found = commands(text);
    assert_eq!(
        found,
        [
            (2, vec!["vortex".into(), "bench".into(), "attention".into()]),
            (
                9,
                ["vortex", "eval", "--lengths", "2k"]
                    .map(String::from)
                    .to_vec()
            ),
        ]
    );
}
