//! Limits of a lowered kernel that depend on the target: no tile may be bigger
//! than what a block of the target can hold at all (E0606).
//!
//! The checker's E0602 and E0603 judge only tiles whose dims it knows, and a
//! `const` parameter is symbolic there (a launch or `-D` may set it): a kernel
//! with `BLOCK: const = 1 << 20` passes `check`, and its tiles get their sizes
//! only here, when it is specialised. Without this bound, code generation
//! unrolls such a tile element by element (minutes and gigabytes of PTX).

use super::{Kernel, Region};
use crate::diag::Diagnostic;
use crate::target::Arch;

/// E0606 for the first op whose result is a tile of more bytes than
/// `arch.info().max_tile_bytes()` (registers plus shared memory of a block).
pub fn check_tile_sizes(k: &Kernel, arch: Arch) -> Result<(), Vec<Diagnostic>> {
    let info = arch.info();
    let max = info.max_tile_bytes();
    // Iterative: regions nest as deep as the source's loops and branches.
    let mut stack: Vec<&Region> = vec![&k.body];
    while let Some(r) = stack.pop() {
        for op in &r.ops {
            for v in &op.results {
                let ty = k.ty(*v);
                let bytes = ty.num_elements().saturating_mul(ty.dtype().bytes());
                if bytes > max {
                    let dims: Vec<String> = ty.shape().iter().map(|d| d.to_string()).collect();
                    return Err(vec![Diagnostic::new(
                        "E0606",
                        op.span,
                        format!(
                            "kernel `{}`: a tile of [{}] {} is {bytes} bytes, more than the {max} bytes a block can hold on {} ({} registers of 4 bytes plus {} bytes of shared memory)",
                            k.name,
                            dims.join(", "),
                            ty.dtype(),
                            info.name,
                            info.regs_per_block,
                            info.max_smem_per_block,
                        ),
                    )
                    .with_help(
                        "use smaller tiles (a smaller BLOCK) and loop over the data, or more programs",
                    )]);
                }
            }
            stack.extend(op.kind.regions());
        }
    }
    Ok(())
}
