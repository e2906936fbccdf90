use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use vortex_kernels::quant::GgmlType;
use vortex_model::gguf::{GgufError, GgufFile, Value, ValueType};

/// A minimal GGUF writer: what the reader must undo.
struct Gguf {
    version: u32,
    kvs: Vec<(String, Value)>,
    /// Name, dims (innermost first), type id, data.
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    alignment: usize,
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as u64).to_le_bytes());
    buf.extend(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.push(*x as u8),
        Value::U16(x) => buf.extend(x.to_le_bytes()),
        Value::I16(x) => buf.extend(x.to_le_bytes()),
        Value::U32(x) => buf.extend(x.to_le_bytes()),
        Value::I32(x) => buf.extend(x.to_le_bytes()),
        Value::U64(x) => buf.extend(x.to_le_bytes()),
        Value::I64(x) => buf.extend(x.to_le_bytes()),
        Value::F32(x) => buf.extend(x.to_le_bytes()),
        Value::F64(x) => buf.extend(x.to_le_bytes()),
        Value::Bool(x) => buf.push(*x as u8),
        Value::String(s) => put_str(buf, s),
        Value::Array { elem, items } => {
            buf.extend(elem.id().to_le_bytes());
            buf.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(buf, item);
            }
        }
    }
}

impl Gguf {
    fn new() -> Self {
        Self {
            version: 3,
            kvs: vec![],
            tensors: vec![],
            alignment: 32,
        }
    }

    fn kv(mut self, key: &str, v: Value) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// The file, and the offset of each tensor's data within it.
    fn build_with_offsets(&self) -> (Vec<u8>, Vec<usize>) {
        let mut buf = b"GGUF".to_vec();
        buf.extend(self.version.to_le_bytes());
        buf.extend((self.tensors.len() as u64).to_le_bytes());
        buf.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut buf, k);
            buf.extend(v.value_type().id().to_le_bytes());
            put_value(&mut buf, v);
        }
        let mut offset = 0;
        let mut offsets = vec![];
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut buf, name);
            buf.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                buf.extend(d.to_le_bytes());
            }
            buf.extend(ty.to_le_bytes());
            buf.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).next_multiple_of(self.alignment);
        }
        buf.resize(buf.len().next_multiple_of(self.alignment), 0);
        let start = buf.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(&offsets) {
            buf.resize(start + off, 0);
            buf.extend(data);
        }
        (buf, offsets.iter().map(|o| start + o).collect())
    }

    fn build(&self) -> Vec<u8> {
        self.build_with_offsets().0
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// A Q8_0 matrix of `rows` rows of 32: row `r` is `d = 0.5`, values `r - 16 + j`.
fn q8_0_rows(rows: usize) -> Vec<u8> {
    let mut out = vec![];
    for r in 0..rows {
        out.extend(f16_bytes(0.5));
        out.extend((0..32).map(|j| (r as i32 - 16 + j) as i8 as u8));
    }
    out
}

fn sample_metadata() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("tiny ünïcode ✓".into())),
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-100)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-30000)),
        ("llama.context_length", Value::U32(8192)),
        ("i32", Value::I32(-7)),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("llama.rope.freq_base", Value::F32(100000.0)),
        ("f64", Value::F64(1e-300)),
        ("bool", Value::Bool(true)),
        (
            "tokenizer.ggml.tokens",
            Value::Array {
                elem: ValueType::String,
                items: ["<s>", "a", "", "ü"]
                    .map(|s| Value::String(s.into()))
                    .to_vec(),
            },
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array {
                elem: ValueType::I32,
                items: vec![Value::I32(3), Value::I32(1), Value::I32(-1)],
            },
        ),
        (
            "tokenizer.ggml.scores",
            Value::Array {
                elem: ValueType::F32,
                items: vec![Value::F32(0.0), Value::F32(-1.5)],
            },
        ),
        (
            "empty",
            Value::Array {
                elem: ValueType::U64,
                items: vec![],
            },
        ),
        (
            "nested",
            Value::Array {
                elem: ValueType::Array,
                items: vec![
                    Value::Array {
                        elem: ValueType::U8,
                        items: vec![Value::U8(1), Value::U8(2)],
                    },
                    Value::Array {
                        elem: ValueType::String,
                        items: vec![Value::String("x".into())],
                    },
                ],
            },
        ),
    ]
}

fn sample() -> Gguf {
    let mut g = Gguf::new();
    for (k, v) in sample_metadata() {
        g = g.kv(k, v);
    }
    let norm: Vec<u8> = [1.0f32, -2.0, 0.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let q4k = vec![0u8; 144 * 2];
    g.tensor("output_norm.weight", &[3], 0, norm)
        .tensor(
            "blk.0.attn_q.weight",
            &[32, 5],
            GgmlType::Q8_0.id(),
            q8_0_rows(5),
        )
        .tensor("blk.0.ffn_down.weight", &[256, 2], GgmlType::Q4_K.id(), q4k)
        // A known type the kernels do not support.
        .tensor("q5_1", &[32], 7, vec![0; 24])
}

static FILES: AtomicUsize = AtomicUsize::new(0);

/// Writes `bytes` to a fresh temporary file.
fn temp_file(bytes: &[u8]) -> PathBuf {
    let n = FILES.fetch_add(1, Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("vortex-gguf-test-{}-{n}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn round_trip_through_a_mapped_file() {
    let (bytes, data_offsets) = sample().build_with_offsets();
    let path = temp_file(&bytes);
    let f = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();

    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    let expected = sample_metadata();
    assert_eq!(f.metadata().len(), expected.len());
    for ((k, v), (ek, ev)) in f.metadata().iter().zip(&expected) {
        assert_eq!((k.as_str(), v), (*ek, ev));
        assert_eq!(f.get(k), Some(ev));
    }

    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_str("general.name").unwrap(), "tiny ünïcode ✓");
    assert_eq!(f.get_u64("llama.context_length").unwrap(), 8192);
    assert_eq!(f.get_usize("u16").unwrap(), 60000);
    assert_eq!(f.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(f.get_i64("i64").unwrap(), i64::MIN);
    assert_eq!(f.get_i64("i8").unwrap(), -100);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(f.get_f32("f64").unwrap(), 1e-300f64 as f32);
    assert!(f.get_bool("bool").unwrap());
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap(),
        ["<s>", "a", "", "ü"]
    );
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        [3, 1, -1]
    );
    assert_eq!(
        f.get_f32_array("tokenizer.ggml.scores").unwrap(),
        [0.0, -1.5]
    );
    assert_eq!(f.get_u64_array("empty").unwrap(), Vec::<u64>::new());
    assert_eq!(f.get_array("nested").unwrap().len(), 2);

    assert!(matches!(f.get_u64("i32"), Err(GgufError::WrongType { .. })));
    assert!(matches!(f.get_str("u8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(
        f.get_i32_array("tokenizer.ggml.scores"),
        Err(GgufError::WrongType { .. })
    ));
    let missing = f.get_u64("llama.block_count").unwrap_err();
    assert_eq!(
        missing.to_string(),
        "missing metadata key \"llama.block_count\""
    );
    let wrong = f.get_u64("general.name").unwrap_err().to_string();
    assert_eq!(
        wrong,
        "metadata key \"general.name\": expected non-negative integer, found String"
    );

    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "output_norm.weight",
            "blk.0.attn_q.weight",
            "blk.0.ffn_down.weight",
            "q5_1"
        ]
    );
    for (t, &at) in f.tensors().iter().zip(&data_offsets) {
        let bytes_in_file = &bytes[at..at + t.size as usize];
        assert_eq!(f.tensor_bytes(t), bytes_in_file, "{}", t.name);
        assert_eq!(f.data_start() + t.offset, at as u64);
    }

    let norm = f.require_tensor("output_norm.weight").unwrap();
    assert_eq!(
        (norm.dims.as_slice(), norm.type_id, norm.size),
        (&[3u64][..], 0, 12)
    );
    assert_eq!(f.tensor_f32(norm).unwrap(), [1.0, -2.0, 0.5]);

    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.ggml_type().unwrap(), GgmlType::Q8_0);
    assert_eq!(q.elements(), 160);
    let m = f.matrix(q).unwrap();
    assert_eq!((m.ty(), m.rows(), m.cols()), (GgmlType::Q8_0, 5, 32));
    let mut row = vec![0.0; 32];
    m.dequantize_row(4, &mut row).unwrap();
    assert_eq!(row[0], 0.5 * (4.0 - 16.0));
    assert_eq!(row[31], 0.5 * (4.0 - 16.0 + 31.0));

    let k = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((k.type_name(), k.size), ("Q4_K", 288));
    assert_eq!(f.matrix(k).unwrap().rows(), 2);

    let unsupported = f.tensor("q5_1").unwrap();
    assert_eq!(unsupported.type_name(), "Q5_1");
    let err = unsupported.ggml_type().unwrap_err();
    assert!(matches!(
        err,
        GgufError::UnsupportedType {
            id: 7,
            name: "Q5_1",
            ..
        }
    ));
    assert!(
        err.to_string()
            .contains("Q5_1 (id 7), which is not supported")
    );
    assert!(f.matrix(unsupported).is_err());
    assert!(matches!(
        f.require_tensor("nope"),
        Err(GgufError::MissingTensor(_))
    ));
}

#[test]
fn versions_magic_and_io() {
    let mut g = sample();
    g.version = 2;
    assert_eq!(GgufFile::from_bytes(g.build()).unwrap().version(), 2);
    for v in [0, 1, 4, u32::MAX] {
        g.version = v;
        let err = GgufFile::from_bytes(g.build()).unwrap_err();
        assert!(
            matches!(err, GgufError::UnsupportedVersion(x) if x == v),
            "{err}"
        );
    }
    let mut bytes = sample().build();
    bytes[..4].copy_from_slice(b"GGML");
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(matches!(err, GgufError::BadMagic(m) if &m == b"GGML"));
    assert!(err.to_string().starts_with("not a GGUF file"));

    let err = GgufFile::open("/nonexistent/dir/model.gguf").unwrap_err();
    assert!(matches!(err, GgufError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/dir/model.gguf"));
    let empty = temp_file(&[]);
    let err = GgufFile::open(&empty).unwrap_err();
    std::fs::remove_file(&empty).unwrap();
    assert!(
        matches!(err, GgufError::Truncated { offset: 0, .. }),
        "{err}"
    );
}

#[test]
fn every_truncation_is_an_error() {
    let (bytes, offsets) = sample().build_with_offsets();
    for len in 0..bytes.len() {
        let err = GgufFile::from_bytes(bytes[..len].to_vec()).unwrap_err();
        // Cut within the directory: truncated; cut within the data: a tensor past the end.
        match err {
            GgufError::Truncated { offset, len: l, .. } => {
                assert_eq!(l, len as u64);
                assert!(offset <= len as u64);
            }
            GgufError::TooLarge { .. } => {}
            GgufError::DataOutOfBounds { end, len: l, .. } => {
                assert!(end > l && len >= offsets[0] - 32, "cut at {len}");
            }
            e => panic!("cut at {len}: unexpected {e}"),
        }
    }
    let err = GgufFile::from_bytes(bytes[..10].to_vec()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "truncated file: tensor count at offset 8 needs 8 bytes, the file ends at 10"
    );
}

/// The bytes of a file with one metadata value of type `ty` whose payload is `payload`.
fn with_raw_value(ty: u32, payload: &[u8]) -> Vec<u8> {
    let mut buf = b"GGUF".to_vec();
    buf.extend(3u32.to_le_bytes());
    buf.extend(0u64.to_le_bytes());
    buf.extend(1u64.to_le_bytes());
    put_str(&mut buf, "k");
    buf.extend(ty.to_le_bytes());
    buf.extend(payload);
    buf
}

#[test]
fn absurd_counts_and_lengths() {
    let mut bytes = sample().build();
    // Metadata count.
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = GgufFile::from_bytes(bytes.clone()).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::TooLarge {
                count: u64::MAX,
                ..
            }
        ),
        "{err}"
    );
    // Tensor count.
    let mut bytes = sample().build();
    bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::TooLarge { offset: 8, .. }),
        "{err}"
    );

    // String length.
    let err = GgufFile::from_bytes(with_raw_value(8, &u64::MAX.to_le_bytes())).unwrap_err();
    assert!(matches!(err, GgufError::TooLarge { .. }), "{err}");
    // Array lengths: beyond the limit, and beyond the file.
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend((1u64 << 62).to_le_bytes());
    let err = GgufFile::from_bytes(with_raw_value(9, &arr)).unwrap_err();
    assert!(matches!(err, GgufError::TooLarge { .. }), "{err}");
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend(1000u64.to_le_bytes());
    arr.extend([0; 40]);
    let err = GgufFile::from_bytes(with_raw_value(9, &arr)).unwrap_err();
    assert!(
        err.to_string()
            .contains("does not fit in the rest of the file"),
        "{err}"
    );

    // Value types.
    let err = GgufFile::from_bytes(with_raw_value(13, &[0; 8])).unwrap_err();
    assert!(
        matches!(err, GgufError::InvalidValueType { id: 13, offset: 33 }),
        "{err}"
    );
    // Nesting.
    let mut deep = vec![];
    for _ in 0..100 {
        deep.extend(9u32.to_le_bytes());
        deep.extend(1u64.to_le_bytes());
    }
    let err = GgufFile::from_bytes(with_raw_value(9, &deep)).unwrap_err();
    assert!(matches!(err, GgufError::NestingTooDeep { .. }), "{err}");
    // Invalid UTF-8.
    let mut s = 2u64.to_le_bytes().to_vec();
    s.extend([0xC3, 0x28]);
    let err = GgufFile::from_bytes(with_raw_value(8, &s)).unwrap_err();
    assert!(
        matches!(err, GgufError::InvalidUtf8 { offset: 37 }),
        "{err}"
    );
}

#[test]
fn directory_errors() {
    let dup = Gguf::new().kv("a", Value::U8(1)).kv("a", Value::U8(2));
    assert!(
        matches!(GgufFile::from_bytes(dup.build()), Err(GgufError::DuplicateKey(k)) if k == "a")
    );
    let dup = Gguf::new()
        .tensor("t", &[1], 0, vec![0; 4])
        .tensor("t", &[1], 0, vec![0; 4]);
    assert!(matches!(
        GgufFile::from_bytes(dup.build()),
        Err(GgufError::DuplicateTensor(_))
    ));

    let unknown = Gguf::new().tensor("t", &[32], 4, vec![0; 18]);
    let err = GgufFile::from_bytes(unknown.build()).unwrap_err();
    assert!(matches!(err, GgufError::UnknownType { id: 4, .. }));
    assert_eq!(err.to_string(), "tensor \"t\" has unknown ggml type id 4");

    let partial = Gguf::new().tensor("t", &[48, 2], GgmlType::Q4_0.id(), vec![0; 54]);
    let err = GgufFile::from_bytes(partial.build()).unwrap_err();
    assert!(
        err.to_string()
            .contains("row length 48 is not a multiple of the Q4_0 block size 32")
    );
    let five = Gguf::new().tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    assert!(matches!(
        GgufFile::from_bytes(five.build()),
        Err(GgufError::BadShape { .. })
    ));
    let overflow = Gguf::new().tensor("t", &[1 << 32, 1 << 32, 1 << 32], 0, vec![]);
    assert!(matches!(
        GgufFile::from_bytes(overflow.build()),
        Err(GgufError::BadShape { .. })
    ));

    // Data past the end: the last tensor claims more rows than the file holds.
    let mut short = Gguf::new().tensor("a", &[32, 4], GgmlType::Q8_0.id(), q8_0_rows(4));
    short.tensors[0].1[1] = 5;
    let err = GgufFile::from_bytes(short.build()).unwrap_err();
    assert!(matches!(err, GgufError::DataOutOfBounds { .. }), "{err}");
    assert!(err.to_string().contains("past the end of the file"));

    // Offsets must be multiples of the alignment.
    let mut bytes = Gguf::new().tensor("t", &[1], 0, vec![0; 4]).build();
    // Header, name "t", dimension count, one dimension, type; then the offset.
    let at = 24 + 8 + 1 + 4 + 8 + 4;
    bytes[at..at + 8].copy_from_slice(&4u64.to_le_bytes());
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::Misaligned {
                offset: 4,
                alignment: 32,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn alignment_key() {
    let mut g = sample().kv("general.alignment", Value::U32(64));
    g.alignment = 64;
    let (bytes, offsets) = g.build_with_offsets();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_start() % 64, 0);
    for (t, at) in f.tensors().iter().zip(offsets) {
        assert_eq!(f.tensor_bytes(t), &bytes[at..at + t.size as usize]);
    }
    for bad in [Value::U32(48), Value::U32(0), Value::U64(32)] {
        let g = Gguf::new().kv("general.alignment", bad);
        assert!(matches!(
            GgufFile::from_bytes(g.build()),
            Err(GgufError::BadAlignment(_))
        ));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Random byte changes, insertions, deletions and truncations of a valid file give a parse
    /// or an error, never a panic; when parsing succeeds, every tensor's bytes are in the file.
    #[test]
    fn mutations_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = sample().build();
        for (at, byte, kind) in edits {
            let i = at.index(bytes.len());
            match kind {
                0 => bytes[i] = byte,
                1 => bytes[i] ^= 1 << (byte % 8),
                2 => bytes.insert(i, byte),
                _ => { bytes.remove(i); }
            }
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            for t in f.tensors() {
                prop_assert_eq!(f.tensor_bytes(t).len() as u64, t.size);
                let _ = f.matrix(t);
                let _ = f.tensor_f32(t);
            }
            for (k, _) in f.metadata() {
                let _ = (f.get_str(k), f.get_u64(k), f.get_f32(k), f.get_str_array(k));
            }
        }
    }

    /// Arbitrary bytes behind a valid magic and version.
    #[test]
    fn random_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(body);
        let _ = GgufFile::from_bytes(bytes);
    }
}

/// Prints the metadata and tensors of a real model, if present:
/// `VORTEX_GGUF=path cargo test -p vortex-model --test gguf -- --ignored --nocapture`
/// (default path `/tmp/models/smollm2.gguf`).
#[test]
#[ignore]
fn real_model_listing() {
    let path = std::env::var("VORTEX_GGUF").unwrap_or_else(|_| "/tmp/models/smollm2.gguf".into());
    if !std::path::Path::new(&path).exists() {
        println!("{path} not found; skipping");
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    println!(
        "{path}: GGUF v{}, alignment {}, data at {}",
        f.version(),
        f.alignment(),
        f.data_start()
    );
    for (k, v) in f.metadata() {
        let shown = match v {
            Value::Array { elem, items } => {
                let head: Vec<String> = items.iter().take(4).map(|v| format!("{v:?}")).collect();
                format!(
                    "[{elem:?}; {}] {}{}",
                    items.len(),
                    head.join(", "),
                    if items.len() > 4 { ", ..." } else { "" }
                )
            }
            Value::String(s) if s.len() > 80 => format!(
                "{:?}... ({} bytes)",
                &s[..s.floor_char_boundary(80)],
                s.len()
            ),
            v => format!("{v:?}"),
        };
        println!("  {k} = {shown}");
    }
    let mut by_type = std::collections::BTreeMap::<&str, (usize, u64)>::new();
    for t in f.tensors() {
        println!(
            "  {:<32} {:>5} {:?} offset {} ({} bytes)",
            t.name,
            t.type_name(),
            t.dims,
            t.offset,
            t.size
        );
        let e = by_type.entry(t.type_name()).or_default();
        e.0 += 1;
        e.1 += t.size;
        if let Ok(ty) = t.ggml_type() {
            let mut row = vec![0.0; t.dims[0] as usize];
            let bytes = f.tensor_bytes(t);
            vortex_kernels::quant::dequantize_row(
                ty,
                &bytes[..ty.row_bytes(row.len()).unwrap()],
                &mut row,
            )
            .unwrap();
            assert!(row.iter().all(|v| v.is_finite()), "{}", t.name);
        }
    }
    println!("{} tensors: {by_type:?}", f.tensors().len());

    // The first quantized matrix times a random vector, against its dequantized f32 product.
    let t = f
        .tensors()
        .iter()
        .find(|t| t.dims.len() == 2 && t.type_name().starts_with('Q'))
        .unwrap();
    let m = f.matrix(t).unwrap();
    let w = f.tensor_f32(t).unwrap();
    let x: Vec<f32> = (0..m.cols())
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut out = vec![0.0; m.rows()];
    vortex_kernels::quant::matmul(&m, &x, 1, &mut out).unwrap();
    let (mut err2, mut ref2) = (0.0f64, 0.0f64);
    for (row, got) in w.chunks_exact(m.cols()).zip(&out) {
        let exact: f64 = row.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        err2 += (*got as f64 - exact).powi(2);
        ref2 += exact.powi(2);
    }
    let rel = (err2 / ref2).sqrt();
    println!(
        "{} ({} x {}, {}): matmul relative RMS error {rel:.2e}",
        t.name,
        m.rows(),
        m.cols(),
        t.type_name()
    );
    assert!(rel < 1e-2);
}
