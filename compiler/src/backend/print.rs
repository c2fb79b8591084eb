//! What the PTX and HIP printers do the same way, whatever language they
//! write: a module from its kernels printed one by one, and what they read
//! alike from Target IR (identifiers for parameter names, grid axes, the
//! signedness of a widening multiply, the register type of a stored
//! immediate and the cases of a conversion).

use crate::ir::target::{Kernel, MemTy, Operand, RegTy};

/// A module of `kernels`: each printed by `kernel_text` (the first error
/// returned), the texts put together by `module_of`.
pub(crate) fn module<E>(
    kernels: &[Kernel],
    kernel_text: impl Fn(&Kernel) -> Result<String, E>,
    module_of: impl FnOnce(&[String]) -> Result<String, E>,
) -> Result<String, E> {
    let texts = kernels
        .iter()
        .map(kernel_text)
        .collect::<Result<Vec<String>, E>>()?;
    module_of(&texts)
}

/// An identifier for a parameter name: letters, digits and `_` kept, any
/// other character `c` written `_xHH_` (run-time dims may be named by
/// expressions such as `M+1`).
pub(crate) fn ident(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else {
            out.push_str(&format!("_x{:02x}_", c as u32));
        }
    }
    out
}

/// The letter of grid axis `a` (`x`, `y`, `z`; an axis past 2 is `z`).
pub(crate) fn axis(a: u8) -> &'static str {
    ["x", "y", "z"][(a as usize).min(2)]
}

/// Whether `MulWide` with first operand `a` multiplies signed: an `I32`
/// register or an immediate.
pub(crate) fn mul_wide_signed(k: &Kernel, a: Operand) -> bool {
    match a {
        Operand::Reg(r) => k.reg_ty(r) == RegTy::I32,
        _ => true,
    }
}

/// The register type an operand stored to memory of type `m` is read at
/// (what an immediate is written as): f32, f64, i64, else u32.
pub(crate) fn store_ty(m: MemTy) -> RegTy {
    match m {
        MemTy::F32 => RegTy::F32,
        MemTy::F64 => RegTy::F64,
        MemTy::I64 => RegTy::I64,
        _ => RegTy::U32,
    }
}

/// What a `Cvt` from a `ts` register to a `td` one does, in the order the
/// cases are tried.
pub(crate) enum Conversion {
    /// f32 rounded to tf32 (nearest, ties away) in a `B32`.
    Tf32,
    /// Truncated to `bits` (8 or 16) and extended back to 32, by the sign
    /// when `signed`.
    Narrow { bits: u32, signed: bool },
    /// A register of the same type: a move.
    Same,
    /// A conversion between types.
    Other,
}

pub(crate) fn conversion(td: RegTy, ts: RegTy, narrow: Option<MemTy>) -> Conversion {
    if td == RegTy::B32 && ts == RegTy::F32 {
        return Conversion::Tf32;
    }
    if let Some(m) = narrow {
        let (bits, signed) = match m {
            MemTy::I8 => (8, true),
            MemTy::I16 => (16, true),
            MemTy::U16 => (16, false),
            _ => (8, false),
        };
        return Conversion::Narrow { bits, signed };
    }
    if td == ts {
        Conversion::Same
    } else {
        Conversion::Other
    }
}
