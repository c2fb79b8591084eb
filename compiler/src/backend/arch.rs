//! Transitional: the old paths of the target facts, for Target IR lowering
//! until it asks `crate::target` directly. Everything else uses `crate::target`.

pub use crate::target::Arch;

impl Arch {
    /// `ldmatrix`: [`crate::target::Features::ldmatrix`].
    pub fn has_ldmatrix(self) -> bool {
        self.features().ldmatrix
    }

    /// `cp.async`: [`crate::target::Features::cp_async`].
    pub fn has_cp_async(self) -> bool {
        self.features().cp_async
    }

    /// The `ldmatrix`-fed rows of [`crate::target::Features::mma`].
    pub fn mma_shapes(self) -> Vec<MmaShape> {
        use crate::target::{Elem, MmaFeed};
        self.features()
            .mma
            .iter()
            .filter(|i| i.feed == MmaFeed::Ldmatrix)
            .map(|i| MmaShape {
                input: match i.elem {
                    Elem::F16 => "f16",
                    Elem::Bf16 => "bf16",
                    Elem::F32 => "f32",
                    Elem::F8E4M3 => "f8e4m3",
                    Elem::F8E5M2 => "f8e5m2",
                },
            })
            .collect()
    }
}

/// An `ldmatrix`-fed matrix instruction's operand dtype (by name).
pub struct MmaShape {
    pub input: &'static str,
}

/// Declaration order, for the one arch comparison Target IR lowering still
/// makes until it selects its instruction with [`crate::target::select_mma`].
impl PartialOrd for Arch {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some((*self as u8).cmp(&(*other as u8)))
    }
}
