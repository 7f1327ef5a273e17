//! TLE: entropy of the first decoding step, in bits.
//!
//! From full logits the entropy is computed in one pass over memory with an
//! online log-sum-exp: H = ln(sum e^y) - (sum e^y * y) / (sum e^y), y = x - m,
//! m the running maximum (moved block by block while each block is in L1).
//! From an API's top-k logprobs the residual mass gives a lower and an upper
//! bound; the lower bound is the reported value (DESIGN.md).

use wide::f32x8;

use crate::{invalid, SignalError};

/// Lanes processed together (one f32x8).
const LANES: usize = 8;
/// Logits per block between updates of the running maximum; small enough to stay in L1.
const BLOCK: usize = 256;

/// Entropy from top-k logprobs: the residual-mass bounds and what they were computed from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopKEntropy {
    /// The reported TLE value: the lower bound, in bits.
    pub entropy_bits: f64,
    /// Lower bound: H_k + r * log2(1 / p_k).
    pub lower_bits: f64,
    /// Upper bound: H_k + r * log2((V - k) / r).
    pub upper_bits: f64,
    /// Entropy contribution of the listed tokens alone, H_k.
    pub listed_bits: f64,
    /// Probability mass of the listed tokens, S.
    pub known_mass: f64,
    /// Mass not listed, r = max(0, 1 - S).
    pub residual_mass: f64,
}

/// Entropy (bits) of softmax(logits) over the whole vocabulary, in one pass.
///
/// `-inf` logits are masked tokens (probability 0) and are skipped; NaN and
/// `+inf` are errors, as is a vector with no finite logit.
pub fn first_token_entropy_bits(logits: &[f32]) -> Result<f64, SignalError> {
    if logits.is_empty() {
        return Err(SignalError::Empty { input: "logits", needed: 1 });
    }
    let acc = accumulate(logits)?;
    if acc.finite == 0 {
        return Err(invalid(
            "logits",
            "all -inf",
            "every token is masked; at least one logit must be finite",
        ));
    }
    let nats = acc.sum.ln() - acc.weighted / acc.sum;
    let max_bits = (acc.finite as f64).log2();
    Ok((nats / std::f64::consts::LN_2).clamp(0.0, max_bits))
}

/// Running state of the one-pass entropy: sums are relative to `max`.
struct Accumulator {
    max: f32,
    /// sum of e^(x - max)
    sum: f64,
    /// sum of e^(x - max) * (x - max)
    weighted: f64,
    finite: usize,
}

impl Accumulator {
    /// The state before any logit: no reference point yet.
    fn new() -> Self {
        Self { max: f32::NEG_INFINITY, sum: 0.0, weighted: 0.0, finite: 0 }
    }

    /// Moves the reference point to `new_max`, rescaling both sums.
    fn rebase(&mut self, new_max: f32) {
        if new_max <= self.max {
            return;
        }
        if self.max == f32::NEG_INFINITY {
            self.max = new_max;
            return;
        }
        let shift = (self.max - new_max) as f64; // < 0
        let scale = shift.exp();
        // y' = y + shift for every accumulated element.
        self.weighted = (self.weighted + self.sum * shift) * scale;
        self.sum *= scale;
        self.max = new_max;
    }
}

/// Picks the fastest kernel this CPU supports; all of them give the same result to ~1e-7.
fn accumulate(logits: &[f32]) -> Result<Accumulator, SignalError> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: both target features of the kernel were detected on this CPU just above.
        return unsafe { avx2::accumulate(logits) };
    }
    accumulate_portable(logits)
}

/// Portable kernel: `wide` vectors, a max pass then a sum pass per block.
fn accumulate_portable(logits: &[f32]) -> Result<Accumulator, SignalError> {
    let mut acc = Accumulator::new();
    for (block_index, block) in logits.chunks(BLOCK).enumerate() {
        let (block_max, all_finite) = block_max_and_finite(block);
        if !all_finite {
            scalar_block(&mut acc, block, block_index * BLOCK)?;
            continue;
        }
        acc.rebase(block_max);
        let (s, t) = block_sums(block, acc.max);
        acc.sum += s;
        acc.weighted += t;
        acc.finite += block.len();
    }
    Ok(acc)
}

fn lanes(chunk: &[f32]) -> f32x8 {
    f32x8::from(<[f32; LANES]>::try_from(chunk).expect("chunks_exact yields LANES values"))
}

/// Max of a block and whether every value in it is finite.
fn block_max_and_finite(block: &[f32]) -> (f32, bool) {
    let mut maxes = f32x8::splat(f32::NEG_INFINITY);
    let mut finite = true;
    let mut chunks = block.chunks_exact(LANES);
    for c in &mut chunks {
        let x = lanes(c);
        finite &= x.is_finite().all();
        maxes = maxes.max(x);
    }
    let mut max = maxes.to_array().into_iter().fold(f32::NEG_INFINITY, f32::max);
    for &x in chunks.remainder() {
        max = max.max(x);
        finite &= x.is_finite();
    }
    (max, finite)
}

/// sum e^(x-m) and sum e^(x-m)(x-m) over a block of finite logits with x <= m.
///
/// `wide`'s vector exp (Cephes-style, 0 below -87.3) keeps this SIMD; libm's scalar
/// `expf` would not vectorise (benches/tle.rs measures both).
fn block_sums(block: &[f32], m: f32) -> (f64, f64) {
    let mv = f32x8::splat(m);
    let mut s = f32x8::ZERO;
    let mut t = f32x8::ZERO;
    let mut chunks = block.chunks_exact(LANES);
    for c in &mut chunks {
        let y = lanes(c) - mv;
        let e = y.exp();
        s += e;
        t += e * y;
    }
    let mut s64: f64 = s.to_array().iter().map(|&v| v as f64).sum();
    let mut t64: f64 = t.to_array().iter().map(|&v| v as f64).sum();
    for &x in chunks.remainder() {
        let y = (x - m) as f64;
        let e = y.exp();
        s64 += e;
        t64 += e * y;
    }
    (s64, t64)
}

/// Slow path for a block holding non-finite values: -inf is skipped, NaN/+inf rejected.
fn scalar_block(acc: &mut Accumulator, block: &[f32], offset: usize) -> Result<(), SignalError> {
    for (i, &x) in block.iter().enumerate() {
        if x == f32::NEG_INFINITY {
            continue;
        }
        if !x.is_finite() {
            return Err(SignalError::NonFinite { input: "logits", index: offset + i, value: x as f64 });
        }
        acc.rebase(x);
        let y = (x - acc.max) as f64;
        let e = y.exp();
        acc.sum += e;
        acc.weighted += e * y;
        acc.finite += 1;
    }
    Ok(())
}

/// Hand-written AVX2+FMA kernel.
///
/// Why: with `wide`'s `f32x8::exp` (Cephes-style, range masks, a long dependent
/// chain) the entropy of 128k logits took 300-540 us on the 2-core AMD EPYC
/// (Zen 3) VM, 17-30x the ~17 us read pass of benches/tle.rs. Measured on that
/// machine, the exp pass is bound by how many dependent FP operations the core
/// can hold in flight, not by memory (fusing the max pass in, more accumulators
/// or software pipelining did not help; a shorter chain did), so this kernel
/// shortens the chain: an 8-entry table for 2^(j/8) with a degree-3 polynomial,
/// k taken directly from x, no floor when the block's range does not need it,
/// and the exponent added as an integer. It reaches ~42 us (fastest criterion
/// sample; 2.6x the hot read pass, 1.3x a DRAM-resident one). A 16-entry table with a
/// degree-2 polynomial was measured slower (docs/benchmarks.md, "Another look").
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{scalar_block, Accumulator};
    use crate::SignalError;

    /// Vectors per loop step; two accumulator pairs hide the 3-4 cycle add and FMA latency.
    const UNROLL: usize = 2;
    /// Logits per loop step.
    const STEP: usize = 8 * UNROLL;
    /// Logits per block: one max/min pass, then one exp pass while the block (16 KiB) is in L1.
    const BLOCK: usize = 4096;
    /// Logits per f32 partial sum before it is added into f64 (32 terms a lane, like the portable path).
    const FLUSH: usize = 512;
    /// Lowest y = x - m evaluated. e^-87 is a normal f32, so the integer exponent
    /// add below stays valid; floored terms add < 1.7e-38 each to a sum >= 0.9.
    const Y_FLOOR: f32 = -87.0;
    /// 1.5 * 2^23: an f32 in [2^23, 2^24) is an integer, so adding this rounds.
    const ROUND_MAGIC: f32 = 12_582_912.0;
    /// 8 / ln 2: k = round(8 y / ln 2) = 8 n + j.
    const EIGHT_LOG2_E: f32 = 8.0 * std::f32::consts::LOG2_E;
    /// ln 2 / 8 (exact scaling of f32 ln 2, which is off by 3e-9 relative: far below the
    /// rounding already in y = x - m).
    const LN2_EIGHTH: f32 = std::f32::consts::LN_2 / 8.0;
    /// Reference points up to this many eighths of ln 2 use the fast path; beyond it the
    /// f32 rounding of m' = N ln2 / 8 would push r out of the polynomial's range.
    const MAX_FAST_EIGHTHS: f32 = 65_536.0;
    /// Minimax coefficients of e^r ~ 1 + r + c2 r^2 + c3 r^3 on |r| <= ln2/16, relative
    /// error 2.7e-8 (fitted for this kernel by Lawson's algorithm; the r coefficient rounds to 1).
    const C2: f32 = 0.500_064_8;
    const C3: f32 = 0.166_642_98;
    /// 2^(j/8) for j = 0..8, the table part of e^y = 2^n * 2^(j/8) * e^r.
    const EXP2_EIGHTHS: [f32; 8] = [
        1.0,
        1.090_507_7,
        1.189_207_1,
        1.296_839_6,
        std::f32::consts::SQRT_2,
        1.542_210_8,
        1.681_792_8,
        1.834_008_1,
    ];

    /// Bits of 2^(j/8) minus j << 20, so that adding t << 20 (= n << 23 + j << 20) yields 2^(n + j/8).
    fn scale_table() -> [i32; 8] {
        let mut table = [0i32; 8];
        for (j, (slot, value)) in table.iter_mut().zip(EXP2_EIGHTHS).enumerate() {
            *slot = (value.to_bits() - ((j as u32) << 20)) as i32;
        }
        table
    }

    /// The constants one exp pass needs.
    #[derive(Clone, Copy)]
    struct ExpConstants {
        /// Reference point m, broadcast.
        m: __m256,
        /// What t = fma(arg, 8/ln2, bias) adds: ROUND_MAGIC for arg = y, ROUND_MAGIC - N for arg = x.
        bias: __m256,
        /// `scale_table()`, loaded.
        table: __m256i,
    }

    /// e^y given t = ROUND_MAGIC + k with k = round(8 y / ln 2), y in [Y_FLOOR, ~0].
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_from_t(y: __m256, t: __m256, table: __m256i) -> __m256 {
        let k = _mm256_sub_ps(t, _mm256_set1_ps(ROUND_MAGIC));
        // r = y - k ln2/8, |r| <= ln2/16 (plus a hair on the fast path).
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_EIGHTH), y);
        // 2^n 2^(j/8): vpermd reads the low 3 bits of t (j); t << 20 puts k's higher bits
        // (n) into the exponent field, and the table entry removes the j << 20 it also adds.
        // t's low bits are k mod 2^9 with k >= -1005, so n >= -126 and the scale is normal.
        let ti = _mm256_castps_si256(t);
        let scale = _mm256_castsi256_ps(_mm256_add_epi32(
            _mm256_permutevar8x32_epi32(table, ti),
            _mm256_slli_epi32::<20>(ti),
        ));
        // e^r - 1 = r + r^2 (c2 + c3 r): two independent halves keep the chain short.
        let high = _mm256_fmadd_ps(_mm256_set1_ps(C3), r, _mm256_set1_ps(C2));
        let q = _mm256_fmadd_ps(_mm256_mul_ps(r, r), high, r);
        _mm256_fmadd_ps(scale, q, scale)
    }

    /// Adds eight f32 lanes of `v` into four f64 lanes of `acc`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn add_wide(acc: __m256d, v: __m256) -> __m256d {
        let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v));
        _mm256_add_pd(acc, _mm256_add_pd(lo, hi))
    }

    /// Horizontal sum of four f64 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum_lanes(v: __m256d) -> f64 {
        let half = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
        _mm_cvtsd_f64(_mm_add_sd(half, _mm_unpackhi_pd(half, half)))
    }

    /// Largest of eight lanes (none is NaN here).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn reduce_max(v: __m256) -> f32 {
        let v = _mm256_max_ps(v, _mm256_permute2f128_ps::<1>(v, v));
        let v = _mm256_max_ps(v, _mm256_permute_ps::<0b01_00_11_10>(v));
        let v = _mm256_max_ps(v, _mm256_permute_ps::<0b10_11_00_01>(v));
        _mm256_cvtss_f32(v)
    }

    /// Smallest of eight lanes (none is NaN here).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn reduce_min(v: __m256) -> f32 {
        let v = _mm256_min_ps(v, _mm256_permute2f128_ps::<1>(v, v));
        let v = _mm256_min_ps(v, _mm256_permute_ps::<0b01_00_11_10>(v));
        let v = _mm256_min_ps(v, _mm256_permute_ps::<0b10_11_00_01>(v));
        _mm256_cvtss_f32(v)
    }

    /// Max and min of `body` (a multiple of STEP long); NaN is skipped here and caught by `sums`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn max_min(body: &[f32]) -> (f32, f32) {
        let mut maxes = [_mm256_set1_ps(f32::NEG_INFINITY); UNROLL];
        let mut mins = [_mm256_set1_ps(f32::INFINITY); UNROLL];
        for step in body.chunks_exact(STEP) {
            for k in 0..UNROLL {
                // SAFETY: `step` holds 8 * UNROLL floats, so 8 from offset 8k are in bounds; loadu is unaligned.
                let x = unsafe { _mm256_loadu_ps(step.as_ptr().add(8 * k)) };
                // max/min return their second operand when one is NaN, so a NaN never sticks.
                maxes[k] = _mm256_max_ps(x, maxes[k]);
                mins[k] = _mm256_min_ps(x, mins[k]);
            }
        }
        let max = maxes.into_iter().fold(maxes[0], |a, b| _mm256_max_ps(a, b));
        let min = mins.into_iter().fold(mins[0], |a, b| _mm256_min_ps(a, b));
        (reduce_max(max), reduce_min(min))
    }

    /// sum e^y and sum e^y * y over `body` (a multiple of STEP long), y = x - m,
    /// prefetching `ahead` (the next block) meanwhile.
    ///
    /// FAST: every x is in [m - 87, m] and bias = ROUND_MAGIC - N with m = N ln2/8, so k
    /// comes straight from x and no floor is needed. Otherwise y is floored at
    /// Y_FLOOR, which also turns -inf into a negligible term. A NaN x makes the second sum NaN.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums<const FAST: bool>(body: &[f32], ahead: &[f32], c: ExpConstants) -> (f64, f64) {
        let eight_log2e = _mm256_set1_ps(EIGHT_LOG2_E);
        let floor = _mm256_set1_ps(Y_FLOOR);
        let mut sum = _mm256_setzero_pd();
        let mut weighted = _mm256_setzero_pd();
        let mut line = 0;
        for chunk in body.chunks(FLUSH) {
            let mut s = [_mm256_setzero_ps(); UNROLL];
            let mut w = [_mm256_setzero_ps(); UNROLL];
            for step in chunk.chunks_exact(STEP) {
                // This loop is compute-bound; fetching the next block now overlaps its
                // DRAM latency with the arithmetic (STEP logits, one 64-byte line, per step).
                if line < ahead.len() {
                    // SAFETY: `line` is in bounds of `ahead`; prefetch never faults.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.as_ptr().add(line).cast()) };
                }
                line += STEP;
                for k in 0..UNROLL {
                    // SAFETY: `step` holds 8 * UNROLL floats, so 8 from offset 8k are in bounds; loadu is unaligned.
                    let x = unsafe { _mm256_loadu_ps(step.as_ptr().add(8 * k)) };
                    let (y, t) = if FAST {
                        (_mm256_sub_ps(x, c.m), _mm256_fmadd_ps(x, eight_log2e, c.bias))
                    } else {
                        // Floor as the first operand: a NaN y passes through.
                        let y = _mm256_max_ps(floor, _mm256_sub_ps(x, c.m));
                        (y, _mm256_fmadd_ps(y, eight_log2e, c.bias))
                    };
                    let e = exp_from_t(y, t, c.table);
                    s[k] = _mm256_add_ps(s[k], e);
                    w[k] = _mm256_fmadd_ps(e, y, w[k]);
                }
            }
            sum = add_wide(sum, s.into_iter().fold(_mm256_setzero_ps(), |a, b| _mm256_add_ps(a, b)));
            weighted =
                add_wide(weighted, w.into_iter().fold(_mm256_setzero_ps(), |a, b| _mm256_add_ps(a, b)));
        }
        (sum_lanes(sum), sum_lanes(weighted))
    }

    /// The smallest m = N ln2/8 >= `target`, with N, when N is small enough for the fast path.
    ///
    /// Rounding to nearest first keeps an m that is already of this form unchanged, so
    /// the reference point does not creep up block after block.
    fn fast_reference(target: f32) -> Option<(f32, f32)> {
        let mut eighths = (target / LN2_EIGHTH).round();
        if eighths * LN2_EIGHTH < target {
            eighths += 1.0;
        }
        (eighths.abs() <= MAX_FAST_EIGHTHS).then_some((eighths * LN2_EIGHTH, eighths))
    }

    /// The entropy state of `logits`, as `accumulate_portable` computes it.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn accumulate(logits: &[f32]) -> Result<Accumulator, SignalError> {
        let table = scale_table();
        // SAFETY: `table` holds exactly 8 i32; loadu is unaligned.
        let table = unsafe { _mm256_loadu_si256(table.as_ptr().cast()) };
        let mut acc = Accumulator::new();
        for (block_index, block) in logits.chunks(BLOCK).enumerate() {
            let offset = block_index * BLOCK;
            let (body, tail) = block.split_at(block.len() / STEP * STEP);
            let ahead = logits.get(offset + BLOCK..).unwrap_or(&[]);
            if !body.is_empty() {
                add_body(&mut acc, body, &ahead[..ahead.len().min(BLOCK)], offset, table)?;
            }
            // Fewer than STEP values at the very end.
            scalar_block(&mut acc, tail, offset + body.len())?;
        }
        Ok(acc)
    }

    /// Adds one block body to `acc`, falling back to the exact scalar path for NaN and +inf.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn add_body(
        acc: &mut Accumulator,
        body: &[f32],
        ahead: &[f32],
        offset: usize,
        table: __m256i,
    ) -> Result<(), SignalError> {
        let (max, min) = max_min(body);
        if !max.is_finite() {
            // +inf, or nothing but -inf and NaN: the scalar path reports or skips them.
            return scalar_block(acc, body, offset);
        }
        let target = acc.max.max(max);
        let reference = fast_reference(target);
        acc.rebase(reference.map_or(target, |(m, _)| m));
        let m = acc.max;
        let constants = ExpConstants { m: _mm256_set1_ps(m), bias: _mm256_set1_ps(ROUND_MAGIC), table };
        let (sum, weighted) = match reference {
            // Every y is in [Y_FLOOR, 0] (so no -inf either): no floor, k straight from x.
            Some((_, eighths)) if min >= m + Y_FLOOR => sums::<true>(
                body,
                ahead,
                ExpConstants { bias: _mm256_set1_ps(ROUND_MAGIC - eighths), ..constants },
            ),
            _ => sums::<false>(body, ahead, constants),
        };
        if weighted.is_nan() || sum.is_nan() {
            // A NaN logit: the scalar path finds its index.
            return scalar_block(acc, body, offset);
        }
        acc.sum += sum;
        acc.weighted += weighted;
        // -inf (masked) logits went through the kernel as e^Y_FLOOR, which is negligible,
        // but they are not tokens the distribution can pick.
        let masked = if min == f32::NEG_INFINITY {
            body.iter().filter(|&&x| x == f32::NEG_INFINITY).count()
        } else {
            0
        };
        acc.finite += body.len() - masked;
        Ok(())
    }
}

/// Entropy bounds from the top-k logprobs an API returns (natural-log probabilities).
///
/// `vocab_size` is V, the model's vocabulary size; it must be at least the number
/// of listed tokens. Logprobs slightly above 0 (rounding on the server) count as 0.
pub fn first_token_entropy_from_top_logprobs(
    logprobs: &[f64],
    vocab_size: usize,
) -> Result<TopKEntropy, SignalError> {
    /// Servers round logprobs; a value up to this far above 0 is taken as 0.
    const POSITIVE_SLACK: f64 = 1e-4;
    /// Known mass may exceed 1 by rounding; beyond this the input is inconsistent.
    const MASS_SLACK: f64 = 1e-3;
    if logprobs.is_empty() {
        return Err(SignalError::Empty { input: "top_logprobs", needed: 1 });
    }
    let k = logprobs.len();
    if vocab_size < k {
        return Err(invalid(
            "vocab_size",
            vocab_size,
            format!("it is smaller than the {k} listed tokens; give the model's real vocabulary size"),
        ));
    }
    let mut known = 0.0;
    let mut listed_bits = 0.0;
    let mut p_min = f64::INFINITY;
    for (index, &lp) in logprobs.iter().enumerate() {
        if lp.is_nan() || lp == f64::INFINITY {
            return Err(SignalError::NonFinite { input: "top_logprobs", index, value: lp });
        }
        if lp > POSITIVE_SLACK {
            return Err(invalid(
                "top_logprobs",
                lp,
                format!("entry {index} is a positive log-probability; send natural-log probabilities (<= 0)"),
            ));
        }
        if lp == f64::NEG_INFINITY {
            continue; // probability 0 contributes nothing
        }
        let lp = lp.min(0.0);
        let p = lp.exp();
        known += p;
        listed_bits -= p * lp / std::f64::consts::LN_2;
        p_min = p_min.min(p);
    }
    if known > 1.0 + MASS_SLACK {
        return Err(invalid(
            "top_logprobs",
            format!("mass {known:.6}"),
            "the listed probabilities sum to more than 1; the list has duplicates or is not from one step",
        ));
    }
    if !p_min.is_finite() {
        return Err(invalid("top_logprobs", "all -inf", "no listed token has a non-zero probability"));
    }
    let unlisted = vocab_size - k;
    let residual = if unlisted == 0 { 0.0 } else { (1.0 - known).max(0.0) };
    let (lower, upper) = if residual > 0.0 {
        let lower = listed_bits + residual * (1.0 / p_min).log2();
        let upper = listed_bits + residual * (unlisted as f64 / residual).log2();
        // Inconsistent inputs (residual larger than (V-k) * p_k) can invert the pair.
        (lower, upper.max(lower))
    } else {
        (listed_bits, listed_bits)
    };
    Ok(TopKEntropy {
        entropy_bits: lower,
        lower_bits: lower,
        upper_bits: upper,
        listed_bits,
        known_mass: known,
        residual_mass: residual,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entropy_reference(logits: &[f32]) -> f64 {
        let m =
            logits.iter().copied().filter(|x| x.is_finite()).fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
        let z: f64 = logits.iter().filter(|x| x.is_finite()).map(|&x| (x as f64 - m).exp()).sum();
        logits
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| {
                let p = (x as f64 - m).exp() / z;
                if p > 0.0 {
                    -p * p.log2()
                } else {
                    0.0
                }
            })
            .sum()
    }

    #[test]
    fn uniform_logits_give_log2_vocab() {
        for v in [1usize, 2, 7, 8, 255, 256, 257, 4096, 128_000] {
            let h = first_token_entropy_bits(&vec![0.5f32; v]).unwrap();
            assert!((h - (v as f64).log2()).abs() < 1e-5, "v={v} h={h}");
        }
    }

    #[test]
    fn one_hot_is_near_zero() {
        let mut x = vec![-100.0f32; 1000];
        x[3] = 100.0;
        assert!(first_token_entropy_bits(&x).unwrap() < 1e-6);
    }

    #[test]
    fn errors_not_panics() {
        assert_eq!(first_token_entropy_bits(&[]), Err(SignalError::Empty { input: "logits", needed: 1 }));
        let mut x = vec![0.0f32; 600];
        x[513] = f32::NAN;
        assert!(matches!(first_token_entropy_bits(&x), Err(SignalError::NonFinite { index: 513, .. })));
        x[513] = f32::INFINITY;
        assert!(matches!(first_token_entropy_bits(&x), Err(SignalError::NonFinite { index: 513, .. })));
        assert!(first_token_entropy_bits(&[f32::NEG_INFINITY; 3]).is_err());
    }

    #[test]
    fn masked_tokens_are_skipped() {
        let h = first_token_entropy_bits(&[0.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY]).unwrap();
        assert!((h - 1.0).abs() < 1e-6);
    }

    /// Entropy from the portable kernel only, to compare the dispatched (AVX2) one against.
    fn portable_bits(logits: &[f32]) -> Result<f64, SignalError> {
        let acc = accumulate_portable(logits)?;
        Ok((acc.sum.ln() - acc.weighted / acc.sum) / std::f64::consts::LN_2)
    }

    /// Deterministic logits in [lo, hi) (xorshift), long enough to cross several vector blocks.
    fn spread_logits(n: usize, lo: f32, hi: f32, seed: u32) -> Vec<f32> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                lo + (hi - lo) * (state as f32 / u32::MAX as f32)
            })
            .collect()
    }

    fn assert_close(h: f64, reference: f64, what: &str) {
        assert!((h - reference).abs() <= 2e-6 * reference.max(1.0), "{what}: {h} vs {reference}");
    }

    #[test]
    fn vector_paths_match_the_reference() {
        // narrow range (no floor), wide range (floored), large magnitudes (no N ln2/8 reference),
        // a rising maximum (rebases), and lengths with scalar tails
        let cases: Vec<(&str, Vec<f32>)> = vec![
            ("narrow", spread_logits(20_000, -12.0, 12.0, 1)),
            ("wide", spread_logits(20_000, -300.0, 40.0, 2)),
            ("huge", spread_logits(9_001, 9.0e3, 9.1e3, 3)),
            ("negative huge", spread_logits(9_001, -2.0e5, -1.999e5, 4)),
            ("rising", (0..17_000).map(|i| i as f32 * 1e-3).collect()),
            ("falling", (0..17_000).map(|i| -(i as f32) * 1e-2).collect()),
            ("tail", spread_logits(4096 + 17, -5.0, 5.0, 5)),
        ];
        for (name, logits) in &cases {
            let h = first_token_entropy_bits(logits).unwrap();
            assert_close(h, entropy_reference(logits), name);
            assert_close(h, portable_bits(logits).unwrap(), name);
        }
    }

    #[test]
    fn masked_tokens_in_vector_blocks_are_not_counted() {
        let mut x = spread_logits(10_000, -3.0, 3.0, 6);
        for (i, v) in x.iter_mut().enumerate() {
            if i % 3 != 0 || i < 4200 {
                *v = f32::NEG_INFINITY; // first block entirely masked, then two of three
            }
        }
        let h = first_token_entropy_bits(&x).unwrap();
        assert_close(h, entropy_reference(&x), "masked");
        // two finite tokens among thousands of masked ones: exactly one bit
        let mut y = vec![f32::NEG_INFINITY; 9_000];
        y[100] = 1.5;
        y[8_000] = 1.5;
        assert!((first_token_entropy_bits(&y).unwrap() - 1.0).abs() < 1e-6);
        assert!(first_token_entropy_bits(&vec![f32::NEG_INFINITY; 9_000]).is_err());
    }

    #[test]
    fn every_nan_and_infinity_is_reported_at_its_index() {
        let base = spread_logits(9_000, -5.0, 5.0, 7);
        let bad = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fc0_0123), // NaN with a payload
            f32::from_bits(0xff80_0001), // negative signalling NaN
            f32::INFINITY,
        ];
        for &value in &bad {
            for index in [0, 5, 15, 16, 4095, 4096, 5000, 8191, 8999] {
                let mut x = base.clone();
                x[index] = value;
                match first_token_entropy_bits(&x) {
                    Err(SignalError::NonFinite { index: got, .. }) => {
                        assert_eq!(got, index, "{value:?} at {index}")
                    }
                    other => panic!("{value:?} at {index}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn topk_complete_distribution_has_tight_bounds() {
        let lp = [0.5f64.ln(), 0.25f64.ln(), 0.25f64.ln()];
        let r = first_token_entropy_from_top_logprobs(&lp, 3).unwrap();
        assert!((r.entropy_bits - 1.5).abs() < 1e-12);
        assert_eq!(r.lower_bits, r.upper_bits);
    }

    #[test]
    fn topk_rejects_bad_input() {
        assert!(first_token_entropy_from_top_logprobs(&[], 10).is_err());
        assert!(first_token_entropy_from_top_logprobs(&[-0.1, -0.2], 1).is_err());
        assert!(first_token_entropy_from_top_logprobs(&[f64::NAN], 10).is_err());
        assert!(first_token_entropy_from_top_logprobs(&[0.5], 10).is_err());
        assert!(first_token_entropy_from_top_logprobs(&[-0.01, -0.01], 10).is_err()); // mass ~1.98
        assert!(first_token_entropy_from_top_logprobs(&[1e-6], 10).is_ok()); // rounding slack
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Fewer cases: each vector spans several 4096-logit kernel blocks.
        #[test]
        fn kernels_agree_on_long_vectors(
            logits in prop::collection::vec(-60.0f32..60.0, 1..12_000),
            masked in prop::collection::vec(0usize..12_000, 0..50),
        ) {
            let mut logits = logits;
            let n = logits.len();
            for i in masked {
                logits[i % n] = f32::NEG_INFINITY;
            }
            prop_assume!(logits.iter().any(|x| x.is_finite()));
            let h = first_token_entropy_bits(&logits).unwrap();
            let reference = entropy_reference(&logits);
            prop_assert!((h - reference).abs() <= 2e-6 * reference.max(1.0), "h={} ref={}", h, reference);
            let portable = portable_bits(&logits).unwrap().clamp(0.0, 64.0);
            prop_assert!((h - portable).abs() <= 2e-6 * reference.max(1.0), "h={} portable={}", h, portable);
        }
    }

    proptest! {
        #[test]
        fn entropy_is_within_zero_and_log2_vocab(logits in prop::collection::vec(-50.0f32..50.0, 1..3000)) {
            let h = first_token_entropy_bits(&logits).unwrap();
            prop_assert!(h >= 0.0 && h <= (logits.len() as f64).log2() + 1e-9);
            let reference = entropy_reference(&logits);
            prop_assert!((h - reference).abs() <= 1e-5 * reference.max(1.0), "h={} ref={}", h, reference);
        }

        #[test]
        fn topk_bounds_bracket_the_true_entropy(
            logits in prop::collection::vec(-8.0f64..8.0, 20..400),
            k in 1usize..20,
        ) {
            let lse = logits.iter().fold(f64::NEG_INFINITY, |a, &b| if a == f64::NEG_INFINITY { b } else { a.max(b) + (-(a - b).abs()).exp().ln_1p() });
            let mut lp: Vec<f64> = logits.iter().map(|x| x - lse).collect();
            lp.sort_by(|a, b| b.total_cmp(a));
            let truth: f64 = lp.iter().map(|l| -l.exp() * l / std::f64::consts::LN_2).sum();
            let k = k.min(lp.len());
            let r = first_token_entropy_from_top_logprobs(&lp[..k], lp.len()).unwrap();
            prop_assert!(r.lower_bits <= truth + 1e-9, "lower {} truth {}", r.lower_bits, truth);
            prop_assert!(r.upper_bits + 1e-9 >= truth, "upper {} truth {}", r.upper_bits, truth);
            prop_assert!(r.upper_bits <= (lp.len() as f64).log2() + 1e-9);
        }
    }
}
