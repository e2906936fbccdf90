//! Bounds on what one call in a chat template may build. A template comes from the model's
//! files; fuel bounds how long it runs, but a single `indent` or format width may ask for
//! terabytes, which the allocator answers by aborting the process.

use minijinja::value::{Kwargs, Rest, StringInput, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

/// The widest indent, field width or precision a template may ask for.
pub const MAX_WIDTH: usize = 4096;

/// Replaces `indent` and `format`, and the Python `str.format` method, by versions that refuse
/// widths past [`MAX_WIDTH`].
pub fn install(env: &mut Environment<'_>) {
    env.add_filter("indent", indent);
    env.add_filter("format", format);
    env.set_unknown_method_callback(method);
}

fn too_wide(what: &str, n: usize) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("{what} {n} is wider than the {MAX_WIDTH} a chat template may ask for"),
    )
}

fn indent(
    value: StringInput<'_>,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let w = match width {
        Some(w) => Some(w),
        None => kwargs.get::<Option<usize>>("width")?,
    };
    if let Some(w) = w.filter(|&w| w > MAX_WIDTH) {
        return Err(too_wide("an indent of", w));
    }
    minijinja::filters::indent(value, w, first, blank, kwargs)
}

fn format(state: &State, format_str: &Value, args: Rest<Value>) -> Result<Value, Error> {
    if let Some(s) = format_str.as_str() {
        check_printf(s)?;
    }
    minijinja::filters::format(state, format_str, args)
}

fn method(state: &State, value: &Value, name: &str, args: &[Value]) -> Result<Value, Error> {
    if value.kind() == ValueKind::String && name == "format" {
        check_str_format(value.as_str().unwrap_or(""))?;
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, name, args)
}

/// Every width and precision of a printf-style format (`%-10.3f`, `%(name)5s`).
fn check_printf(s: &str) -> Result<(), Error> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            i += 1;
            continue;
        }
        i += 1;
        if b.get(i) == Some(&b'(') {
            while i < b.len() && b[i] != b')' {
                i += 1;
            }
            i += 1;
        }
        while i < b.len() && b"-+ #0".contains(&b[i]) {
            i += 1;
        }
        i = check_number(b, i, "a field width of")?;
        if b.get(i) == Some(&b'.') {
            i = check_number(b, i + 1, "a precision of")?;
        }
        i += 1;
    }
    Ok(())
}

/// Every number in the format specs of a `str.format` string (`{:>10}`, `{0:.3f}`).
fn check_str_format(s: &str) -> Result<(), Error> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'{' && b.get(i + 1) == Some(&b'{') {
            i += 2;
            continue;
        }
        if b[i] != b'{' {
            i += 1;
            continue;
        }
        let end = b[i..]
            .iter()
            .position(|&c| c == b'}')
            .map_or(b.len(), |p| i + p);
        if let Some(colon) = b[i..end].iter().position(|&c| c == b':') {
            let mut j = i + colon + 1;
            while j < end {
                j = check_number(b, j, "a field width or precision of")? + 1;
            }
        }
        i = end + 1;
    }
    Ok(())
}

/// The end of the decimal number starting at `i` (or `i`), refused past [`MAX_WIDTH`].
fn check_number(b: &[u8], mut i: usize, what: &str) -> Result<usize, Error> {
    let start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i > start {
        // More digits than a usize holds is past the limit too.
        let n = std::str::from_utf8(&b[start..i])
            .ok()
            .and_then(|d| d.parse::<usize>().ok())
            .unwrap_or(usize::MAX);
        if n > MAX_WIDTH {
            return Err(too_wide(what, n));
        }
    }
    Ok(i)
}
