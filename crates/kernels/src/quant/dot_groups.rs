//! Products of row groups ([`super::row_groups`]): `NT` tokens' activations times a group's 8
//! rows, one vector lane a row, with AVX-512 VNNI ([`vnni`]), AVX-VNNI ([`avxvnni`]) or AVX2
//! alone ([`avx2`]). A token's result does not depend on `NT` or on the other tokens.
//!
//! Every level runs the same kernels (`group_kernels!`); they differ in how 4 unsigned weight
//! bytes times 4 signed activations reach a 32-bit lane per row. VNNI's `vpdpbusd` (in either
//! encoding) adds them into 32 bits at once. AVX2's `vpmaddubsw` leaves sums of pairs in 16 bits, which the kernels
//! keep adding to (one `vpmaddwd` makes them 32-bit lanes afterwards): with activations within
//! ±127, a running sum of 6-bit values (Q6_K) may take two products, of 5-bit values (Q5_0) four,
//! of nibbles eight. Q8_0's shifted bytes would overflow one pair, so AVX2 takes them as two
//! nibbles.

/// The group kernels, instantiated in [`vnni`], [`avxvnni`] and [`avx2`]. The expansion site provides
/// `WHOLE_BYTES` (whether `dot4` takes Q8_0's bytes whole), `dot4(acc, w, y)` (`acc` plus the
/// products of 4 bytes of `w` and `y` in each 32-bit lane, kept as the level keeps them),
/// `lanes(acc)` (those sums as 32-bit lanes), `dot_pairs(acc, a, b)` (`acc` plus the sums of
/// adjacent 16-bit products) and `bit_where(v, bit, value)` (`value`'s bytes where `v`'s have
/// `bit` set, else 0).
macro_rules! group_kernels {
    ($features:literal) => {
        use core::arch::x86_64::*;

        use super::super::dot_avx2::{Q4_0, Q4_1, Q5_0, Q8_0, block32_bytes};
        use super::super::dot_scalar::{blocks, pairs};
        use super::super::q8::{BlockQ8K, BlockQ8x2};
        use super::super::row_groups::{
            Q4K_D_AT, Q4K_DMIN_AT, Q4K_GROUP_BYTES, Q4K_MINS_AT, Q4K_SCALES_AT, Q4K_VALUES_AT,
            Q5_0_HIGH_AT, Q6K_D_AT, Q6K_GROUP_BYTES, Q6K_SCALES_AT, Q6K_VALUES_AT, block32_d_at,
        };
        use super::super::types::GgmlType;

        /// The 32-bit word at `p` broadcast over a vector.
        ///
        /// # Safety
        /// `p` must be valid for reading 4 bytes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn broadcast_word<T>(p: *const T) -> __m256i {
            // SAFETY: the caller guarantees 4 readable bytes.
            _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
        }

        /// A group of a 32-column format (`KIND`, as [`super::super::dot_avx2`]'s) times `NT`
        /// tokens: `Σ_b d dy Σ (q - offset) y (+ m dy Σ y for Q4_1)`. The offset (8, 16, or 128
        /// for Q8_0's shifted values) is a multiple of the activation sums, added to each block's
        /// integer sums.
        ///
        /// # Safety
        /// The CPU must support this level's features.
        #[target_feature(enable = $features)]
        pub unsafe fn dot_block32<const NT: usize, const KIND: u8>(
            g: &[u8],
            ys: [&[BlockQ8x2]; NT],
        ) -> [__m256; NT] {
            let nb = pairs(g, 8 * block32_bytes(KIND), &ys);
            // Even and odd blocks, and Q4_1's minimums, are summed apart: one chain of adds a
            // token would make a lone token's product wait on the adds' latency.
            let mut acc = [[_mm256_setzero_ps(); NT]; 3];
            let [even, odd, mins] = &mut acc;
            let mut b = 0;
            while b + 2 <= nb {
                // SAFETY: blocks b and b + 1 lie within `g`, and each token's row holds their
                // pair (`pairs`).
                unsafe {
                    block32::<NT, KIND>(g, b, &ys, even, mins);
                    block32::<NT, KIND>(g, b + 1, &ys, odd, mins);
                }
                b += 2;
            }
            if b < nb {
                // SAFETY: as above.
                unsafe { block32::<NT, KIND>(g, b, &ys, even, mins) };
            }
            std::array::from_fn(|t| _mm256_add_ps(_mm256_add_ps(acc[0][t], acc[1][t]), acc[2][t]))
        }

        /// Block `b` of [`dot_block32`]'s group, added into `acc` (Q4_1's minimums into
        /// `acc_m`).
        ///
        /// # Safety
        /// As [`dot_block32`]; block `b` must lie within `g`, and every token's row hold its
        /// pair.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn block32<const NT: usize, const KIND: u8>(
            g: &[u8],
            b: usize,
            ys: &[&[BlockQ8x2]; NT],
            acc: &mut [__m256; NT],
            acc_m: &mut [__m256; NT],
        ) {
            let ty = match KIND {
                Q4_0 => GgmlType::Q4_0,
                Q4_1 => GgmlType::Q4_1,
                Q5_0 => GgmlType::Q5_0,
                _ => GgmlType::Q8_0,
            };
            let block = 8 * block32_bytes(KIND);
            // SAFETY (every access through `p`): block b lies within `g`, and the offsets below
            // are its layout's.
            let p = unsafe { g.as_ptr().add(b * block) };
            let load = |at: usize| unsafe { _mm256_loadu_si256(p.add(at).cast()) };
            let m4 = _mm256_set1_epi8(0x0F);
            // Chunk c's values (`w[c]`), and where Q8_0 goes as two nibbles, its high ones.
            let split = KIND == Q8_0 && !WHOLE_BYTES;
            let mut w = [_mm256_setzero_si256(); 8];
            let mut high = [_mm256_setzero_si256(); 8];
            if KIND == Q8_0 {
                for (c, w) in w.iter_mut().enumerate() {
                    *w = load(32 * c);
                }
                if split {
                    for (w, h) in w.iter_mut().zip(&mut high) {
                        *h = _mm256_and_si256(_mm256_srli_epi16::<4>(*w), m4);
                        *w = _mm256_and_si256(*w, m4);
                    }
                }
            } else {
                for c in 0..4 {
                    let v = load(32 * c);
                    w[c] = _mm256_and_si256(v, m4);
                    w[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                }
                if KIND == Q5_0 {
                    let (bits, bit4) = (load(Q5_0_HIGH_AT), _mm256_set1_epi8(0x10));
                    for (c, w) in w.iter_mut().enumerate() {
                        let fifth = bit_where(bits, _mm256_set1_epi8(1 << c), bit4);
                        *w = _mm256_or_si256(*w, fifth);
                    }
                }
            }
            let d_at = block32_d_at(ty);
            let d = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(d_at).cast())) };
            let h = b % 2;
            for ((a, am), y) in acc.iter_mut().zip(acc_m.iter_mut()).zip(ys) {
                // SAFETY: the caller guarantees the pair b / 2.
                let y = unsafe { y.get_unchecked(b / 2) };
                let bias = _mm256_set1_epi32(y.bias[4 * h]);
                let offset = match KIND {
                    Q4_0 => _mm256_slli_epi32::<2>(bias),
                    Q5_0 => _mm256_slli_epi32::<3>(bias),
                    Q8_0 => _mm256_slli_epi32::<6>(bias),
                    _ => _mm256_setzero_si256(),
                };
                let mut s = [_mm256_setzero_si256(); 4];
                for c in 0..4 {
                    // SAFETY: 16 h + 4 c + 4 <= 32 bytes of `lo` and of `hi`.
                    let (lo, hi) = unsafe {
                        (
                            broadcast_word(y.lo.as_ptr().add(16 * h + 4 * c)),
                            broadcast_word(y.hi.as_ptr().add(16 * h + 4 * c)),
                        )
                    };
                    s[0] = dot4(s[0], w[c], lo);
                    s[1] = dot4(s[1], w[c + 4], hi);
                    if split {
                        s[2] = dot4(s[2], high[c], lo);
                        s[3] = dot4(s[3], high[c + 4], hi);
                    }
                }
                let mut sum = _mm256_add_epi32(offset, _mm256_add_epi32(lanes(s[0]), lanes(s[1])));
                if split {
                    let high = _mm256_add_epi32(lanes(s[2]), lanes(s[3]));
                    sum = _mm256_add_epi32(sum, _mm256_slli_epi32::<4>(high));
                }
                let s = _mm256_cvtepi32_ps(sum);
                *a = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(y.d[h])), s, *a);
                if KIND == Q4_1 {
                    let m = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(d_at + 16).cast())) };
                    *am = _mm256_fmadd_ps(m, _mm256_set1_ps(y.s[h]), *am);
                }
            }
        }

        /// A Q4_K group's 8 rows times `NT` tokens:
        /// `Σ_b d dy Σ_s scale_s Σ q y - dmin dy Σ_s min_s Σ y`. A sub-block's integer sums run
        /// in two chains each (they are exact, so their order does not show): with VNNI and one
        /// chain of eight dependent multiply-adds, one token's product of a 4096 x 4096 matrix
        /// read from memory at 69-81% of the probe's bandwidth, with two at 76-89% (the file's
        /// layout: 63-97%; three runs each of `matmul_bandwidth` on a noisy machine).
        ///
        /// # Safety
        /// The CPU must support this level's features.
        #[target_feature(enable = $features)]
        pub unsafe fn dot_q4_k<const NT: usize>(g: &[u8], ys: [&[BlockQ8K]; NT]) -> [__m256; NT] {
            let nb = blocks(g, Q4K_GROUP_BYTES, &ys);
            let m4 = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); NT];
            for b in 0..nb {
                // SAFETY (every access through `p`): super-block b lies within `g`, and the
                // offsets below are its layout's.
                let p = unsafe { g.as_ptr().add(b * Q4K_GROUP_BYTES) };
                // SAFETY: b < nb = y.len().
                let yb: [&BlockQ8K; NT] =
                    std::array::from_fn(|t| unsafe { ys[t].get_unchecked(b) });
                let mut isum = [_mm256_setzero_si256(); NT];
                for j in 0..4 {
                    let mut lo = [_mm256_setzero_si256(); 8];
                    let mut hi = [_mm256_setzero_si256(); 8];
                    for c in 0..8 {
                        let at = Q4K_VALUES_AT + 256 * j + 32 * c;
                        let v = unsafe { _mm256_loadu_si256(p.add(at).cast()) };
                        lo[c] = _mm256_and_si256(v, m4);
                        hi[c] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    }
                    let sc = p.wrapping_add(Q4K_SCALES_AT + 16 * j);
                    let (sc_lo, sc_hi) = unsafe {
                        (
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64(sc.cast())),
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64(sc.add(8).cast())),
                        )
                    };
                    for (s, y) in isum.iter_mut().zip(&yb) {
                        let qy = y.qs.as_ptr();
                        let mut a = [_mm256_setzero_si256(); 4];
                        for c in 0..8 {
                            // SAFETY: 64 j + 32 + 4 c + 4 <= 256 bytes of `qs`.
                            let (y0, y1) = unsafe {
                                (
                                    broadcast_word(qy.add(64 * j + 4 * c)),
                                    broadcast_word(qy.add(64 * j + 32 + 4 * c)),
                                )
                            };
                            a[c % 2] = dot4(a[c % 2], lo[c], y0);
                            a[2 + c % 2] = dot4(a[2 + c % 2], hi[c], y1);
                        }
                        let a0 = _mm256_add_epi32(lanes(a[0]), lanes(a[1]));
                        let a1 = _mm256_add_epi32(lanes(a[2]), lanes(a[3]));
                        let scaled = _mm256_add_epi32(
                            _mm256_mullo_epi32(a0, sc_lo),
                            _mm256_mullo_epi32(a1, sc_hi),
                        );
                        *s = _mm256_add_epi32(*s, scaled);
                    }
                }
                let (d, dmin) = unsafe {
                    (
                        _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q4K_D_AT).cast())),
                        _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q4K_DMIN_AT).cast())),
                    )
                };
                let mins: [__m256i; 4] = std::array::from_fn(|j| unsafe {
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(Q4K_MINS_AT + 16 * j).cast()))
                });
                for ((a, s), y) in acc.iter_mut().zip(isum).zip(&yb) {
                    let mut imin = _mm256_setzero_si256();
                    for (j, m) in mins.iter().enumerate() {
                        // SAFETY: `bsums32` holds 8 i16; 2 j + 2 <= 8.
                        let bs = unsafe { broadcast_word(y.bsums32.as_ptr().add(2 * j)) };
                        imin = dot_pairs(imin, *m, bs);
                    }
                    let dy = _mm256_set1_ps(y.d);
                    *a = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(s), *a);
                    *a = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(imin), *a);
                }
            }
            acc
        }

        /// A Q6_K group's 8 rows times `NT` tokens: `Σ_b d dy Σ_s scale_s Σ (q - 32) y`, the
        /// `-32` through the activations' sums of 16.
        ///
        /// # Safety
        /// The CPU must support this level's features.
        #[target_feature(enable = $features)]
        pub unsafe fn dot_q6_k<const NT: usize>(g: &[u8], ys: [&[BlockQ8K]; NT]) -> [__m256; NT] {
            let nb = blocks(g, Q6K_GROUP_BYTES, &ys);
            let (m4, m2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
            let mut acc = [_mm256_setzero_ps(); NT];
            for b in 0..nb {
                // SAFETY (every access through `p`): as in `dot_q4_k`.
                let p = unsafe { g.as_ptr().add(b * Q6K_GROUP_BYTES) };
                // SAFETY: b < nb = y.len().
                let yb: [&BlockQ8K; NT] =
                    std::array::from_fn(|t| unsafe { ys[t].get_unchecked(b) });
                let mut isum = [_mm256_setzero_si256(); NT];
                let mut ioff = [_mm256_setzero_si256(); NT];
                for i in 0..8 {
                    // Sub-blocks 2 i and 2 i + 1: four chunks of 4 columns each.
                    let mut q = [[_mm256_setzero_si256(); 4]; 2];
                    for (h, q) in q.iter_mut().enumerate() {
                        let sub = p.wrapping_add(Q6K_VALUES_AT + 96 * (2 * i + h));
                        let (l0, l1, qh) = unsafe {
                            (
                                _mm256_loadu_si256(sub.cast()),
                                _mm256_loadu_si256(sub.add(32).cast()),
                                _mm256_loadu_si256(sub.add(64).cast()),
                            )
                        };
                        let low = |v: __m256i| _mm256_and_si256(v, m4);
                        let high = |v: __m256i| _mm256_and_si256(v, m2);
                        *q = [
                            _mm256_or_si256(low(l0), high(_mm256_slli_epi16::<4>(qh))),
                            _mm256_or_si256(
                                low(_mm256_srli_epi16::<4>(l0)),
                                high(_mm256_slli_epi16::<2>(qh)),
                            ),
                            _mm256_or_si256(low(l1), high(qh)),
                            _mm256_or_si256(
                                low(_mm256_srli_epi16::<4>(l1)),
                                high(_mm256_srli_epi16::<2>(qh)),
                            ),
                        ];
                    }
                    // Row r's two scales in its 32-bit lane: sub-block 2 i low, 2 i + 1 high.
                    let pair = unsafe {
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(Q6K_SCALES_AT + 16 * i).cast()))
                    };
                    let sc = [
                        _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(pair)),
                        _mm256_srai_epi32::<16>(pair),
                    ];
                    for ((s, o), y) in isum.iter_mut().zip(&mut ioff).zip(&yb) {
                        let qy = y.qs.as_ptr();
                        for (h, (q, sc)) in q.iter().zip(&sc).enumerate() {
                            let mut a = [_mm256_setzero_si256(); 2];
                            for (c, q) in q.iter().enumerate() {
                                // SAFETY: 32 i + 16 h + 4 c + 4 <= 256 bytes of `qs`.
                                let yv = unsafe { broadcast_word(qy.add(32 * i + 16 * h + 4 * c)) };
                                a[c % 2] = dot4(a[c % 2], *q, yv);
                            }
                            let a = _mm256_add_epi32(lanes(a[0]), lanes(a[1]));
                            *s = _mm256_add_epi32(*s, _mm256_mullo_epi32(a, *sc));
                        }
                        // SAFETY: `bsums` holds 16 i16; 2 i + 2 <= 16.
                        let bs = unsafe { broadcast_word(y.bsums.as_ptr().add(2 * i)) };
                        *o = dot_pairs(*o, pair, bs);
                    }
                }
                let d = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q6K_D_AT).cast())) };
                for ((a, (s, o)), y) in acc.iter_mut().zip(isum.into_iter().zip(ioff)).zip(&yb) {
                    let total = _mm256_sub_epi32(s, _mm256_slli_epi32::<5>(o));
                    let dy = _mm256_set1_ps(y.d);
                    *a = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(total), *a);
                }
            }
            acc
        }
    };
}

/// The group kernels with AVX-512 VNNI's 32-bit multiply-adds.
pub mod vnni {
    const WHOLE_BYTES: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn dot4(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, w, y)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn lanes(acc: __m256i) -> __m256i {
        acc
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn dot_pairs(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn bit_where(v: __m256i, bit: __m256i, value: __m256i) -> __m256i {
        _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(v, bit), value)
    }

    group_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
}

/// The group kernels with AVX-VNNI's 32-bit multiply-adds (VEX-encoded; no AVX-512).
pub mod avxvnni {
    const WHOLE_BYTES: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    fn dot4(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, w, y)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    fn lanes(acc: __m256i) -> __m256i {
        acc
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    fn dot_pairs(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpwssd_avx_epi32(acc, a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    fn bit_where(v: __m256i, bit: __m256i, value: __m256i) -> __m256i {
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), value)
    }

    group_kernels!("avx2,fma,f16c,avxvnni");
}

/// The group kernels with AVX2's 16-bit multiply-adds.
pub mod avx2 {
    const WHOLE_BYTES: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot4(acc: __m256i, w: __m256i, y: __m256i) -> __m256i {
        _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, y))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn lanes(acc: __m256i) -> __m256i {
        _mm256_madd_epi16(acc, _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_pairs(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn bit_where(v: __m256i, bit: __m256i, value: __m256i) -> __m256i {
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), value)
    }

    group_kernels!("avx2,fma,f16c");
}
