//! Diagnostics: every error in a flow points at a place in its text.

use std::fmt;

/// Characters of the offending line a rendered diagnostic shows.
pub const SHOWN_CHARS: usize = 120;

/// A place in a flow's text: 1-based line and column, and a length in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub line: usize,
    pub col: usize,
    pub len: usize,
}

impl Span {
    pub fn new(line: usize, col: usize, len: usize) -> Self {
        Self {
            line,
            col,
            len: len.max(1),
        }
    }

    /// The smallest span covering `self` and `other` when both are on one line.
    pub fn to(self, other: Span) -> Span {
        if self.line != other.line || other.col < self.col {
            return self;
        }
        Span::new(self.line, self.col, other.col + other.len - self.col)
    }
}

/// One error in a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub span: Span,
    pub message: String,
    /// What would have been accepted here.
    pub expected: Option<String>,
}

impl Diagnostic {
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        Self {
            span,
            message: message.into(),
            expected: None,
        }
    }

    pub fn expected(mut self, what: impl Into<String>) -> Self {
        self.expected = Some(what.into());
        self
    }

    /// `file:line:col: error: message`, the offending line (at most [`SHOWN_CHARS`] of it), a
    /// caret under the place, and what was expected.
    pub fn render(&self, file: &str, source: &str) -> String {
        let Span { line, col, len } = self.span;
        let mut out = format!("{file}:{line}:{col}: error: {}\n", self.message);
        if let Some(text) = source.lines().nth(line.saturating_sub(1)) {
            let gutter = format!("{line}");
            let pad = " ".repeat(gutter.len());
            // A long line shows the characters around the place, `…` where it is cut.
            let chars: Vec<char> = text.chars().collect();
            let at = col.saturating_sub(1).min(chars.len());
            let start = match chars.len() > SHOWN_CHARS {
                true => at.saturating_sub(SHOWN_CHARS / 2),
                false => 0,
            };
            let end = (start + SHOWN_CHARS).min(chars.len());
            let shown: String = chars[start..end]
                .iter()
                .map(|&c| match c.is_control() && c != '\t' {
                    true => '\u{fffd}',
                    false => c,
                })
                .collect();
            let (lead, trail) = (
                if start > 0 { "…" } else { "" },
                if end < chars.len() { "…" } else { "" },
            );
            out.push_str(&format!("{pad} |\n{gutter} | {lead}{shown}{trail}\n"));
            let caret_pad: String = " ".repeat(lead.chars().count())
                + &chars[start..at.max(start)]
                    .iter()
                    .map(|&c| if c == '\t' { '\t' } else { ' ' })
                    .collect::<String>();
            let carets = len.clamp(1, (end - at.min(end)).max(1));
            out.push_str(&format!("{pad} | {caret_pad}{}", "^".repeat(carets)));
            if let Some(e) = &self.expected {
                out.push_str(&format!(" expected {e}"));
            }
            out.push('\n');
        } else if let Some(e) = &self.expected {
            out.push_str(&format!("  expected {e}\n"));
        }
        out
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.span.line, self.span.col, self.message)?;
        if let Some(e) = &self.expected {
            write!(f, " (expected {e})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}

/// All errors found in one flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowError {
    pub file: String,
    pub source: String,
    pub diagnostics: Vec<Diagnostic>,
}

impl FlowError {
    pub fn render(&self) -> String {
        self.diagnostics
            .iter()
            .map(|d| d.render(&self.file, &self.source))
            .collect()
    }
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.render().trim_end())
    }
}

impl std::error::Error for FlowError {}
