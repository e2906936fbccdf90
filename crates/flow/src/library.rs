//! The built-in flows, shipped inside the binary as flow files.

use crate::{Flow, FlowError, Geometry, compile};

/// `(name, source)` of every built-in flow.
pub const BUILTIN: [(&str, &str); 10] = [
    ("dense", include_str!("../flows/dense.flow")),
    ("streaming", include_str!("../flows/streaming.flow")),
    ("block_topk", include_str!("../flows/block_topk.flow")),
    (
        "block_topk_fp8",
        include_str!("../flows/block_topk_fp8.flow"),
    ),
    ("quest", include_str!("../flows/quest.flow")),
    ("quest_fp8", include_str!("../flows/quest_fp8.flow")),
    ("double_sparse", include_str!("../flows/double_sparse.flow")),
    ("h2o", include_str!("../flows/h2o.flow")),
    ("lsh", include_str!("../flows/lsh.flow")),
    ("global_local", include_str!("../flows/global_local.flow")),
];

/// The source of a built-in flow.
pub fn builtin_source(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Error from [`load`]: neither a built-in name nor a readable file, or a flow that fails to check.
#[derive(Debug)]
pub enum LoadError {
    NotFound(String),
    Flow(FlowError),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NotFound(msg) => f.write_str(msg),
            LoadError::Flow(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// Loads a flow by built-in name or file path and checks it for `geometry`.
pub fn load(name_or_path: &str, geometry: Geometry) -> Result<Flow, LoadError> {
    if let Some(src) = builtin_source(name_or_path) {
        return compile(&format!("<builtin>/{name_or_path}.flow"), src, geometry)
            .map_err(LoadError::Flow);
    }
    match read_source(name_or_path) {
        Ok(src) => compile(name_or_path, &src, geometry).map_err(LoadError::Flow),
        Err(e) => {
            let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
            Err(LoadError::NotFound(format!(
                "'{name_or_path}' is neither a built-in flow ({}) nor a readable file: {e}",
                names.join(", ")
            )))
        }
    }
}

/// A flow file's text, read no further than the lexer accepts (the path may be a device or a
/// pipe).
pub fn read_source(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(crate::lexer::MAX_SOURCE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > crate::lexer::MAX_SOURCE_BYTES {
        // Cut anywhere, perhaps inside a character: the lexer refuses it as too long.
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// Whether `flow` is the built-in flow of its name in its geometry (not a file that reuses the
/// name): the same cache and index phases over the same fields. Its constants and settings may
/// differ, as an override leaves them.
pub fn is_builtin(flow: &Flow) -> bool {
    builtin_source(&flow.name).is_some()
        && load(&flow.name, flow.geometry).is_ok_and(|b| {
            b.cache == flow.cache && b.index == flow.index && b.fields == flow.fields
        })
}

#[cfg(test)]
mod tests {
    use super::{BUILTIN, is_builtin, load};
    use crate::Geometry;

    #[test]
    fn builtins_are_builtin_and_a_changed_graph_is_not() {
        for (name, _) in BUILTIN {
            assert!(
                is_builtin(&load(name, Geometry::default()).unwrap()),
                "{name}"
            );
        }
        // Quest's index phase under block_topk's name.
        let mut f = load("quest", Geometry::default()).unwrap();
        f.name = "block_topk".into();
        assert!(!is_builtin(&f));
    }
}
