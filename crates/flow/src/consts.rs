//! Initial values of `const` tensors.

use crate::ast::Expr;
use crate::diag::Diagnostic;

/// Constants are small (hyperplanes, channel lists): 4 MiB at most.
pub const MAX_CONST_ELEMS: usize = 1 << 20;

const FORMS: &str = "randn(SEED), fill(VALUE), range(START, STEP) or values(V1, V2, ...)";

/// Evaluates a constant's initializer for a `rows x cols` tensor.
pub fn init_const(init: &Expr, rows: usize, cols: usize) -> Result<Vec<f32>, Diagnostic> {
    let n = rows * cols;
    if n > MAX_CONST_ELEMS {
        return Err(Diagnostic::new(
            init.span(),
            format!("a [{rows}, {cols}] constant is too large"),
        )
        .expected(format!("at most {MAX_CONST_ELEMS} values")));
    }
    let Expr::Call { name, span, args } = init else {
        return Err(Diagnostic::new(init.span(), "expected an initializer").expected(FORMS));
    };
    let nums: Vec<f64> = args
        .iter()
        .map(|a| {
            number(a)
                .ok_or_else(|| Diagnostic::new(a.span(), "expected a number").expected("a number"))
        })
        .collect::<Result<_, _>>()?;
    let want = |k: usize| {
        if nums.len() == k {
            Ok(())
        } else {
            Err(Diagnostic::new(
                *span,
                format!("{name} takes {k} argument(s), got {}", nums.len()),
            )
            .expected(FORMS))
        }
    };
    match name.as_str() {
        "randn" => {
            want(1)?;
            let mut rng = SplitMix(nums[0].to_bits());
            Ok((0..n).map(|_| rng.normal()).collect())
        }
        "fill" => {
            want(1)?;
            Ok(vec![nums[0] as f32; n])
        }
        "range" => {
            want(2)?;
            Ok((0..n)
                .map(|i| (nums[0] + nums[1] * i as f64) as f32)
                .collect())
        }
        "values" => {
            if nums.len() != n {
                return Err(Diagnostic::new(
                    *span,
                    format!(
                        "values(...) lists {} numbers for a [{rows}, {cols}] constant",
                        nums.len()
                    ),
                )
                .expected(format!("{n} numbers")));
            }
            Ok(nums.iter().map(|&x| x as f32).collect())
        }
        _ => Err(Diagnostic::new(*span, format!("unknown initializer '{name}'")).expected(FORMS)),
    }
}

fn number(e: &Expr) -> Option<f64> {
    match e {
        Expr::Num(v, _) => Some(*v),
        Expr::Neg(inner, _) => number(inner).map(|v| -v),
        _ => None,
    }
}

/// A small deterministic generator so constants are identical on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}
