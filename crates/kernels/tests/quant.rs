use std::time::Instant;

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vortex_kernels::bandwidth::measure_read_bandwidth;
use vortex_kernels::quant::{
    GgmlType, Isa, IsaLevel, QMatrix, QuantError, RowGroups, dequantize_row, matmul, matmul_many,
    matmul_many_with, matmul_with, type_layout,
};

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// One row of `cols` elements of random but valid `ty` blocks: scales in a realistic range,
/// every quant bit pattern possible.
fn random_row(rng: &mut StdRng, ty: GgmlType, cols: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(ty.row_bytes(cols).unwrap());
    fn bytes(rng: &mut StdRng, out: &mut Vec<u8>, k: usize) {
        out.extend((0..k).map(|_| rng.random::<u8>()));
    }
    for _ in 0..cols / ty.block_size() {
        match ty {
            GgmlType::F32 => {
                let v: f32 = rng.random_range(-1.0..1.0);
                out.extend(v.to_le_bytes());
            }
            GgmlType::F16 => out.extend(f16_bytes(rng.random_range(-1.0..1.0))),
            GgmlType::BF16 => out.extend(bf16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes()),
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
                out.extend(f16_bytes(rng.random_range(0.001..0.1)));
                bytes(rng, &mut out, ty.block_bytes() - 2);
            }
            GgmlType::Q4_1 => {
                out.extend(f16_bytes(rng.random_range(0.001..0.1)));
                out.extend(f16_bytes(rng.random_range(-0.5..0.5)));
                bytes(rng, &mut out, 16);
            }
            GgmlType::Q4_K => {
                out.extend(f16_bytes(rng.random_range(0.0001..0.01)));
                out.extend(f16_bytes(rng.random_range(0.0001..0.01)));
                bytes(rng, &mut out, 12 + 128);
            }
            GgmlType::Q6_K => {
                bytes(rng, &mut out, 208);
                out.extend(f16_bytes(rng.random_range(0.0001..0.01)));
            }
        }
    }
    out
}

fn random_matrix(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows).flat_map(|_| random_row(rng, ty, cols)).collect()
}

fn dequantize(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows * cols];
    let rb = ty.row_bytes(cols).unwrap();
    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
        dequantize_row(ty, &data[r * rb..(r + 1) * rb], o).unwrap();
    }
    out
}

/// Elements per activation block the kernels quantize to 8 bits (0: activations stay f32).
fn act_block(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 0,
        GgmlType::Q4_K | GgmlType::Q6_K => 256,
        _ => 32,
    }
}

/// Test-side model of the activation quantization: per block `d = max|x| / 127`,
/// `q = round_half_even(x * (1 / d))`. Returns the dequantized activations and each element's
/// step `d`.
fn emulate_q8(x: &[f32], block: usize) -> (Vec<f32>, Vec<f32>) {
    if block == 0 {
        return (x.to_vec(), vec![0.0; x.len()]);
    }
    let mut deq = Vec::with_capacity(x.len());
    let mut step = Vec::with_capacity(x.len());
    for blk in x.chunks(block) {
        let d = blk.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for &v in blk {
            deq.push((v * id).round_ties_even() * d);
            step.push(d);
        }
    }
    (deq, step)
}

/// Checks `matmul_with(isa)` against f64 products of the dequantized weights.
///
/// Two references:
/// - with the activations quantized the way the kernels do it (emulated above), the products
///   differ only by f32 rounding and summation order: within 1e-5 of `Σ |w x|`.
/// - with the exact f32 activations, each product is also off by the activation rounding,
///   at most half a step per element: `Σ |w_i| d_i / 2`. Over many outputs (where cancellation
///   in single products averages out) the relative RMS error must stay below 1e-2: rounding to
///   1/127 of a block's maximum is an error of about `max / (127 sqrt 12)` per element, about
///   0.4% of the RMS of the uniform data used here, and products inherit that relative error.
///
/// Float weight types use f32 activations, so both references coincide (tolerance 1e-5 of
/// `Σ |w x|`), except bf16 weights on bf16 pairs, whose activations are rounded to bf16
/// ([`emulate_acts`]).
fn check_product(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize, n: usize) {
    let data = random_matrix(rng, ty, rows, cols);
    let mut x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
    // One token of all zeros (a zero block scale) when there are several.
    if n > 2 {
        x[cols..2 * cols].fill(0.0);
    }
    check_product_of(ty, rows, cols, &data, &x);
}

/// [`check_product`] of the matrix `data` and the tokens `x`.
fn check_product_of(ty: GgmlType, rows: usize, cols: usize, data: &[u8], x: &[f32]) {
    let n = x.len() / cols;
    let w = QMatrix::new(ty, rows, cols, data).unwrap();
    let wf = dequantize(ty, data, rows, cols);
    let block = act_block(ty);
    let mut exact = vec![0.0f64; n * rows];
    for t in 0..n {
        for r in 0..rows {
            exact[t * rows + r] = (0..cols)
                .map(|c| wf[r * cols + c] as f64 * x[t * cols + c] as f64)
                .sum();
        }
    }

    let groups = RowGroups::new(&w);
    let grouped = groups.as_ref().map(|g| w.with_groups(g).unwrap());
    for (isa, w) in Isa::all_supported().into_iter().flat_map(|isa| {
        [Some(w), grouped]
            .into_iter()
            .flatten()
            .map(move |w| (isa, w))
    }) {
        let (xq, step) = emulate_acts(isa, ty, x);
        let mut emulated = vec![0.0f64; n * rows];
        let mut magnitude = vec![0.0f64; n * rows];
        let mut bound = vec![0.0f64; n * rows];
        for t in 0..n {
            for r in 0..rows {
                let o = t * rows + r;
                for c in 0..cols {
                    let (wv, i) = (wf[r * cols + c] as f64, t * cols + c);
                    emulated[o] += wv * xq[i] as f64;
                    magnitude[o] += (wv * x[i] as f64).abs() + (wv * xq[i] as f64).abs();
                    bound[o] += wv.abs() * step[i] as f64 / 2.0;
                }
            }
        }
        let mut out = vec![f32::NAN; n * rows];
        matmul_with(isa, &w, x, n, &mut out).unwrap();
        let ctx = format!(
            "{ty} {:?} (bf16 pairs {}) rows {rows} cols {cols} n {n}, grouped {}",
            isa.level(),
            isa.bf16_pairs(),
            w.grouped()
        );
        let (mut err2, mut ref2) = (0.0f64, 0.0f64);
        for o in 0..n * rows {
            let got = out[o] as f64;
            let slop = 1e-5 * magnitude[o] + 1e-6;
            assert!(
                (got - emulated[o]).abs() <= slop,
                "{ctx}: out[{o}] = {got}, emulated reference {}",
                emulated[o]
            );
            assert!(
                (got - exact[o]).abs() <= bound[o] * 1.0001 + slop,
                "{ctx}: out[{o}] = {got}, exact {} beyond the rounding bound {}",
                exact[o],
                bound[o]
            );
            err2 += (got - exact[o]).powi(2);
            ref2 += exact[o].powi(2);
        }
        let rel = (err2 / ref2.max(1e-30)).sqrt();
        if block != 0 && n * rows >= 64 {
            assert!(rel <= 1e-2, "{ctx}: relative RMS error {rel}");
        }
    }
}

/// The activations `isa`'s products of `ty` weights take, and each element's step: 8-bit blocks
/// ([`emulate_q8`]), or bf16 where bf16 weights take the pair products (rounded to nearest even,
/// off by at most half a unit in the last place, which is at most `|x| 2^-8`: a step of
/// `|x| / 128`).
fn emulate_acts(isa: Isa, ty: GgmlType, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    if ty == GgmlType::BF16 && isa.bf16_pairs() {
        let rounded = x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        return (rounded, x.iter().map(|v| v.abs() / 128.0).collect());
    }
    emulate_q8(x, act_block(ty))
}

#[test]
fn matmul_matches_dequantized_reference() {
    let mut rng = StdRng::seed_from_u64(7);
    for ty in GgmlType::ALL {
        let bs = ty.block_size().max(256);
        let mut shapes = vec![
            (1, bs, 1),
            (7, 2 * bs, 3),
            (37, bs, 17),
            // Large enough to run in parallel, rows not a multiple of the task size.
            (1001, 4 * bs, 1),
            (333, 4 * bs, 3),
            (150, 4 * bs, 17),
            // More tokens than a call (8), not a multiple of it.
            (45, bs, 70),
        ];
        match ty.block_size() {
            // Rows of any length.
            1 => shapes.extend([(5, 77, 3), (400, 1001, 2), (3, 15, 5)]),
            // Odd numbers of blocks (the activations pair blocks up).
            32 => shapes.extend([(9, 32, 2), (5, 96, 5), (601, 32 * 33, 1), (300, 32 * 33, 6)]),
            _ => {}
        }
        for (rows, cols, n) in shapes {
            check_product(&mut rng, ty, rows, cols, n);
        }
    }
}

/// Every value at its format's largest (or, in odd rows, smallest) against activations all at
/// +127 or all at -127 once quantized: the kernels' integer sums, some held in 16 bits, stay
/// exact.
#[test]
fn extreme_values_stay_exact() {
    let mut rng = StdRng::seed_from_u64(11);
    for ty in GgmlType::ALL.into_iter().filter(|ty| ty.block_size() > 1) {
        let (rows, cols) = (24, 512);
        let mut data = random_matrix(&mut rng, ty, rows, cols);
        let (bb, rb) = (ty.block_bytes(), ty.row_bytes(cols).unwrap());
        for (r, row) in data.chunks_exact_mut(rb).enumerate() {
            let (value, low) = match ty {
                GgmlType::Q8_0 => (0x7f, 0x80),
                _ => (0xff, 0x00),
            };
            let v = if r % 2 == 0 { value } else { low };
            for b in row.chunks_exact_mut(bb) {
                // Every byte but the scales `d` (and Q4_1's `m`, Q4_K's `dmin`): ggml's layouts
                // put them first, Q6_K's last; the K-quants' sub-block scales at their largest.
                let values = match ty {
                    GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => 2..bb,
                    GgmlType::Q4_1 => 4..bb,
                    GgmlType::Q4_K => 4..bb,
                    _ => 0..bb - 2,
                };
                b[values].fill(v);
                match ty {
                    GgmlType::Q4_K => b[4..16].fill(0xff),
                    GgmlType::Q6_K => b[192..208].fill(0x7f),
                    _ => {}
                }
            }
        }
        let mut x = vec![1.0f32; 3 * cols];
        x[cols..2 * cols].fill(-1.0);
        x[2 * cols..].iter_mut().step_by(2).for_each(|v| *v = -1.0);
        check_product_of(ty, rows, cols, &data, &x);
    }
}

/// A token's product is the same to the bit alone as among other tokens, in any position of a
/// batch of any size, for every weight type and instruction set: a sequence's logits do not
/// depend on its batch.
#[test]
fn a_token_is_the_same_alone_as_in_a_batch() {
    let mut rng = StdRng::seed_from_u64(31);
    for ty in GgmlType::ALL {
        let cols = ty.block_size().max(256) * 2 + if ty.block_size() == 1 { 13 } else { 0 };
        let rows = 300;
        let data = random_matrix(&mut rng, ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let groups = RowGroups::new(&w);
        let grouped = groups.as_ref().map(|g| w.with_groups(g).unwrap());
        // A call of 8 tokens and one of 3.
        let n = 11;
        let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        for (isa, w) in Isa::all_supported().into_iter().flat_map(|isa| {
            [Some(w), grouped]
                .into_iter()
                .flatten()
                .map(move |w| (isa, w))
        }) {
            let mut batch = vec![0.0; n * rows];
            matmul_with(isa, &w, &x, n, &mut batch).unwrap();
            for t in 0..n {
                let mut alone = vec![0.0; rows];
                matmul_with(isa, &w, &x[t * cols..(t + 1) * cols], 1, &mut alone).unwrap();
                assert!(
                    alone == batch[t * rows..(t + 1) * rows],
                    "{ty} {:?}, grouped {}: token {t} of {n} differs alone",
                    isa.level(),
                    w.grouped()
                );
            }
        }
    }
}

/// Quantized rows regrouped where the CPU has AVX2 (the products using them are checked
/// above), and used only with the matrix they were made of.
#[test]
fn row_groups_belong_to_their_matrix() {
    let mut rng = StdRng::seed_from_u64(5);
    let data = random_matrix(&mut rng, GgmlType::Q4_K, 20, 512);
    let w = QMatrix::new(GgmlType::Q4_K, 20, 512, &data).unwrap();
    let Some(groups) = RowGroups::new(&w) else {
        eprintln!("SKIPPED row_groups_belong_to_their_matrix: this CPU has no AVX2");
        return;
    };
    assert_eq!((groups.rows(), groups.cols()), (16, 512));
    assert!(w.with_groups(&groups).unwrap().grouped());
    let fewer = QMatrix::new(GgmlType::Q4_K, 8, 512, &data[..8 * 288]).unwrap();
    let other = QMatrix::new(GgmlType::Q8_0, 20, 512, &[0; 20 * 544]).unwrap();
    for m in [fewer, other] {
        let e = m.with_groups(&groups).unwrap_err();
        assert!(matches!(e, QuantError::GroupsMismatch { .. }), "{e}");
    }
    let small = QMatrix::new(GgmlType::Q4_K, 7, 512, &data[..7 * 288]).unwrap();
    assert!(RowGroups::new(&small).is_none(), "fewer rows than a group");
    let f16 = random_matrix(&mut rng, GgmlType::F16, 16, 512);
    let f16 = QMatrix::new(GgmlType::F16, 16, 512, &f16).unwrap();
    assert!(
        RowGroups::new(&f16).is_none(),
        "float rows are not regrouped"
    );
}

/// A matrix held in its row groups alone multiplies exactly as with its file bytes beside them,
/// gives back Q8_0 rows for lookups, and is a clean error where no group kernels run.
#[test]
fn a_matrix_in_row_groups_alone() {
    let mut rng = StdRng::seed_from_u64(13);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
        let (rows, cols, n) = (24, 512, 11);
        let data = random_matrix(&mut rng, ty, rows, cols);
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let Some(groups) = RowGroups::new(&w) else {
            eprintln!("SKIPPED a_matrix_in_row_groups_alone: this CPU has no AVX2");
            return;
        };
        let (both, alone) = (
            w.with_groups(&groups).unwrap(),
            QMatrix::from_groups(&groups),
        );
        let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        for isa in Isa::all_supported() {
            let mut want = vec![0.0; n * rows];
            let mut got = vec![0.0; n * rows];
            matmul_with(isa, &both, &x, n, &mut want).unwrap();
            let result = matmul_with(isa, &alone, &x, n, &mut got);
            if isa.level() == IsaLevel::Scalar {
                let e = result.unwrap_err();
                assert!(e.to_string().contains("row groups alone"), "{e}");
            } else {
                result.unwrap();
                assert!(got == want, "{ty} {:?}", isa.level());
            }
        }
        let (mut a, mut b) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            w.dequantize_row(r, &mut a).unwrap();
            match ty {
                GgmlType::Q8_0 => {
                    alone.dequantize_row(r, &mut b).unwrap();
                    assert_eq!(a, b, "row {r}");
                }
                _ => assert!(alone.dequantize_row(r, &mut b).is_err()),
            }
        }
    }
}

#[test]
fn matmul_default_isa_and_empty_shapes() {
    let mut rng = StdRng::seed_from_u64(3);
    let data = random_matrix(&mut rng, GgmlType::Q4_0, 4, 64);
    let w = QMatrix::new(GgmlType::Q4_0, 4, 64, &data).unwrap();
    let x: Vec<f32> = (0..2 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
    let (mut a, mut b) = (vec![0.0; 8], vec![0.0; 8]);
    matmul(&w, &x, 2, &mut a).unwrap();
    matmul_with(Isa::scalar(), &w, &x, 2, &mut b).unwrap();
    for (a, b) in a.iter().zip(&b) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
    let mut none: Vec<f32> = vec![];
    matmul(&w, &[], 0, &mut none).unwrap();
    let empty = QMatrix::new(GgmlType::Q8_0, 0, 64, &[]).unwrap();
    matmul(&empty, &x[..64], 1, &mut none).unwrap();
}

/// `matmul_many` over matrices of mixed types gives exactly what separate `matmul`s give.
#[test]
fn matmul_many_matches_separate_products() {
    let mut rng = StdRng::seed_from_u64(5);
    let cols = 512;
    let specs = [
        (GgmlType::Q4_1, 300),
        (GgmlType::Q6_K, 7),
        (GgmlType::F16, 65),
        (GgmlType::Q8_0, 1000),
    ];
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|&(ty, rows)| random_matrix(&mut rng, ty, rows, cols))
        .collect();
    let ws: Vec<QMatrix> = specs
        .iter()
        .zip(&data)
        .map(|(&(ty, rows), d)| QMatrix::new(ty, rows, cols, d).unwrap())
        .collect();
    for n in [1, 3, 9] {
        let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
        for isa in Isa::all_supported() {
            let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows()]).collect();
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
            matmul_many_with(isa, &ws, &x, n, &mut refs).unwrap();
            for (w, got) in ws.iter().zip(&outs) {
                let mut alone = vec![0.0; n * w.rows()];
                matmul_with(isa, w, &x, n, &mut alone).unwrap();
                assert_eq!(got, &alone, "{} n {n} {:?}", w.ty(), isa.level());
            }
        }
    }
    let x = vec![0.0; cols];
    let mut one = vec![0.0; 300];
    let err = matmul_many(&ws[..2], &x, 1, &mut [&mut one]).unwrap_err();
    assert!(matches!(
        err,
        QuantError::BufferLength {
            what: "outputs",
            ..
        }
    ));
    let other = QMatrix::new(GgmlType::F32, 1, 3, &[0; 12]).unwrap();
    let mut o2 = vec![0.0; 1];
    let err = matmul_many(&[ws[0], other], &x, 1, &mut [&mut one, &mut o2]).unwrap_err();
    assert!(matches!(
        err,
        QuantError::BufferLength {
            what: "activations",
            ..
        }
    ));
    matmul_many(&[], &x, 1, &mut []).unwrap();
}

#[test]
fn shape_errors_are_values() {
    let data = vec![0u8; 2 * 18];
    assert_eq!(
        QMatrix::new(GgmlType::Q4_0, 1, 48, &data).unwrap_err(),
        QuantError::PartialBlock {
            ty: GgmlType::Q4_0,
            elems: 48
        }
    );
    assert_eq!(
        QMatrix::new(GgmlType::Q4_0, 2, 64, &data).unwrap_err(),
        QuantError::DataLength {
            ty: GgmlType::Q4_0,
            expected: 72,
            found: 36
        }
    );
    let w = QMatrix::new(GgmlType::Q4_0, 1, 64, &data).unwrap();
    let mut out = vec![0.0; 2];
    let err = matmul(&w, &[0.0; 64], 2, &mut out).unwrap_err();
    assert!(matches!(
        err,
        QuantError::BufferLength {
            what: "activations",
            ..
        }
    ));
    let err = matmul(&w, &[0.0; 128], 2, &mut out[..1]).unwrap_err();
    assert!(matches!(
        err,
        QuantError::BufferLength { what: "output", .. }
    ));
    assert!(dequantize_row(GgmlType::Q4_K, &[0; 144], &mut [0.0; 128]).is_err());
    assert!(dequantize_row(GgmlType::Q4_K, &[0; 143], &mut [0.0; 256]).is_err());
    assert!(w.dequantize_row(1, &mut [0.0; 64]).is_err());
    assert!(!format!("{err}").is_empty());
}

#[test]
fn type_table() {
    for ty in GgmlType::ALL {
        assert_eq!(GgmlType::from_id(ty.id()), Ok(ty));
        let l = type_layout(ty.id()).unwrap();
        assert_eq!(
            (l.block_size, l.block_bytes),
            (ty.block_size(), ty.block_bytes())
        );
    }
    let err = GgmlType::from_id(7).unwrap_err();
    assert_eq!(err.to_string(), "ggml type 7 (Q5_1) is not supported");
    assert_eq!(
        GgmlType::from_id(4).unwrap_err().to_string(),
        "unknown ggml type id 4"
    );
    assert_eq!(GgmlType::Q6_K.row_bytes(512), Some(420));
    assert_eq!(GgmlType::Q6_K.row_bytes(100), None);
}

fn dequant(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![f32::NAN; ty.block_size()];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

#[test]
fn dequantize_hand_computed_blocks() {
    // F32, F16, BF16: one element per block.
    assert_eq!(dequant(GgmlType::F32, &(-2.5f32).to_le_bytes()), [-2.5]);
    assert_eq!(dequant(GgmlType::F16, &[0x00, 0x3E]), [1.5]);
    assert_eq!(dequant(GgmlType::BF16, &[0xC0, 0x3F]), [1.5]);
    assert_eq!(dequant(GgmlType::BF16, &[0x00, 0xC0]), [-2.0]);

    // Q4_0, d = 0.5: element j is the low nibble of qs[j], element j + 16 the high one.
    let mut b = vec![0x00, 0x38];
    b.extend([0x88; 16]);
    b[2] = 0x1F;
    let y = dequant(GgmlType::Q4_0, &b);
    assert_eq!((y[0], y[16], y[1], y[31]), (3.5, -3.5, 0.0, 0.0));

    // Q4_1, d = 0.25, m = -1.
    let mut b = vec![0x00, 0x34, 0x00, 0xBC];
    b.extend([0x00; 16]);
    b[4 + 3] = 0xA2;
    let y = dequant(GgmlType::Q4_1, &b);
    assert_eq!((y[3], y[19], y[0], y[31]), (-0.5, 1.5, -1.0, -1.0));

    // Q5_0, d = 2: qh bit j is bit 4 of element j; bits 0 and 17 set.
    let mut b = vec![0x00, 0x40];
    b.extend(((1u32 << 0) | (1 << 17)).to_le_bytes());
    b.extend([0x00; 16]);
    b[6] = 0x3F;
    let y = dequant(GgmlType::Q5_0, &b);
    assert_eq!((y[0], y[16], y[1], y[17]), (30.0, -26.0, -32.0, 0.0));

    // Q8_0, d = 0.125.
    let mut b = vec![0x00, 0x30];
    b.extend([0x00; 32]);
    (b[2], b[3], b[4]) = (0x80, 0x7F, 0x05);
    let y = dequant(GgmlType::Q8_0, &b);
    assert_eq!(&y[..4], &[-16.0, 15.875, 0.625, 0.0]);

    // Q4_K, d = 1, dmin = 0.5; sub-block scales [1, 2, 3, 4, 5, 6, 7, 63] and mins
    // [0, 1, 0, 0, 0, 0, 0, 40], packed by hand: bytes 0..4 hold the low six bits of scales 0..3
    // (top two bits: bits 4..5 of scales 4..7), bytes 4..8 likewise the mins, bytes 8..12 the
    // low nibbles of scales 4..7 and (high nibble) of mins 4..7.
    let mut b = vec![0x00, 0x3C, 0x00, 0x38];
    b.extend([1, 2, 3, 4 | 3 << 6, 0, 1, 0, 2 << 6, 5, 6, 7, 15 | 8 << 4]);
    b.extend([0x00; 128]);
    b[16] = 0x21; // sub-block 0 element 0 = 1, sub-block 1 element 0 = 2
    b[16 + 127] = 0xF0; // sub-block 6 element 31 = 0, sub-block 7 element 31 = 15
    let y = dequant(GgmlType::Q4_K, &b);
    assert_eq!((y[0], y[1]), (1.0, 0.0));
    assert_eq!((y[32], y[33]), (1.0 * 2.0 * 2.0 - 0.5 * 1.0, -0.5));
    assert_eq!((y[223], y[224], y[255]), (0.0, -20.0, 63.0 * 15.0 - 20.0));

    // Q6_K, d = 0.5; scales: sub-block 0 -> 2, 4 -> 1, 15 -> -3, others 0.
    let mut b = vec![0x00; 210];
    b[0] = 0x05; // ql: element 0 low nibble 5 (element 64 high nibble 0)
    b[128] = 0b10; // qh: element 0 bits 4..5 = 2, so q = 5 + 32
    b[127] = 0xF0; // element 255 low four bits 15 (high nibble of ql[127])
    b[128 + 63] = 0b11 << 6; // element 255 bits 4..5 = 3, so q = 63
    (b[192], b[192 + 4], b[192 + 15]) = (2, 1, (-3i8) as u8);
    (b[208], b[209]) = (0x00, 0x38);
    let y = dequant(GgmlType::Q6_K, &b);
    let mut expect = [0.0f32; 256];
    expect[1..16].fill(0.5 * 2.0 * -32.0);
    expect[0] = 0.5 * 2.0 * 5.0;
    expect[64..80].fill(0.5 * -32.0);
    expect[240..256].fill(0.5 * -3.0 * -32.0);
    expect[255] = 0.5 * -3.0 * 31.0;
    assert_eq!(y, expect);
}

/// The types named in `QUANT_TYPES` (comma-separated, e.g. `Q4_0,Q6_K`), or all.
fn selected_types() -> Vec<GgmlType> {
    let only = std::env::var("QUANT_TYPES").unwrap_or_default();
    GgmlType::ALL
        .into_iter()
        .filter(|t| only.is_empty() || only.split(',').any(|s| s == t.name()))
        .collect()
}

/// Best seconds per call of `matmul(w, x, n)` over `passes` passes through `set` (distinct
/// copies of one matrix, together larger than the last-level cache), with each copy's row
/// groups (where this CPU makes them) or without.
fn time_per_call(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    set: &[Vec<u8>],
    n: usize,
    passes: usize,
    grouped: bool,
) -> f64 {
    let mut rng = StdRng::seed_from_u64(9);
    let x: Vec<f32> = (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut out = vec![0.0; n * rows];
    let ws: Vec<QMatrix> = set
        .iter()
        .map(|data| QMatrix::new(ty, rows, cols, data).unwrap())
        .collect();
    let groups: Vec<Option<RowGroups>> = ws
        .iter()
        .map(|w| if grouped { RowGroups::new(w) } else { None })
        .collect();
    let ws: Vec<QMatrix> = ws
        .into_iter()
        .zip(&groups)
        .map(|(w, g)| g.as_ref().map_or(w, |g| w.with_groups(g).unwrap()))
        .collect();
    let mut best = f64::MAX;
    for _ in 0..passes {
        let start = Instant::now();
        for w in &ws {
            matmul(w, &x, n, &mut out).unwrap();
        }
        best = best.min(start.elapsed().as_secs_f64() / set.len() as f64);
    }
    best
}

/// `copies` distinct copies of a random `rows x cols` matrix of `ty`, at least `min_bytes` in all.
fn matrix_set(ty: GgmlType, rows: usize, cols: usize, min_bytes: usize) -> Vec<Vec<u8>> {
    let one = random_matrix(&mut StdRng::seed_from_u64(1), ty, rows, cols);
    let copies = min_bytes.div_ceil(one.len()).max(2);
    (0..copies).map(|_| one.clone()).collect()
}

/// Weight streaming rate of `matmul` per type on 4096 x 4096 matrices, cycling through enough
/// copies (256 MiB) to exceed the last-level cache, against the machine's read bandwidth; then
/// the time per call of SmolLM2-135M's matrix shapes at n = 1.
/// `cargo test --release -p vortex-kernels --test quant -- --ignored --nocapture matmul_bandwidth`
/// (`QUANT_TYPES=Q4_0,Q6_K` selects types).
#[test]
#[ignore]
fn matmul_bandwidth() {
    const DIM: usize = 4096;
    const SET_BYTES: usize = 256 << 20;
    let bw_before = measure_read_bandwidth(1 << 30, 5);
    println!(
        "read bandwidth {bw_before:.1} GB/s; isa {:?}; {} threads",
        Isa::detect().level(),
        rayon::current_num_threads()
    );
    println!(
        "{:>6} {:>8} {:>10} {:>10} {:>12} {:>12}",
        "type", "layout", "MB/matrix", "n=1 GB/s", "% of bw", "n=16 GMAC/s"
    );
    for ty in selected_types() {
        let set = matrix_set(ty, DIM, DIM, SET_BYTES);
        let bytes = set[0].len() as f64;
        let grouped = RowGroups::new(&QMatrix::new(ty, DIM, DIM, &set[0]).unwrap()).is_some();
        for (layout, groups) in [("file", false), ("groups", true)] {
            if groups && !grouped {
                continue;
            }
            let t1 = time_per_call(ty, DIM, DIM, &set, 1, 5, groups);
            let t16 = time_per_call(ty, DIM, DIM, &set, 16, 2, groups);
            println!(
                "{:>6} {layout:>8} {:>10.1} {:>10.1} {:>11.0}% {:>12.1}",
                ty.name(),
                bytes / 1e6,
                bytes / t1 / 1e9,
                100.0 * bytes / t1 / 1e9 / bw_before,
                (16 * DIM * DIM) as f64 / t16 / 1e9
            );
        }
    }
    println!(
        "read bandwidth after: {:.1} GB/s",
        measure_read_bandwidth(1 << 30, 5)
    );

    println!("SmolLM2-135M shapes, n = 1:");
    let shapes = [
        ("attn_q/attn_output 576x576", GgmlType::Q4_1, 576, 576),
        ("attn_k/attn_v 192x576", GgmlType::Q4_1, 192, 576),
        ("ffn_gate/up 1536x576", GgmlType::Q4_1, 1536, 576),
        ("ffn_down 576x1536", GgmlType::Q4_1, 576, 1536),
        ("lm head 49152x576", GgmlType::Q8_0, 49152, 576),
    ];
    for (name, ty, rows, cols) in shapes {
        let set = matrix_set(ty, rows, cols, 64 << 20);
        for (layout, groups) in [("file", false), ("groups", true)] {
            let t = time_per_call(ty, rows, cols, &set, 1, 5, groups);
            let gbs = set[0].len() as f64 / t / 1e9;
            println!(
                "  {name:<28} {ty:>5} {layout:>6} {:>8.1} us {gbs:>6.1} GB/s",
                t * 1e6
            );
        }
    }
    // One layer's projections that share their input, as separate calls and as one call.
    for (name, shapes) in [
        ("q+k+v 576+192+192 x 576", &[576, 192, 192][..]),
        ("gate+up 1536+1536 x 576", &[1536, 1536][..]),
    ] {
        let ty = GgmlType::Q4_1;
        let layers = 48;
        let data: Vec<Vec<Vec<u8>>> = (0..layers)
            .map(|l| {
                let mut rng = StdRng::seed_from_u64(l);
                shapes
                    .iter()
                    .map(|&rows| random_matrix(&mut rng, ty, rows, 576))
                    .collect()
            })
            .collect();
        let bytes: usize = data[0].iter().map(Vec::len).sum();
        let x: Vec<f32> = (0..576).map(|i| (i as f32).sin()).collect();
        let mut outs: Vec<Vec<f32>> = shapes.iter().map(|&r| vec![0.0; r]).collect();
        let (mut separate, mut fused) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            let start = Instant::now();
            for layer in &data {
                for ((d, &rows), out) in layer.iter().zip(shapes).zip(&mut outs) {
                    matmul(&QMatrix::new(ty, rows, 576, d).unwrap(), &x, 1, out).unwrap();
                }
            }
            separate = separate.min(start.elapsed().as_secs_f64() / layers as f64);
            let start = Instant::now();
            for layer in &data {
                let ws: Vec<QMatrix> = layer
                    .iter()
                    .zip(shapes)
                    .map(|(d, &rows)| QMatrix::new(ty, rows, 576, d).unwrap())
                    .collect();
                let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                matmul_many(&ws, &x, 1, &mut refs).unwrap();
            }
            fused = fused.min(start.elapsed().as_secs_f64() / layers as f64);
        }
        println!(
            "  {name:<28} {ty:>5} {:>8.1} us separate, {:.1} us with matmul_many ({:.1} GB/s)",
            separate * 1e6,
            fused * 1e6,
            bytes as f64 / fused / 1e9
        );
    }
}

/// Single-thread kernel rate on a matrix that stays in L2 (compute bound, not memory bound), as
/// weight bytes times tokens per second: what one core can decode, per type and batch size.
#[test]
#[ignore]
fn kernel_rate_in_cache() {
    const COLS: usize = 4096;
    const NS: [usize; 3] = [1, 4, 16];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    println!("weight GB/s x tokens, one thread, matrix in L2");
    println!(
        "{:>6} {:>12} {:>9} {:>9} {:>9}",
        "type", "isa", "n=1", "n=4", "n=16"
    );
    for ty in selected_types() {
        let rows = (512 << 10) / ty.row_bytes(COLS).unwrap();
        let data = random_matrix(&mut rng, ty, rows, COLS);
        let w = QMatrix::new(ty, rows, COLS, &data).unwrap();
        for isa in Isa::all_supported() {
            let mut line = format!("{:>6} {:>12}", ty.name(), format!("{:?}", isa.level()));
            for n in NS {
                let x: Vec<f32> = (0..n * COLS).map(|_| rng.random_range(-1.0..1.0)).collect();
                let mut out = vec![0.0; n * rows];
                let reps = 200 / n;
                let mut best = f64::MAX;
                pool.install(|| {
                    for _ in 0..5 {
                        let start = Instant::now();
                        for _ in 0..reps {
                            matmul_with(isa, &w, &x, n, &mut out).unwrap();
                        }
                        best = best.min(start.elapsed().as_secs_f64() / reps as f64);
                    }
                });
                line += &format!(" {:>9.1}", (n * data.len()) as f64 / best / 1e9);
            }
            println!("{line}");
        }
    }
}

/// A row of 3, 7 or 11 blocks (blocks pair up, two pairs a step) reads no block past its own:
/// the next row starts with an infinite scale, which would make the product NaN.
#[test]
fn rows_of_odd_blocks_read_only_their_own() {
    let mut rng = StdRng::seed_from_u64(11);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
    ] {
        for cols in [96, 224, 352] {
            let mut data = random_matrix(&mut rng, ty, 2, cols);
            let row_bytes = data.len() / 2;
            // f16 +inf: the second row's first block scale.
            data[row_bytes..row_bytes + 2].copy_from_slice(&[0x00, 0x7c]);
            let w = QMatrix::new(ty, 2, cols, &data).unwrap();
            let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut want = vec![0.0; 2];
            matmul_with(Isa::scalar(), &w, &x, 1, &mut want).unwrap();
            for isa in Isa::all_supported() {
                let mut got = vec![0.0; 2];
                matmul_with(isa, &w, &x, 1, &mut got).unwrap();
                assert!(
                    (got[0] - want[0]).abs() <= 1e-3 * (1.0 + want[0].abs()),
                    "{ty:?}, {cols} columns, {isa:?}: {} vs {}",
                    got[0],
                    want[0]
                );
            }
        }
    }
}
