//! Deterministic normal samples: element `i` of `randn(shape, dtype, seed)`
//! depends only on `(seed, i)` (a counter-based generator: splitmix64 of the
//! counter, then Box-Muller), so results do not depend on thread count or on
//! how the tensor is split.

use super::tensor::Data;
use super::{ExecError, Interrupt, Tensor};
use crate::check::DType;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform in (0, 1] from 53 random bits.
fn uniform(bits: u64) -> f64 {
    ((bits >> 11) as f64 + 1.0) / (1u64 << 53) as f64
}

/// Standard normal samples number `2 * pair` and `2 * pair + 1` of stream
/// `seed` (Box-Muller makes them together).
fn normal_pair(key: u64, pair: u64) -> (f64, f64) {
    let u1 = uniform(splitmix64(key ^ pair.wrapping_mul(2)));
    let u2 = uniform(splitmix64(key ^ pair.wrapping_mul(2).wrapping_add(1)));
    let r = (-2.0 * u1.ln()).sqrt();
    let (sin, cos) = (2.0 * std::f64::consts::PI * u2).sin_cos();
    (r * cos, r * sin)
}

fn stream_key(seed: u64) -> u64 {
    splitmix64(seed ^ 0x5eed_0000_0000_0000)
}

/// Standard normal sample number `i` of stream `seed`.
pub fn normal(seed: u64, i: u64) -> f64 {
    let (even, odd) = normal_pair(stream_key(seed), i / 2);
    if i.is_multiple_of(2) {
        even
    } else {
        odd
    }
}

/// Standard normal samples of `shape`, rounded to `dtype` (integer dtypes
/// truncate, as a cast would).
pub fn randn(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    try_randn(shape, dtype, seed, &Interrupt::new()).unwrap_or_else(|e| panic!("{e}"))
}

/// [`randn`]; E0712 when the shape's size overflows, E0713 when the memory
/// cannot be had, E0706 when `interrupt` stops it (polled per block).
pub fn try_randn(
    shape: &[usize],
    dtype: DType,
    seed: u64,
    interrupt: &Interrupt,
) -> Result<Tensor, ExecError> {
    let mut data = Data::alloc(shape, dtype, interrupt)?;
    let key = stream_key(seed);
    data.par_fill(dtype, interrupt, |start, out| {
        // Each pair's two samples come from one Box-Muller step.
        let mut k = 0;
        while k < out.len() {
            let i = start + k;
            let (even, odd) = normal_pair(key, (i / 2) as u64);
            if i.is_multiple_of(2) {
                out[k] = even;
                if let Some(x) = out.get_mut(k + 1) {
                    *x = odd;
                }
                k += 2;
            } else {
                out[k] = odd;
                k += 1;
            }
        }
    })?;
    Ok(Tensor::from_data(shape, dtype, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_deterministic_and_standard_normal() {
        let a = randn(&[20000], DType::F64, 7).to_f64_vec();
        assert_eq!(a, randn(&[20000], DType::F64, 7).to_f64_vec());
        assert_ne!(a, randn(&[20000], DType::F64, 8).to_f64_vec());
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
        // A prefix does not depend on the total size, and every element is
        // the sample of its index, whatever block filled it.
        assert_eq!(&randn(&[10], DType::F64, 7).to_f64_vec()[..], &a[..10]);
        assert!(a.iter().enumerate().all(|(i, &x)| x == normal(7, i as u64)));
        // Converted as a cast converts.
        let b = randn(&[20000], DType::BF16, 7).to_f64_vec();
        assert!(b
            .iter()
            .zip(&a)
            .all(|(&b, &a)| b == half::bf16::from_f64(a).to_f64()));
    }
}
