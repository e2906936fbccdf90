//! Reading `*.safetensors` files (one or sharded) without copying: a JSON header, then raw
//! little-endian tensors.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StDtype {
    F32,
    F16,
    Bf16,
}

/// One tensor: where it lives, its dtype and shape.
#[derive(Debug, Clone)]
pub struct StTensor {
    pub map: Arc<Mmap>,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

impl StTensor {
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

/// Every tensor of a model folder, by name.
pub fn load_folder(dir: &Path) -> Result<BTreeMap<String, StTensor>, String> {
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<String> = if index.exists() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| format!("cannot read {}: {e}", index.display()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not valid JSON: {e}", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| format!("{} has no \"weight_map\"", index.display()))?;
        let mut f: Vec<String> = map
            .values()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect();
        // The shards are files of the folder itself, never paths that leave it.
        if let Some(bad) = f.iter().find(|n| {
            let p = Path::new(n.as_str());
            p.file_name().and_then(|x| x.to_str()) != Some(n.as_str())
        }) {
            return Err(format!(
                "{}: weight_map names {bad:?}, not a file of the folder",
                index.display()
            ));
        }
        f.sort();
        f.dedup();
        f
    } else {
        let mut f: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        f.sort();
        f
    };
    if files.is_empty() {
        return Err(format!("no .safetensors files in {}", dir.display()));
    }
    let mut out = BTreeMap::new();
    for f in files {
        out.extend(load_file(&dir.join(f))?);
    }
    Ok(out)
}

/// The tensors of one safetensors file.
pub fn load_file(path: &Path) -> Result<BTreeMap<String, StTensor>, String> {
    let ctx = |m: String| format!("{}: {m}", path.display());
    let file = File::open(path).map_err(|e| ctx(format!("cannot open: {e}")))?;
    // SAFETY: the file is opened read-only; as with any mmap, it must not be truncated while in use.
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(|e| ctx(format!("cannot map: {e}")))?);
    if map.len() < 8 {
        return Err(ctx("file too short for a safetensors header".into()));
    }
    let header_len = u64::from_le_bytes(map[..8].try_into().unwrap()) as usize;
    if header_len > map.len() - 8 || header_len > 100 << 20 {
        return Err(ctx(format!("header length {header_len} exceeds the file")));
    }
    let header: Value = serde_json::from_slice(&map[8..8 + header_len])
        .map_err(|e| ctx(format!("header is not valid JSON: {e}")))?;
    let obj = header
        .as_object()
        .ok_or_else(|| ctx("header is not a JSON object".into()))?;
    let data_start = 8 + header_len;
    let mut out = BTreeMap::new();
    for (name, t) in obj {
        if name == "__metadata__" {
            continue;
        }
        let dtype = match t.get("dtype").and_then(Value::as_str) {
            Some("F32") => StDtype::F32,
            Some("F16") => StDtype::F16,
            Some("BF16") => StDtype::Bf16,
            other => {
                return Err(ctx(format!(
                    "tensor {name}: unsupported dtype {other:?} (supported: F32, F16, BF16)"
                )));
            }
        };
        let shape: Vec<usize> = t
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect()
            })
            .ok_or_else(|| ctx(format!("tensor {name}: no shape of whole numbers")))?;
        let offs: Vec<usize> = t
            .get("data_offsets")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_u64().map(|d| d as usize))
                    .collect()
            })
            .unwrap_or_default();
        let [s, e] = offs[..] else {
            return Err(ctx(format!("tensor {name}: bad data_offsets")));
        };
        let elem = if dtype == StDtype::F32 { 4 } else { 2 };
        let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if e < s
            || e > map.len().saturating_sub(data_start)
            || count.and_then(|c| c.checked_mul(elem)) != Some(e - s)
        {
            return Err(ctx(format!(
                "tensor {name}: data does not match its shape or the file"
            )));
        }
        out.insert(
            name.clone(),
            StTensor {
                map: map.clone(),
                dtype,
                shape,
                start: data_start + s,
                end: data_start + e,
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_naming_files_outside_the_folder_is_refused() {
        let dir = std::env::temp_dir().join(format!("vortex-st-index-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for bad in ["../model.safetensors", "/etc/hostname", "sub/a.safetensors"] {
            let index = serde_json::json!({"weight_map": {"w": "a.safetensors", "v": bad}});
            std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
            let err = load_folder(&dir).unwrap_err();
            assert!(err.contains("not a file of the folder"), "{bad}: {err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_shape_of_anything_but_whole_numbers_is_refused() {
        let dir = std::env::temp_dir().join(format!("vortex-st-shape-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.safetensors");
        for (shape, ok) in [("[2, 2]", true), ("[4, -1]", false), ("[4, 1.5]", false)] {
            let header = format!(
                r#"{{"w": {{"dtype": "F32", "shape": {shape}, "data_offsets": [0, 16]}}}}"#
            );
            let mut file = (header.len() as u64).to_le_bytes().to_vec();
            file.extend_from_slice(header.as_bytes());
            file.extend_from_slice(&[0u8; 16]);
            std::fs::write(&path, file).unwrap();
            match load_file(&path) {
                Ok(t) => assert!(ok, "{shape}: {:?}", t["w"].shape),
                Err(e) => assert!(!ok && e.contains("whole numbers"), "{shape}: {e}"),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
