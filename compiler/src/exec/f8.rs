//! The two 8-bit float formats (OCP FP8): e5m2 (the top byte of an f16, with
//! infinities) and e4m3fn (bias 7, no infinities, 0x7f/0xff are NaN, largest
//! finite 448). Conversions from f32 round to nearest even and saturate to the
//! largest finite value (as `cvt.rn.satfinite` on the device).

use half::f16;

pub fn e5m2_to_f32(b: u8) -> f32 {
    f16::from_bits((b as u16) << 8).to_f32()
}

pub fn e5m2_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let h = f16::from_f32(x).to_bits();
    let sign = h & 0x8000;
    let mag = h & 0x7fff;
    // Round the low byte to nearest even.
    let lsb = (mag >> 8) & 1;
    let rounded = mag as u32 + 0x7f + lsb as u32;
    let mut m = (rounded >> 8) as u16;
    if m >= 0x7c {
        m = 0x7b; // saturate: largest finite e5m2 (57344)
    }
    ((sign >> 8) as u8) | m as u8
}

pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f32;
    if e == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(448.0);
    // The largest code whose value is <= a, then round to nearest even.
    let (mut lo, mut hi) = (0u8, 0x7e);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if e4m3_to_f32(mid) <= a {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let below = lo;
    let code = if below == 0x7e {
        below
    } else {
        let (v0, v1) = (e4m3_to_f32(below), e4m3_to_f32(below + 1));
        let (d0, d1) = (a - v0, v1 - a);
        if d0 < d1 || (d0 == d1 && below & 1 == 0) {
            below
        } else {
            below + 1
        }
    };
    sign | code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for b in 0..=255u8 {
            let x = e4m3_to_f32(b);
            if !x.is_nan() {
                assert_eq!(e4m3_to_f32(e4m3_from_f32(x)), x, "e4m3 {b:#x}");
            }
            let y = e5m2_to_f32(b);
            if y.is_finite() {
                assert_eq!(e5m2_to_f32(e5m2_from_f32(y)), y, "e5m2 {b:#x}");
            }
        }
        assert_eq!(e4m3_to_f32(e4m3_from_f32(1000.0)), 448.0);
        assert_eq!(e4m3_to_f32(e4m3_from_f32(0.3)), 0.3125);
        assert_eq!(e5m2_to_f32(e5m2_from_f32(1e6)), 57344.0);
    }
}
