//! Resource limits that are certain from tile sizes alone (E06xx): a single
//! tile that cannot fit the register file, dot operands that cannot be staged
//! in shared memory, and tensor-core shape/dtype support. Conservative: only
//! concrete sizes are judged, and only when the limit is exceeded outright.

use super::ctx::Checker;
use super::dims::Dim;
use super::types::{render_dims, DType};
use crate::diag::Diagnostic;
use crate::syntax::span::Span;
use crate::target::{select_mma, Precision};

#[derive(Clone, Debug, Default)]
pub struct Usage {
    /// The largest concrete tile: bytes, where, rendered type.
    pub largest_tile: Option<(u64, Span, String)>,
    /// Concrete dot operands: bytes of A + B, where, inside a loop.
    pub dots: Vec<(u64, u64, Span, bool)>,
}

fn elements(dims: &[Dim]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, d| {
        acc.checked_mul(u64::try_from(d.as_const()?).ok()?)
    })
}

impl Usage {
    pub fn note_tile(&mut self, dims: &[Dim], dtype: DType, span: Span) {
        let Some(n) = elements(dims) else { return };
        let bytes = n.saturating_mul(dtype.bytes());
        if self
            .largest_tile
            .as_ref()
            .is_none_or(|(b, _, _)| bytes > *b)
        {
            self.largest_tile = Some((
                bytes,
                span,
                format!("Tile{}", render_dims(dims)).replace("]", &format!(", {dtype}]")),
            ));
        }
    }

    pub fn note_dot(&mut self, a: &[Dim], b: &[Dim], dtype: DType, span: Span, in_loop: bool) {
        if let (Some(x), Some(y)) = (elements(a), elements(b)) {
            self.dots.push((
                x.saturating_mul(dtype.bytes()),
                y.saturating_mul(dtype.bytes()),
                span,
                in_loop,
            ));
        }
    }
}

impl Checker<'_> {
    /// Tensor-core shape rules of a dot (E0605), where the dot's operands reach a
    /// matrix instruction of the target (`select_mma`, the table code generation
    /// picks from). A dot no instruction takes (bf16 before sm_80, an ieee f32 or
    /// f8 dot on NVIDIA) is no error: the brief says every kernel compiles for
    /// every target, and such a dot runs on FMA units, where any M, N, K is fine.
    /// i8 dots keep the rule on every target (no integer row yet; the code
    /// generator has no i8 dot).
    pub fn check_mma(&mut self, dtype: DType, tf32: bool, mnk: [&Dim; 3], span: Span) {
        let precision = if tf32 {
            Precision::Tf32
        } else {
            Precision::Ieee
        };
        let features = self.arch.features();
        let tensor_cores = dtype
            .mma_elem()
            .is_some_and(|e| select_mma(&features, e, e, None, precision).is_some());
        if dtype != DType::I8 && !tensor_cores {
            return;
        }
        let labels = ["M", "N", "K"];
        let bad: Vec<String> = mnk
            .iter()
            .zip(labels)
            .filter_map(|(d, l)| {
                d.as_const()
                    .filter(|n| n % 16 != 0)
                    .map(|n| format!("{l} = {n}"))
            })
            .collect();
        if !bad.is_empty() {
            self.report(
                Diagnostic::new(
                    "E0605",
                    span,
                    format!("`dot` of shape {} x {} x {} (M x N x K) is not supported by tensor cores: {} not a multiple of 16", mnk[0], mnk[1], mnk[2], bad.join(", ") + if bad.len() == 1 { " is" } else { " are" }),
                )
                .with_help("use tile sizes that are multiples of 16"),
            );
        }
    }

    /// E0602 / E0603 for the kernel just checked.
    pub fn finish_resources(&mut self) {
        let info = self.arch.info();
        let warps = self.kernel.num_warps.unwrap_or(4).max(1);
        let threads = warps.saturating_mul(info.warp_size as u64);
        if threads > info.max_threads_per_block as u64 {
            return; // E0604 already says the block cannot launch
        }
        if let Some((bytes, span, ty)) = self.usage.largest_tile.clone() {
            let regs = bytes.div_ceil(threads).div_ceil(4);
            if regs > info.max_regs_per_thread as u64 {
                self.report(
                    Diagnostic::new(
                        "E0602",
                        span,
                        format!(
                            "the tile `{ty}` alone needs {regs} registers per thread ({bytes} bytes over {threads} threads), but a thread has at most {} on {}",
                            info.max_regs_per_thread, info.name
                        ),
                    )
                    .with_help("use smaller tiles (e.g. a smaller BM/BN/BLOCK) or more warps (`num_warps=`)"),
                );
            }
        }
        // `num_stages` buffers exist only where the target copies asynchronously
        // (sm_80+); elsewhere a dot in a loop stages its operands once.
        let stages = match self.arch.features().cp_async {
            true => self.kernel.num_stages.unwrap_or(1).max(1),
            false => 1,
        };
        let worst = self
            .usage
            .dots
            .iter()
            .map(|(a, b, span, in_loop)| {
                let s = if *in_loop { stages } else { 1 };
                (a.saturating_add(*b).saturating_mul(s), *a, *b, s, *span)
            })
            .max_by_key(|x| x.0);
        if let Some((smem, a, b, s, span)) = worst {
            if smem > info.max_smem_per_block as u64 {
                self.report(
                    Diagnostic::new(
                        "E0603",
                        span,
                        format!(
                            "the operands of this `dot` need {smem} bytes of shared memory ({a} + {b} bytes x {s} stage{}), more than the {} bytes a block can use on {}",
                            if s == 1 { "" } else { "s" },
                            info.max_smem_per_block,
                            info.name
                        ),
                    )
                    .with_help("use smaller tiles (BM, BN, BK) or fewer pipeline stages (`num_stages=`)"),
                );
            }
        }
    }
}
