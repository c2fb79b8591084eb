//! Adding a launch to the plan, with its grid arranged: columns on grid axis x,
//! and a 1-D grid with a `grid_y` parameter where axis 1 could pass 65535.

use super::{Arg, KernelRef, Launch, Lower, ScalarExpr, Step};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::tile::{self, BinaryOp, Op, OpKind, ParamKind, Type, Value};

impl<'g> Lower<'g> {
    pub(super) fn launch(&mut self, mut l: Launch) {
        self.columns_on_x(&mut l);
        self.flatten_grid(&mut l);
        self.steps.push(Step::Launch(l));
    }

    /// A generated kernel whose grid axis 1 may pass CUDA's 65535 (a run-time
    /// count, or a constant above it: column tiles of a tensor wider than 8.4M)
    /// is launched on a 1-D grid `(X * Y, 1)`: each program splits its id back
    /// into `(pid / Y, pid % Y)`, so any grid of up to 2^31 - 1 programs runs.
    fn flatten_grid(&mut self, l: &mut Launch) {
        let KernelRef::Generated(k) = l.kernel else {
            return;
        };
        let Some(grid) = l.grid.as_mut() else { return };
        let small = |e: &ScalarExpr| matches!(e, ScalarExpr::Index(d) if d.as_const().is_some_and(|c| c <= 65535));
        if grid.len() != 2 || small(&grid[1]) || k + 1 != self.kernels.len() {
            return;
        }
        let kernel = &mut self.kernels[k];
        // The split needs the grid's extents inside the kernel only for
        // `program_id`; a kernel reading `num_programs` keeps its grid.
        let mut stack = vec![&kernel.body];
        while let Some(r) = stack.pop() {
            for op in &r.ops {
                if matches!(op.kind, OpKind::NumPrograms(_)) {
                    return;
                }
                stack.extend(op.kind.regions());
            }
        }
        let i32t = Type::Scalar(DType::I32);
        let fresh = |types: &mut Vec<Type>| {
            types.push(i32t.clone());
            Value(types.len() as u32 - 1)
        };
        let pid = fresh(&mut kernel.types);
        let ny = fresh(&mut kernel.types);
        let idx = kernel.params.len();
        kernel.params.push(tile::Param {
            name: "grid_y".into(),
            kind: ParamKind::Scalar(DType::I32),
        });
        l.args.push(("grid_y".into(), Arg::Scalar(grid[1].clone())));
        let mut stack = vec![&mut kernel.body];
        while let Some(r) = stack.pop() {
            for op in &mut r.ops {
                match op.kind {
                    OpKind::ProgramId(0) => {
                        op.kind = OpKind::Binary {
                            op: BinaryOp::FloorDiv,
                            a: pid,
                            b: ny,
                        }
                    }
                    OpKind::ProgramId(1) => {
                        op.kind = OpKind::Binary {
                            op: BinaryOp::Mod,
                            a: pid,
                            b: ny,
                        }
                    }
                    _ => {}
                }
                stack.extend(op.kind.regions_mut());
            }
        }
        let span = kernel.body.ops.first().map(|o| o.span).unwrap_or_default();
        kernel.body.ops.splice(
            0..0,
            [
                Op {
                    results: vec![pid],
                    kind: OpKind::ProgramId(0),
                    span,
                },
                Op {
                    results: vec![ny],
                    kind: OpKind::ScalarParam(idx),
                    span,
                },
            ],
        );
        let y = std::mem::replace(&mut grid[1], ScalarExpr::Index(Dim::constant(1)));
        grid[0] = ScalarExpr::Binary(BinaryOp::Mul, Box::new(grid[0].clone()), Box::new(y));
    }

    /// A grid may have 2^31 - 1 programs on axis 0 but only 65535 on axis 1
    /// (CUDA's limits, checked at every launch): a generated kernel over a
    /// single row of tiles, grid `(1, cdiv(N, BLOCK))`, is launched as
    /// `(cdiv(N, BLOCK), 1)` with its program ids swapped, so a 1-D tensor of
    /// more than 65535 blocks (8.4M elements) still runs.
    fn columns_on_x(&mut self, l: &mut Launch) {
        let KernelRef::Generated(k) = l.kernel else {
            return;
        };
        let Some(grid) = l.grid.as_mut() else { return };
        let one_row = matches!(&grid[..], [ScalarExpr::Index(d), _] if d.as_const() == Some(1));
        // Only a kernel made for this launch alone (the one just generated).
        if !one_row || k + 1 != self.kernels.len() {
            return;
        }
        grid.swap(0, 1);
        let mut stack = vec![&mut self.kernels[k].body];
        while let Some(r) = stack.pop() {
            for op in &mut r.ops {
                if let OpKind::ProgramId(a) | OpKind::NumPrograms(a) = &mut op.kind {
                    if *a < 2 {
                        *a = 1 - *a;
                    }
                }
                stack.extend(op.kind.regions_mut());
            }
        }
    }
}
