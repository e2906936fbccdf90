// Scratch accuracy check behind BENCHMARKS.md "Float weights quantized to Q8_0 at load": copy to
// crates/model/tests/, then `cargo test --release -p vortex-model --test q8_real_scratch -- --ignored --nocapture`.
mod logits_support;
use vortex_kv::KvDtype;
use vortex_model::gpu_values::bf16_values;
use vortex_model::model::Model;
use vortex_model::quantize::q8_0_model;

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let r: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (d / r).sqrt()
}
fn argmax(v: &[f32]) -> usize { v.iter().enumerate().fold((0, f32::MIN), |(i, m), (j, &x)| if x > m { (j, x) } else { (i, m) }).0 }

#[test]
#[ignore]
fn q8_real() {
    let path = std::path::Path::new(&std::env::var("HOME").unwrap()).join(".cache/vortex/models/smollm2-135m.gguf");
    let loaded = vortex_model::loader::load(&path).unwrap();
    let m = &loaded.model;
    let text = "The history of the Roman Empire spans many centuries, from the founding of the city to the fall of Constantinople. Its roads, laws and language shaped Europe for a thousand years, and scholars still debate why it declined.";
    let toks = loaded.tokenizer.encode(text, true);
    let chunks: Vec<&[u32]> = toks.chunks(8).collect();
    let layers = m.layers.iter().map(|l| l.map_matrices(bf16_values)).collect();
    let float = Model::new(m.config.clone(), bf16_values(&m.embed), layers, m.norm.clone(), m.lm_head.as_ref().map(bf16_values));
    let q8 = q8_0_model(float.clone());
    let la = logits_support::logits(&float, &chunks, KvDtype::F32);
    let lb = logits_support::logits(&q8, &chunks, KvDtype::F32);
    let lc = logits_support::logits(m, &chunks, KvDtype::F32);
    println!("{} tokens, {} positions; weight bytes float {} q8 {} file {}", toks.len(), la.len(), float.weight_bytes(), q8.weight_bytes(), m.weight_bytes());
    let (mut agree_b, mut agree_c) = (0, 0);
    for ((a, b), c) in la.iter().zip(&lb).zip(&lc) {
        println!("rel rms q8_0 {:.4}  file {:.4}", rel(a, b), rel(a, c));
        agree_b += (argmax(a) == argmax(b)) as usize;
        agree_c += (argmax(a) == argmax(c)) as usize;
    }
    println!("top-1 agreement with float: q8_0 {agree_b}/{} file {agree_c}/{}", la.len(), la.len());
}

#[test]
#[ignore]
fn q8_matrices() {
    let path = std::path::Path::new(&std::env::var("HOME").unwrap()).join(".cache/vortex/models/smollm2-135m.gguf");
    let loaded = vortex_model::loader::load(&path).unwrap();
    let m = &loaded.model;
    for (li, l) in m.layers.iter().enumerate().take(3) {
        for (name, w) in [("wq", &l.wq), ("wk", &l.wk), ("wv", &l.wv), ("wo", &l.wo), ("gate", &l.gate), ("up", &l.up), ("down", &l.down)] {
            let f = bf16_values(w);
            let q = vortex_model::quantize::q8_0(&f);
            let n = 4;
            let x: Vec<f32> = (0..n * w.cols).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0)).collect();
            let mut a = vec![0f32; n * w.rows];
            let mut b = vec![0f32; n * w.rows];
            let mut c = vec![0f32; n * w.rows];
            f.matmul(&x, n, &mut a);
            q.matmul(&x, n, &mut b);
            w.matmul(&x, n, &mut c);
            println!("layer {li} {name} {:?}: q8 {:.5} file {:.5}", w.ty, rel(&a, &b), rel(&a, &c));
        }
    }
}
